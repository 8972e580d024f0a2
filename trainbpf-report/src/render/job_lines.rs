//! Lines about several recordings of one job that the text and HTML
//! reports share: the recordings, their clocks, the first failure. Raw
//! text: each renderer escapes it its own way.

use std::fmt::Write as _;

use crate::model::{Death, Merged, merge::Happening, merge::Recording};
use crate::render::{death_phrase, rfc3339_ms};
use crate::units::{human_kb, human_secs, small_duration};

/// Failures listed after the first; more are counted.
const THEN_SHOWN: usize = 5;

/// "recording 1: node2  /run/node2.rec  from 2026-12-01T18:00:01.000Z (+1.0 s)"
pub(crate) fn recording_line(r: &Recording) -> String {
    let when = match r.started_ns {
        Some(t) if r.clock_offset_ns > 0 => format!(
            "from {} (+{})",
            rfc3339_ms(t),
            human_secs(r.clock_offset_ns)
        ),
        Some(t) => format!("from {}", rfc3339_ms(t)),
        None => "no clock anchor".into(),
    };
    format!("recording {}: {}  {}  {when}", r.index, r.host, r.path)
}

/// How far the recordings' clocks can be trusted to line up.
pub(crate) fn clocks_line(m: &Merged) -> String {
    let clocks = match m.anchor_uncertainty_ns() {
        Some(u) => format!("each anchor read to within {}", small_duration(u)),
        None => "how precisely each anchor was read is unknown (a recording made before \
                 trainbpf kept it)"
            .into(),
    };
    let mut line = format!(
        "clocks: aligned by each recording's wall-clock anchor; {clocks}; how far the hosts' \
         own clocks disagree (their NTP or PTP sync) is not in the recordings"
    );
    if !m.unanchored.is_empty() {
        let ids: Vec<String> = m.unanchored.iter().map(|i| i.to_string()).collect();
        let _ = write!(
            line,
            "; recording {} has no clock anchor: its times are its own, not aligned",
            ids.join(", ")
        );
    }
    line
}

/// "first: pid 33 (python3) on node2 was OOM-killed at …; then …"
pub(crate) fn first_line(m: &Merged) -> Option<String> {
    let f = &m.timeline[m.first?];
    let mut s = format!(
        "first: {} on {} {} at {}",
        who(m, f),
        m.host(f.recording),
        what(m, f),
        rfc3339_ms(f.at_ns)
    );
    if let Some(start) = m.started_ns() {
        let _ = write!(s, " (+{})", human_secs(f.at_ns.saturating_sub(start)));
    }
    if m.then.is_empty() {
        s.push_str("; no other process failed after it");
        return Some(s);
    }
    s.push_str("; then ");
    let shown: Vec<String> = m
        .then
        .iter()
        .take(THEN_SHOWN)
        .map(|&i| {
            let h = &m.timeline[i];
            // The line's own first is the kill it followed: said once.
            let (what, consequence) = match m.death(h) {
                Some(d) if d.after.is_some() => {
                    let bare = Death {
                        after: None,
                        ..d.clone()
                    };
                    (was(death_phrase(&bare)), ", its consequence")
                }
                _ => (what(m, h), ""),
            };
            format!(
                "{} on {} {what} ({} later{consequence})",
                who(m, h),
                m.host(h.recording),
                human_secs(h.at_ns.saturating_sub(f.at_ns))
            )
        })
        .collect();
    s.push_str(&shown.join("; "));
    if m.then.len() > THEN_SHOWN {
        let _ = write!(s, "; and {} more", m.then.len() - THEN_SHOWN);
    }
    Some(s)
}

/// A line of the job's timeline, after its time and host: "OOM kill: pid
/// 33 (python3), memory cgroup /x at its limit of 160 MiB", "pid 34
/// (python3) exited with code 1".
pub(crate) fn timeline_line(m: &Merged, h: &Happening) -> String {
    let Some(k) = m.kill(h) else {
        return format!("{} {}", who(m, h), what(m, h));
    };
    let mut s = format!("OOM kill: {}", who(m, h));
    if !k.victim.in_job {
        s.push_str(", outside the job");
    }
    if let Some(cg) = &k.memcg {
        let _ = write!(s, ", memory cgroup {cg}");
        if let Some(l) = k.memcg_limit_kb {
            let _ = write!(s, " at its limit of {}", human_kb(l));
        }
    }
    s
}

/// A process as the merged report names it: by its rank where its
/// environment gave one ("rank 3 (pid 4242)"), since that is how the other
/// ranks' logs and the launcher name it; else by pid and name.
pub(crate) fn who(m: &Merged, h: &Happening) -> String {
    let (pid, start_ns, comm) = match (m.kill(h), m.death(h)) {
        (Some(k), _) => (k.victim.pid, k.victim.start_ns, k.victim.comm.as_str()),
        (_, Some(d)) => (d.pid, d.start_ns, d.comm.as_str()),
        _ => (h.pid, 0, ""),
    };
    let rank = m
        .reports
        .get(h.recording)
        .and_then(|r| r.identity(pid, start_ns))
        .and_then(|id| id.rank);
    match rank {
        Some(rank) => format!("rank {rank} (pid {pid})"),
        None => format!("pid {pid} ({comm})"),
    }
}

pub(crate) fn what(m: &Merged, h: &Happening) -> String {
    match (m.kill(h), m.death(h)) {
        (Some(k), _) if !k.victim.in_job => "was OOM-killed (outside the job)".into(),
        (Some(_), _) => "was OOM-killed".into(),
        (_, Some(d)) => was(death_phrase(d)),
        _ => String::new(),
    }
}

/// "was killed by …", "exited with code 1".
fn was(phrase: String) -> String {
    if phrase.starts_with("killed") {
        format!("was {phrase}")
    } else {
        phrase
    }
}
