//! The leaks part of the text report: suspected leaks, when they reach the
//! limit, and (for `report --leaks`) every trend with why it is or is not
//! one.

use std::fmt::Write as _;

use crate::model::leaks::{Domain, Projection, Trend, Verdict};
use crate::model::{Report, ns_to_s};
use crate::units::{eta, human_kb, human_rate, human_span, secs_whole, signed_rate};

use super::style::{MIN_WIDTH, Paint, TextOptions, finish, wrap};
use crate::term::escape as esc;

/// At most `n` characters, the last an ellipsis when cut.
fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n.saturating_sub(1)) {
        Some((i, _)) if s.chars().count() > n => format!("{}…", &s[..i]),
        _ => s.to_string(),
    }
}

/// `leak suspected: python3 (pid 700) has climbed +2 MiB/s for 40 s (fit
/// 0.99); at this rate the job's cgroup limit of 100 MiB is reached in ~30 s`.
pub fn warning_text(w: &crate::model::LeakWarning, now_ns: u64) -> String {
    let who = match (w.pid, &w.group) {
        (Some(pid), _) => format!("{} (pid {pid})", esc(&w.comm)),
        (None, Some(g)) => format!("{} ({} processes)", esc(g), w.members),
        (None, None) => esc(&w.comm).into_owned(),
    };
    let limit_of = |w: &crate::model::LeakWarning| match w.limit_of.as_deref() {
        Some("cgroup") => "the job's cgroup limit",
        _ => "RAM plus swap",
    };
    if w.running_out {
        // `memory will run out in ~40 s: python3 (pid 700), +4 MiB/s for
        // 25 s, the job's cgroup limit of 200 MiB`.
        let mut s = format!(
            "memory will run out in {}: {who}, +{} for {}",
            eta(w.projected_oom_s.unwrap_or(0) as f64),
            human_rate(w.slope_bytes_per_s as f64 / 1024.0),
            human_span(now_ns.saturating_sub(w.since_ns))
        );
        if let Some(limit) = w.limit_kb {
            s.push_str(&format!(", {} of {}", limit_of(w), human_kb(limit)));
        }
        return s;
    }
    let mut s = format!(
        "leak suspected: {who} has climbed +{} for {} (fit {:.2})",
        human_rate(w.slope_bytes_per_s as f64 / 1024.0),
        human_span(now_ns.saturating_sub(w.since_ns)),
        w.fit_permille as f64 / 1000.0
    );
    if let (Some(secs), Some(limit)) = (w.projected_oom_s, w.limit_kb) {
        s.push_str(&format!(
            "; at this rate {} of {} is reached in {}",
            limit_of(w),
            human_kb(limit),
            eta(secs as f64)
        ));
    }
    s
}

/// `python3 (pid 700)`, `rank 1 (pid 700)`, `DataLoader workers (12
/// processes, pt_data_worker)`.
fn name(r: &Report, t: &Trend) -> String {
    match t.pid {
        Some(pid) => esc(&r.who(pid, t.start_ns, &t.comm)).into_owned(),
        None => format!(
            "{} ({} processes, {})",
            esc(t.group.as_deref().unwrap_or("?")),
            t.members,
            esc(&t.comm)
        ),
    }
}

fn why_not(v: Verdict, r: &Report) -> String {
    match v {
        Verdict::Leak => "leak suspected".into(),
        Verdict::TooShort => format!("not climbing for {} yet", secs_whole(r.leaks.min_span_ns)),
        Verdict::NotClimbing => "flat or shrinking".into(),
        Verdict::Small => "grew too little to tell from noise".into(),
        Verdict::Levelled => "levelled off (a warm-up, a cache that filled)".into(),
        Verdict::Irregular => "no steady trend".into(),
        Verdict::Refilled => "climbed back to a level it held before".into(),
        Verdict::Respawned => "climbed until it exited; judged with its group".into(),
        Verdict::Steady => format!(
            "a steady climb, shorter than {}",
            secs_whole(r.leaks.min_span_ns)
        ),
    }
}

/// "the job cgroup's limit (400 MiB, 250 MiB used)".
fn limit_phrase(p: &Projection) -> String {
    let what = match p.domain {
        Domain::Cgroup => "the job cgroup's limit",
        Domain::Machine => "the machine's memory plus swap",
    };
    format!(
        "{what} ({}, {} used lately)",
        human_kb(p.limit_kb),
        human_kb(p.usage_kb)
    )
}

