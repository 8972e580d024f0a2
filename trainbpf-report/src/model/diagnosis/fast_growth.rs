//! `fast_growth`: one process grew most of the limit in seconds: one
//! step's allocation (a batch, a sequence, an evaluation kept for a
//! backward pass that never comes) did not fit, not a slow climb.
//!
//! The time is read from the kill's window (`series::KillWindow`, the
//! process's resident memory at 240 columns before the kill): it must have
//! risen by [`SHARE`] of the limit in the last [`FAST_NS`], and the rise is
//! said from where it took off. A process born in the window rose from
//! nothing; without a window line the grower's own span counts, when it
//! was born in the window. Resident
//! memory blames a forked child for its parent's pages, so where the
//! recording has honest figures the process must have allocated that much
//! in its own context too.

use super::growth::{grower_place, kill_limit, who};
use super::{Confidence, Diagnosis};
use crate::model::KillWindow;
use crate::model::{Grower, Kill, Report, SEC};
use crate::units::{human_kb, human_rate, human_secs};

/// The process must have added this share of the limit…
const SHARE: f64 = 0.5;
/// …within this long before the kill (and its whole rise, from where it
/// stood then, is the span said): the span from which a steady climb is
/// `steady_leak`'s, so that no steady climb to the limit falls between
/// the two rules…
const FAST_NS: u64 = crate::model::leaks::STEADY_SPAN_NS;
/// …and within this long for a sure diagnosis.
const SURE_NS: u64 = 2 * SEC;
/// Growers looked at per kill, most growth first.
const GROWERS: usize = 3;

pub(super) fn check(report: &Report, out: &mut Vec<Diagnosis>) {
    for (i, k) in report.kills.iter().enumerate() {
        if let Some(d) = of_kill(report, k, i) {
            out.push(d);
        }
    }
}

/// One grower's rise before the kill: (span, from kB, to kB), when it
/// added `need_kb` within [`FAST_NS`] of the kill. The rise starts where
/// it last stood near its level of `FAST_NS` before (a twentieth of the
/// rise above it), so that the span and the figures are the whole jump.
fn rise(w: Option<&KillWindow>, g: &Grower, need_kb: u64) -> Option<(u64, u64, u64)> {
    let Some((w, l)) = w.and_then(|w| {
        w.lines
            .iter()
            .find(|l| l.pid == g.pid && l.start_ns == g.start_ns)
            .map(|l| (w, l))
    }) else {
        // No line: a process born in the window rose over its life.
        return (g.born_in_window && g.grew_kb >= need_kb && g.window_ns <= FAST_NS).then_some((
            g.window_ns,
            g.rss_kb.saturating_sub(g.grew_kb),
            g.rss_kb,
        ));
    };
    let step = w.step_ns.max(1);
    // Before it was seen it held nothing if it was born in the window, and
    // is unknown otherwise.
    let at = |j: usize| match l.points[j] {
        Some(v) => Some(v),
        None => g.born_in_window.then_some(0),
    };
    let last = l.points.iter().rposition(Option::is_some)?;
    let end = l.points[last]?.max(g.rss_kb);
    let first = (w.kill_ns.saturating_sub(FAST_NS).saturating_sub(w.start_ns) / step) as usize;
    let base = (first.min(last)..=last).find_map(at)?;
    if end.saturating_sub(base) < need_kb {
        return None;
    }
    let near = base + (end - base) / 20;
    let j = (0..=last).rev().find(|&j| at(j).is_some_and(|v| v <= near));
    let (from_ns, from_kb) = match j {
        Some(j) => (w.start_ns + (j as u64 + 1) * step, at(j).unwrap_or(0)),
        None => (w.kill_ns.saturating_sub(g.window_ns), 0),
    };
    Some((w.kill_ns.saturating_sub(from_ns), from_kb, end))
}

