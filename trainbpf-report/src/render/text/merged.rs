//! The report of several recordings of one job: which recordings, how well
//! their clocks line up, the first failure across the job and what the
//! other processes did then, every kill and failure on one timeline; then
//! each recording's own report, its kills and deaths labelled with its
//! host.

use std::fmt::Write as _;

use super::style::{MIN_WIDTH, Paint, finish, wrap};
use super::{TextOptions, render};
use crate::model::{Merged, Report};
use crate::render::job_lines::{clocks_line, first_line, recording_line, timeline_line};
use crate::term::escape as esc;
use crate::units::human_secs;

/// Lines of the job's timeline; more are counted.
const TIMELINE_SHOWN: usize = 40;

pub(crate) fn merged(m: &Merged, o: &TextOptions) -> String {
    let p = Paint(o.color);
    let width = o.width.max(MIN_WIDTH);
    let mut out = String::new();
    head(&mut out, m, width, &p);
    timeline(&mut out, m, &p);
    for r in &m.reports {
        section_head(&mut out, r, &p);
        out.push_str(&render(r, o));
    }
    finish(out, o.color)
}

/// One part of each recording's report (`--leaks`, `--stacks`,
/// `--explain`), under its host's heading.
pub(crate) fn each(
    m: &Merged,
    o: &TextOptions,
    part: fn(&Report, &TextOptions) -> String,
) -> String {
    let p = Paint(o.color);
    let mut out = String::new();
    for r in &m.reports {
        section_head(&mut out, r, &p);
        out.push_str(&part(r, o));
    }
    finish(out, o.color)
}

fn section_head(out: &mut String, r: &Report, p: &Paint) {
    let _ = writeln!(
        out,
        "{}\n",
        p.bold(&format!(
            "══ {}: recording {}, {} ══",
            esc(&r.header.hostname),
            r.source.index,
            esc(&r.source.path)
        ))
    );
}

/// The recordings, the clocks, and the first failure.
fn head(out: &mut String, m: &Merged, width: usize, p: &Paint) {
    let _ = writeln!(
        out,
        "{}",
        p.bold(&format!(
            "trainbpf report: {} recordings of one job",
            m.recordings.len()
        ))
    );
    for r in &m.recordings {
        let _ = writeln!(out, "  {}", esc(&recording_line(r)));
    }
    for l in wrap(&clocks_line(m), width) {
        let _ = writeln!(out, "{}", p.dim(&esc(&l)));
    }
    let first = match first_line(m) {
        Some(f) => p.red(&esc(&f)),
        None => "first: no failure in any recording (no OOM kill, crash or fatal signal \
                 in the job)"
            .into(),
    };
    for l in wrap(&first, width) {
        let _ = writeln!(out, "{l}");
    }
    out.push('\n');
}