/// One leak, as a sentence.
fn leak_line(r: &Report, t: &Trend) -> String {
    let mut s = format!(
        "{}: honest memory {} since +{:.1} s (fit {:.2}), {} over {}",
        name(r, t),
        signed_rate(t.slope_kb_per_s),
        r.since_start_s(t.since_ns),
        t.fit,
        if t.growth_kb < 0 {
            format!("-{}", human_kb(t.growth_kb.unsigned_abs()))
        } else {
            format!("+{}", human_kb(t.growth_kb as u64))
        },
        secs_whole(t.until_ns.saturating_sub(t.since_ns)),
    );
    if !t.alive {
        let _ = write!(s, "; ended at +{:.1} s", r.since_start_s(t.until_ns));
    }
    s.push('.');
    s
}

/// The projection, as a sentence.
fn projection_line(p: &Projection) -> String {
    match p.seconds {
        Some(s) => format!(
            "At {} the leaks still running reach {} in {} after the end of the recording.",
            signed_rate(p.slope_kb_per_s),
            limit_phrase(p),
            eta(s)
        ),
        None => format!(
            "Nothing still running is leaking: no projected OOM against {}.",
            limit_phrase(p)
        ),
    }
}

/// The section in the full report: only when a leak is suspected, or
/// `record` warned of one.
pub(crate) fn section(out: &mut String, r: &Report, width: usize, p: &Paint) {
    if r.leaks.suspected() {
        leaks_part(out, r, width, p);
    }
    warnings_part(out, r, width, p);
}

/// The warnings `record` gave while the job ran, and how long before the
/// next kill each came.
fn warnings_part(out: &mut String, r: &Report, width: usize, p: &Paint) {
    if r.leak_warnings.is_empty() {
        return;
    }
    let _ = writeln!(out, "{}", p.bold("Warnings given while recording:"));
    for (ts, w) in &r.leak_warnings {
        let mut line = format!("+{:.1} s  {}", r.since_start_s(*ts), warning_text(w, *ts));
        if let Some(k) = r.kills.iter().find(|k| k.ts_ns >= *ts) {
            line.push_str(&format!(
                "; the kill of pid {} came {} later",
                k.victim.pid,
                human_span(k.ts_ns - ts)
            ));
        }
        for (i, l) in wrap(&line, width.saturating_sub(4)).iter().enumerate() {
            let _ = writeln!(out, "{}{l}", if i == 0 { "  " } else { "    " });
        }
    }
    out.push('\n');
}

fn leaks_part(out: &mut String, r: &Report, width: usize, p: &Paint) {
    let _ = writeln!(
        out,
        "{}",
        p.red(&format!(
            "Leak suspected: a steady climb for {} or more",
            secs_whole(r.leaks.min_span_ns)
        ))
    );
    for t in r.leaks.leaks() {
        for (i, l) in wrap(&leak_line(r, t), width.saturating_sub(4))
            .iter()
            .enumerate()
        {
            let _ = writeln!(out, "{}{l}", if i == 0 { "  " } else { "    " });
        }
    }
    if let Some(pr) = &r.leaks.projection {
        for l in wrap(&projection_line(pr), width.saturating_sub(2)) {
            let _ = writeln!(out, "  {l}");
        }
    }
    out.push('\n');
}

/// `report --leaks`: the section alone, with every trend kept.
pub(crate) fn report(r: &Report, o: &TextOptions) -> String {
    let p = Paint(o.color);
    let width = o.width.max(MIN_WIDTH);
    let mut out = String::new();
    let l = &r.leaks;
    if l.suspected() {
        leaks_part(&mut out, r, width, &p);
    } else {
        let _ = writeln!(
            out,
            "{}",
            p.bold(&format!(
                "No leak suspected: nothing climbed steadily for {} or more.",
                secs_whole(l.min_span_ns)
            ))
        );
        if let Some(pr) = &l.projection {
            let _ = writeln!(out, "  {}", projection_line(pr));
        }
        out.push('\n');
    }
    if l.trends.is_empty() {
        let _ = writeln!(out, "No job process had a memory series to fit.");
        return finish(out, o.color);
    }
    let _ = writeln!(
        out,
        "{}",
        p.bold(
            "Trends of honest memory (repeated-median slope; fit: share of variance explained):"
        )
    );
    let _ = writeln!(
        out,
        "  {:>7}  {:<28}  {:>12}  {:>4}  {:>9}  {:>9}  {:>10}  VERDICT",
        "PID", "PROCESS OR GROUP", "SLOPE", "FIT", "SINCE", "SPAN", "SIZE"
    );
    for t in &l.trends {
        let who = match t.pid {
            Some(pid) => esc(&r.name(pid, t.start_ns, &t.comm)).into_owned(),
            None => format!("{} ×{}", esc(t.group.as_deref().unwrap_or("?")), t.members),
        };
        let _ = writeln!(
            out,
            "  {:>7}  {:<28}  {:>12}  {:>4.2}  {:>9}  {:>9}  {:>10}  {}",
            t.pid.map_or("-".into(), |p| p.to_string()),
            clip(&who, 28),
            signed_rate(t.slope_kb_per_s),
            t.fit,
            format!("+{:.1} s", r.since_start_s(t.since_ns)),
            secs_whole(t.until_ns.saturating_sub(t.since_ns)),
            human_kb(t.size_kb),
            why_not(t.verdict, r)
        );
    }
    if l.untracked > 0 {
        let _ = writeln!(
            out,
            "  {} job processes had no series: more were alive at once than kept",
            l.untracked
        );
    }
    let _ = writeln!(
        out,
        "{}",
        p.dim(&format!(
            "recording: {:.1} s; a leak needs a climb of {} or more (report --leak-span)",
            ns_to_s(r.duration_ns()),
            secs_whole(l.min_span_ns)
        ))
    );
    finish(out, o.color)
}