fn of_kill(r: &Report, k: &Kill, i: usize) -> Option<Diagnosis> {
    let (limit, what) = kill_limit(r, k)?;
    let need = (limit as f64 * SHARE) as u64;
    let w = r.series.window(k);
    let (g, (span, from, to)) = k
        .growers
        .iter()
        .filter(|g| g.in_job && g.grew_kb >= need)
        // Honest growth where recorded: a fork's inherited pages are no
        // allocation of its own.
        .filter(|g| g.honest_kb.is_none_or(|h| h >= need as i64))
        .take(GROWERS)
        .find_map(|g| Some((g, rise(w, g, need).filter(|x| x.0 <= FAST_NS)?)))?;
    let name = who(r, &g.comm, g.pid, g.start_ns);
    let grew = to.saturating_sub(from);
    let secs = (span as f64 / SEC as f64).max(0.05);
    let place = grower_place(r, k, g.pid, g.start_ns);
    // The figure the kill's table and ranking use (ADDED) where recorded;
    // the rise itself is in resident memory, and says so.
    let mut title = match g.honest_kb {
        Some(h) => {
            let h = h.max(0) as u64;
            format!(
                "{name} added {}, {:.0}% of the {} {what}, its RSS rising {} in the last {}: one step's allocation did not fit",
                human_kb(h),
                h as f64 / limit.max(1) as f64 * 100.0,
                human_kb(limit),
                human_kb(grew),
                human_secs(span)
            )
        }
        None => format!(
            "{name}'s RSS grew {} in {}, {:.0}% of the {} {what}: one step's allocation did not fit",
            human_kb(grew),
            human_secs(span),
            grew as f64 / limit.max(1) as f64 * 100.0,
            human_kb(limit)
        ),
    };
    if let Some((_, at)) = &place {
        title.push_str(&format!(", in {at}"));
    }
    let mut evidence = vec![format!(
        "{name} went from {} to {} resident in the {} before the kill (+{})",
        human_kb(from),
        human_kb(to),
        human_secs(span),
        human_rate(grew as f64 / secs)
    )];
    if g.born_in_window && from == 0 {
        evidence.push("It was born in the window: all of it is new".into());
    }
    if let Some(h) = g.honest_kb {
        evidence.push(format!(
            "It allocated {} in its own context over the {} before the kill: not pages \
             inherited at fork",
            human_kb(h.max(0) as u64),
            human_secs(g.window_ns)
        ));
    }
    evidence.push(format!("The {what} it ran into: {}", human_kb(limit)));
    if let Some((bytes, at)) = &place {
        evidence.push(format!(
            "Its heaviest growth stack: {} of new highs through {at}",
            human_kb(bytes / 1024)
        ));
    }
    let mut fix = vec![
        "Make one step's allocation smaller: a smaller batch size or sequence length (keep \
         the effective batch with gradient accumulation)"
            .to_string(),
        "Run evaluation and inference under `torch.no_grad()` (or `torch.inference_mode()`): \
         without it every activation is kept for a backward pass that never comes"
            .into(),
    ];
    match &place {
        Some((_, at)) => fix.push(format!("The allocation that did not fit was made at {at}")),
        None if r.stacks.is_empty() => {
            fix.push("Record again without `--no-stacks` to see which allocation it was".into())
        }
        None => {}
    }
    fix.push(format!(
        "Or give it a limit above the step's peak: it held {} when it was killed",
        human_kb(to)
    ));
    Some(Diagnosis {
        id: "fast_growth",
        confidence: if span <= SURE_NS {
            Confidence::High
        } else {
            Confidence::Medium
        },
        title,
        evidence,
        fix,
        kill: Some(i),
        pids: vec![g.pid],
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{job, kill, process};
    use super::*;
    use crate::model::WindowLine;

    const MIB: u64 = 1024;

    fn grower(pid: u32, grew_kb: u64, rss_kb: u64) -> Grower {
        Grower {
            pid,
            start_ns: pid as u64,
            comm: "python".into(),
            grew_kb,
            honest_kb: Some(grew_kb as i64),
            window_ns: 60 * SEC,
            rate_kb_per_s: Some(grew_kb as f64 / 60.0),
            rss_kb,
            in_job: true,
            born_in_window: false,
            is_victim: true,
        }
    }

    /// A kill at 50 s of a 200 MiB job whose python held 10 MiB, then
    /// climbed to 190 MiB over the last `climb_s` seconds.
    fn report(climb_s: f64) -> Report {
        let mut r = job(100, 200);
        r.processes = vec![process(100, None, "python", 190)];
        let mut k = kill(100, "python", 200);
        k.ts_ns = 90 * SEC;
        k.growers = vec![grower(100, 180 * MIB, 190 * MIB)];
        let (start, step) = (k.ts_ns - k.window_ns, k.window_ns / 240);
        let points = (0..240)
            .map(|j| {
                let t = (start + (j + 1) * step) as f64;
                let left = (k.ts_ns as f64 - t) / SEC as f64;
                let done = (1.0 - left / climb_s).clamp(0.0, 1.0);
                Some(10 * MIB + (180.0 * MIB as f64 * done) as u64)
            })
            .collect();
        r.series.windows.push(KillWindow {
            kill_ns: k.ts_ns,
            start_ns: start,
            step_ns: step,
            victim_pid: 100,
            lines: vec![WindowLine {
                pid: 100,
                start_ns: 100,
                comm: "python".into(),
                name: "python".into(),
                in_job: true,
                is_victim: true,
                is_top_grower: true,
                points,
            }],
            mem_available: vec![],
            mem_total_kb: None,
            cgroup_usage: vec![],
            cgroup_limit_kb: Some(200 * MIB),
        });
        r.kills = vec![k];
        r
    }

    fn run(r: &Report) -> Vec<Diagnosis> {
        let mut out = Vec::new();
        check(r, &mut out);
        out
    }

    #[test]
    fn most_of_the_limit_in_seconds_is_one_steps_allocation() {
        let d = run(&report(1.5));
        assert_eq!(d.len(), 1, "{d:#?}");
        let d = &d[0];
        assert_eq!(
            (d.id, d.kill, d.confidence),
            ("fast_growth", Some(0), Confidence::High)
        );
        assert!(
            d.title
                .starts_with("python (pid 100) added 180 MiB, 90% of the 200 MiB")
                && d.title.contains("its RSS rising 1"),
            "{}",
            d.title
        );
        assert!(
            d.title.ends_with("one step's allocation did not fit"),
            "{}",
            d.title
        );
        assert!(d.evidence[0].contains("to 190 MiB resident"), "{d:#?}");
        assert!(d.fix[0].contains("batch size"), "{d:#?}");
        assert!(
            d.fix.iter().any(|f| f.contains("torch.no_grad()")),
            "{d:#?}"
        );
        // Half the limit within five seconds, not two: less sure.
        assert_eq!(run(&report(6.0))[0].confidence, Confidence::Medium);
    }

    #[test]
    fn the_same_growth_over_a_minute_or_inherited_is_not_fast() {
        // 180 MiB over 15 s: a climb, steady_leak's to judge.
        assert!(run(&report(15.0)).is_empty());
        // Fast in resident memory, but pages inherited at fork: allocated
        // nothing of its own.
        let mut r = report(1.5);
        r.kills[0].growers[0].honest_kb = Some(2 * MIB as i64);
        assert!(run(&r).is_empty());
        // Half of the limit at most: the rest of the job filled it.
        let mut r = report(1.5);
        r.kills[0].growers[0].grew_kb = 80 * MIB;
        assert!(run(&r).is_empty());
    }

    #[test]
    fn a_process_born_just_before_the_kill_grew_from_nothing() {
        let mut r = report(1.5);
        r.series.windows.clear();
        let g = &mut r.kills[0].growers[0];
        g.born_in_window = true;
        g.window_ns = 2 * SEC;
        g.grew_kb = 190 * MIB;
        let d = run(&r);
        assert_eq!(d.len(), 1, "{d:#?}");
        assert!(
            d[0].title
                .contains("its RSS rising 190 MiB in the last 2.0 s"),
            "{}",
            d[0].title
        );
    }
}