/// Every kill and every failure on the job's clock.
fn timeline(out: &mut String, m: &Merged, p: &Paint) {
    if m.timeline.is_empty() {
        return;
    }
    let _ = writeln!(out, "{}", p.bold("Across the job (wall clock):"));
    let start = m.started_ns().unwrap_or(0);
    let host_w = m
        .recordings
        .iter()
        .map(|r| esc(&r.host).chars().count())
        .max()
        .unwrap_or(0);
    let mut shown = 0;
    for h in m.shown() {
        shown += 1;
        if shown > TIMELINE_SHOWN {
            continue;
        }
        let line = format!(
            "  +{:>9}  {:<host_w$}  {}",
            human_secs(h.at_ns.saturating_sub(start)),
            esc(m.host(h.recording)),
            esc(&timeline_line(m, h))
        );
        let _ = writeln!(
            out,
            "{}",
            if m.kill(h).is_some() {
                p.red(&line)
            } else {
                line
            }
        );
    }
    if shown > TIMELINE_SHOWN {
        let _ = writeln!(out, "  … and {} more", shown - TIMELINE_SHOWN);
    }
    let rest = m.timeline.len() - m.shown().count();
    if rest > 0 {
        let _ = writeln!(
            out,
            "  ({rest} more below, in each recording's report: clean exits, and OOM victims' own deaths)"
        );
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Cause, Death, merge::merge};

    const SEC: u64 = 1_000_000_000;

    fn node(host: &str, wall_s: u64) -> Report {
        let mut r = crate::render::fixture::sample_report();
        r.header.hostname = host.into();
        r.header.clock.realtime_ns = wall_s * SEC;
        r.header.clock.monotonic_ns = r.first_ns.unwrap();
        r.header.clock.uncertainty_ns = Some(3_000);
        for i in 0..r.kills.len() {
            r.kills[i].realtime_ns = r.realtime_ns(r.kills[i].ts_ns);
        }
        r
    }

    fn merged_pair() -> Merged {
        // node1's kill comes about 20 s into its own run; node2 started
        // 30 s later by the wall clock and a worker died of SIGTERM 10 s
        // into its run: after the kill, though earlier on its own clock.
        let a = node("node1", 1_800_000_000);
        let mut b = node("node2", 1_800_000_030);
        b.kills.clear();
        b.deaths.push(Death {
            pid: 4242,
            start_ns: 9,
            comm: "rank1".into(),
            ts_ns: b.first_ns.unwrap() + 10 * SEC,
            cause: Cause::Signal,
            signal: Some(15),
            code: None,
            sender: None,
            memcg: None,
            memcg_limit_kb: None,
            after: None,
        });
        merge(vec![
            ("/run/node1.rec".into(), a),
            ("/run/node2.rec".into(), b),
        ])
    }

    fn opts() -> TextOptions {
        TextOptions {
            color: false,
            width: 200,
        }
    }

    #[test]
    fn names_the_first_failure_with_its_host_then_the_others() {
        let t = merged(&merged_pair(), &opts());
        let head: Vec<&str> = t.lines().take(6).collect();
        assert_eq!(head[0], "trainbpf report: 2 recordings of one job");
        assert!(
            head[1].contains("recording 0: node1  /run/node1.rec"),
            "{t}"
        );
        assert!(
            head[2].contains("recording 1: node2  /run/node2.rec"),
            "{t}"
        );
        assert!(head[3].contains("each anchor read to within 3 µs"), "{t}");
        let first = t.lines().find(|l| l.starts_with("first:")).unwrap();
        assert!(
            first.starts_with("first: pid 812 (pt_data_worker) on node1 was OOM-killed at "),
            "{first}"
        );
        // Wrapped at the width: read as one line.
        let flat = t.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains("then pid 4242 (rank1) on node2 was killed by SIGTERM (15) (sender not seen) (20.0 s later, its consequence)"),
            "{first}"
        );
    }

    #[test]
    fn each_recording_follows_with_its_host_on_kills_and_deaths() {
        let t = merged(&merged_pair(), &opts());
        let n1 = t.find("══ node1: recording 0, /run/node1.rec ══").unwrap();
        let n2 = t.find("══ node2: recording 1, /run/node2.rec ══").unwrap();
        assert!(n1 < n2);
        assert!(
            t[n1..n2].contains("OOM kill at ") && t[n1..n2].contains(" on node1"),
            "{t}"
        );
        let deaths = &t[n2..];
        assert!(deaths.contains("node2  pid 4242 (rank1)"), "{deaths}");
        let across = &t[t.find("Across the job").unwrap()..n1];
        let kill = across.find("OOM kill: pid 812 (pt_data_worker)").unwrap();
        let death = across.find("pid 4242 (rank1)").unwrap();
        assert!(kill < death, "{across}");
    }

    #[test]
    fn hostile_host_names_are_escaped() {
        let mut m = merged_pair();
        m.recordings[0].host = "evil\u{1b}]0;x\u{7}".into();
        let t = merged(&m, &opts());
        assert!(!t.contains('\u{1b}'), "{t:?}");
    }
}