/// The verdict's leak lines.
pub(crate) fn verdict(out: &mut String, r: &Report) {
    let leaks: Vec<String> = r
        .leaks
        .leaks()
        .take(3)
        .map(|t| {
            let who = match t.pid {
                Some(pid) => esc(&r.who(pid, t.start_ns, &t.comm)).into_owned(),
                None => format!("{} ×{}", esc(t.group.as_deref().unwrap_or("?")), t.members),
            };
            format!("{who} {}", signed_rate(t.slope_kb_per_s))
        })
        .collect();
    if leaks.is_empty() {
        return;
    }
    let mut line = format!("trainbpf: leak suspected: {}", leaks.join(", "));
    if let Some(pr) = &r.leaks.projection
        && let Some(s) = pr.seconds
    {
        let _ = write!(line, "; {} reached in {}", limit_phrase(pr), eta(s));
    }
    let _ = writeln!(out, "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LeakReport;
    use crate::render::fixture::sample_report;
    use crate::render::text::{render, verdict};

    fn trend(pid: Option<u32>, verdict: Verdict) -> Trend {
        Trend {
            pid,
            start_ns: 1,
            comm: "python3".into(),
            group: pid.is_none().then(|| "DataLoader workers".into()),
            members: if pid.is_some() { 1 } else { 4 },
            alive: true,
            slope_kb_per_s: 8192.0,
            fit: 0.987,
            since_ns: 3_500_000_000,
            until_ns: 22_000_000_000,
            growth_kb: 151_552,
            size_kb: 300_000,
            verdict,
        }
    }

    fn leaking() -> Report {
        let mut r = sample_report();
        r.leaks = LeakReport {
            trends: vec![
                trend(Some(700), Verdict::Leak),
                trend(None, Verdict::Levelled),
            ],
            projection: Some(Projection {
                domain: Domain::Cgroup,
                limit_kb: 307_200,
                usage_kb: 204_800,
                slope_kb_per_s: 8192.0,
                seconds: Some(12.5),
            }),
            min_span_ns: 10_000_000_000,
            untracked: 0,
        };
        r
    }

    #[test]
    fn a_suspected_leak_is_in_the_report_and_the_verdict() {
        let o = TextOptions {
            color: false,
            width: 1000,
        };
        let t = render(&leaking(), &o);
        assert!(
            t.contains("Leak suspected: a steady climb for 10 s or more"),
            "{t}"
        );
        assert!(
            t.contains(
                "python3 (pid 700): honest memory +8 MiB/s since +3.0 s (fit 0.99), +148 MiB over 18.5 s."
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "At +8 MiB/s the leaks still running reach the job cgroup's limit (300 MiB, 200 MiB used lately) in ~12 s after the end of the recording."
            ),
            "{t}"
        );
        let v = verdict(&leaking());
        assert!(
            v.contains("trainbpf: leak suspected: python3 (pid 700) +8 MiB/s; the job cgroup's limit (300 MiB, 200 MiB used lately) reached in ~12 s"),
            "{v}"
        );
        // No leak: neither says a word about it.
        let r = sample_report();
        assert!(!render(&r, &o).contains("Leak"));
        assert!(!verdict(&r).contains("leak"));
    }

    #[test]
    fn leaks_view_lists_every_trend_with_why() {
        let o = TextOptions {
            color: false,
            width: 100,
        };
        let t = report(&leaking(), &o);
        assert!(t.contains("PROCESS OR GROUP"), "{t}");
        assert!(t.contains("DataLoader workers ×4"), "{t}");
        assert!(
            t.contains("levelled off (a warm-up, a cache that filled)"),
            "{t}"
        );
        let mut r = leaking();
        r.leaks.trends.remove(0);
        r.leaks.projection.as_mut().unwrap().seconds = None;
        let t = report(&r, &o);
        assert!(
            t.contains("No leak suspected: nothing climbed steadily for 10 s or more."),
            "{t}"
        );
        assert!(t.contains("Nothing still running is leaking"), "{t}");
    }
}
