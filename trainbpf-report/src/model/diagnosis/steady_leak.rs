//! `steady_leak`: a process climbed steadily until the limit, as the leak
//! model (`model/leaks`) judges a climb: a robust line through its honest
//! memory that explains most of it and keeps climbing to the end.
//!
//! For a kill, the victim's (or the kill's top job grower's) trend must be
//! a suspected leak, or as steady as one but shorter than `--leak-span`
//! (`Verdict::Steady`, judged for a kill's victim alone): a job that leaks
//! 4 MiB a step under a small limit dies long before five minutes. Its
//! climb must be a real share of the limit, or it is no cause of the kill;
//! a short climb is as sure as a leak when its line is nearly exact.
//! A leak still climbing when the recording ended, with no kill of its
//! own, is a diagnosis of the run, with the time to the limit projected.

use super::growth::{grower_place, heaviest, kill_limit, who};
use super::{Confidence, Diagnosis};
use crate::model::leaks::{Trend, Verdict};
use crate::model::{Kill, Report};
use crate::units::{eta, human_kb, human_rate, human_span};

/// The climb must have added at least this share of the limit to explain
/// a kill…
const MIN_SHARE: f64 = 0.10;
/// …and this much for a sure one…
const SURE_SHARE: f64 = 0.30;
/// …whose line, if shorter than `--leak-span`, explains this much of it.
const SURE_FIT: f64 = 0.95;

pub(super) fn check(report: &Report, out: &mut Vec<Diagnosis>) {
    let mut explained = Vec::new();
    for (i, k) in report.kills.iter().enumerate() {
        if let Some(d) = of_kill(report, k, i) {
            explained.extend(d.pids.iter().copied());
            out.push(d);
        }
    }
    // A leak that killed nothing yet: the run's own.
    for t in report.leaks.leaks().filter(|t| t.alive) {
        if t.pid.is_some_and(|p| explained.contains(&p)) {
            continue;
        }
        out.push(of_run(report, t));
    }
}

/// The trend of one process, if it climbed steadily.
fn climbing(r: &Report, pid: u32, start_ns: u64) -> Option<&Trend> {
    r.leaks
        .trends
        .iter()
        .find(|t| t.pid == Some(pid) && t.start_ns == start_ns && t.is_climbing())
}

fn of_kill(r: &Report, k: &Kill, i: usize) -> Option<Diagnosis> {
    let v = &k.victim;
    // The victim first; else the job process that grew most before it.
    let top = k.growers.iter().find(|g| g.in_job && !g.is_victim);
    let t = climbing(r, v.pid, v.start_ns)
        .filter(|_| v.in_job)
        .or_else(|| top.and_then(|g| climbing(r, g.pid, g.start_ns)))?;
    let pid = t.pid?;
    if t.since_ns > k.ts_ns || t.growth_kb <= 0 {
        return None;
    }
    let limit = kill_limit(r, k);
    let share = limit.map(|(l, _)| t.growth_kb as f64 / l.max(1) as f64);
    if share.is_some_and(|s| s < MIN_SHARE) {
        return None;
    }
    // Sure when it is a leak by the full span, or a climb nearly as
    // straight as a ruler (shorter, but the kill ended it); either way
    // only when it was a real share of what filled the limit.
    let steady = t.is_leak() || t.fit >= SURE_FIT;
    let confidence = match (steady, share.is_none_or(|s| s >= SURE_SHARE)) {
        (true, true) => Confidence::High,
        (true, false) | (false, true) => Confidence::Medium,
        (false, false) => Confidence::Low,
    };
    let name = who(r, &t.comm, pid, t.start_ns);
    let climbed_ns = k.ts_ns - t.since_ns;
    // What it added as the kill's table and ranking count it, where it is
    // among the kill's growers; else the climb's own size.
    let added = k
        .growers
        .iter()
        .find(|g| g.pid == pid && g.start_ns == t.start_ns)
        .and_then(|g| g.honest_kb)
        .map_or(t.growth_kb as u64, |h| h.max(0) as u64);
    let mut title = format!(
        "{name} leaked steadily: +{} for {} until the kill, adding {}",
        human_rate(t.slope_kb_per_s),
        human_span(climbed_ns),
        human_kb(added)
    );
    if let Some((l, what)) = limit {
        title.push_str(&format!(" of the {} {what}", human_kb(l)));
    }
    let place = grower_place(r, k, pid, t.start_ns);
    if let Some((_, at)) = &place {
        title.push_str(&format!(", in {at}"));
    }
    let mut evidence = vec![format!(
        "{name} climbed +{} from +{:.1} s until the kill at +{:.1} s (the line explains {:.0}% of it)",
        human_rate(t.slope_kb_per_s),
        r.since_start_s(t.since_ns),
        r.since_start_s(k.ts_ns),
        t.fit * 100.0
    )];
    evidence.push(match t.verdict {
        Verdict::Leak => format!(
            "The leak model suspected a leak: a climb of at least {} that did not level off",
            human_span(r.leaks.min_span_ns)
        ),
        _ => format!(
            "A climb as steady as a leak's, shorter than the {} a suspected leak needs \
             (--leak-span): the limit came first",
            human_span(r.leaks.min_span_ns)
        ),
    });
    if let Some((l, what)) = limit {
        evidence.push(format!(
            "It added {} of the {} {what} ({:.0}%); at +{} that limit holds {} of it",
            human_kb(t.growth_kb as u64),
            human_kb(l),
            share.unwrap_or(0.0) * 100.0,
            human_rate(t.slope_kb_per_s),
            eta(l as f64 / t.slope_kb_per_s.max(1e-9))
        ));
    }
    for (ts, w) in r.leak_warnings.iter().filter(|(ts, _)| *ts <= k.ts_ns) {
        if let Some(s) = w.projected_oom_s {
            evidence.push(format!(
                "record warned at +{:.1} s that the limit was {} away; the kill came {} later",
                r.since_start_s(*ts),
                eta(s as f64),
                human_span(k.ts_ns - ts)
            ));
        }
    }
    if let Some((bytes, at)) = &place {
        evidence.push(format!(
            "Its heaviest growth stack: {} of new highs through {at}",
            human_kb(bytes / 1024)
        ));
    }
    Some(Diagnosis {
        id: "steady_leak",
        confidence,
        title,
        evidence,
        fix: fixes(place.as_ref().map(|p| p.1.as_str()), !r.stacks.is_empty()),
        kill: Some(i),
        pids: vec![pid],
    })
}

fn of_run(r: &Report, t: &Trend) -> Diagnosis {
    let name = match t.pid {
        Some(pid) => who(r, &t.comm, pid, t.start_ns),
        None => format!(
            "{} ({} processes)",
            t.group.as_deref().unwrap_or(&t.comm),
            t.members
        ),
    };
    let end = t.until_ns.max(t.since_ns);
    let mut title = format!(
        "{name} is leaking: +{} for {}",
        human_rate(t.slope_kb_per_s),
        human_span(end - t.since_ns)
    );
    let mut evidence = vec![format!(
        "{name} climbed +{} from +{:.1} s to the end of the recording, {} in all (the line \
         explains {:.0}% of it)",
        human_rate(t.slope_kb_per_s),
        r.since_start_s(t.since_ns),
        human_kb(t.growth_kb.max(0) as u64),
        t.fit * 100.0
    )];
    if let Some(p) = &r.leaks.projection
        && let Some(s) = p.seconds
    {
        title.push_str(&format!(
            "; at this rate the {} of {} is reached in {}",
            match p.domain {
                crate::model::leaks::Domain::Cgroup => "cgroup limit",
                crate::model::leaks::Domain::Machine => "RAM plus swap",
            },
            human_kb(p.limit_kb),
            eta(s)
        ));
        evidence.push(format!(
            "At the end {} of {} was in use, climbing +{} in all",
            human_kb(p.usage_kb),
            human_kb(p.limit_kb),
            human_rate(p.slope_kb_per_s)
        ));
    }
    let place = t
        .pid
        .and_then(|pid| heaviest(&r.process_stacks(pid, t.start_ns)));
    if let Some((bytes, at)) = &place {
        evidence.push(format!(
            "Its heaviest growth stack: {} of new highs through {at}",
            human_kb(bytes / 1024)
        ));
    }
    Diagnosis {
        id: "steady_leak",
        confidence: if t.fit >= 0.9 {
            Confidence::High
        } else {
            Confidence::Medium
        },
        title,
        evidence,
        fix: fixes(place.as_ref().map(|p| p.1.as_str()), !r.stacks.is_empty()),
        kill: None,
        pids: t.pid.into_iter().collect(),
    }
}

/// What to change: where it grows when the stacks say, what usually keeps
/// growing in a training loop, and how to find it otherwise.
fn fixes(place: Option<&str>, stacks: bool) -> Vec<String> {
    let mut v = Vec::new();
    match place {
        Some(at) => v.push(format!(
            "It grows at {at}: find what that keeps across steps and stop keeping it (a list or \
             dict appended to every step, a cache without a bound, tensors stored with their \
             graph)"
        )),
        None => v.push(
            "Find what the loop keeps across steps and stop keeping it: a list or dict appended \
             to every step, a cache without a bound, tensors stored with their graph"
                .into(),
        ),
    }
    v.push(
        "Log numbers, not tensors: `total_loss += loss.item()` (or `.detach()`), not \
         `total_loss += loss`, which keeps every step's autograd graph alive"
            .into(),
    );
    if !stacks {
        v.push(
            "Record again without `--no-stacks` to see where each new high was allocated \
             (`report --stacks`, `report --pprof`): this recording has no stacks"
                .into(),
        );
    }
    v.push(
        "If the climb is the job reading its data into memory rather than a step leaking, the \
         data does not fit: memory-map or stream it instead of loading it whole"
            .into(),
    );
    v.push(
        "A bigger limit only buys time at this rate: the time to the limit above is how much"
            .into(),
    );
    v
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{job, kill, process};
    use super::*;
    use crate::model::leaks::Trend;

    const S: u64 = 1_000_000_000;

    fn trend(pid: u32, slope_mib_s: f64, since_s: u64, verdict: Verdict) -> Trend {
        let slope = slope_mib_s * 1024.0;
        Trend {
            pid: Some(pid),
            start_ns: pid as u64,
            comm: "python".into(),
            group: None,
            members: 1,
            alive: false,
            slope_kb_per_s: slope,
            fit: 0.97,
            since_ns: since_s * S,
            until_ns: 50 * S,
            growth_kb: (slope * (50 - since_s) as f64) as i64,
            size_kb: (slope * (50 - since_s) as f64) as u64,
            verdict,
        }
    }

    fn leaky(verdict: Verdict, slope_mib_s: f64) -> Report {
        let mut r = job(100, 200);
        r.processes = vec![process(100, None, "python", 200)];
        r.kills = vec![kill(100, "python", 200)];
        r.leaks.min_span_ns = 300 * S;
        r.leaks.trends = vec![trend(100, slope_mib_s, 2, verdict)];
        r
    }

    fn run(r: &Report) -> Vec<Diagnosis> {
        let mut out = Vec::new();
        check(r, &mut out);
        out
    }

    #[test]
    fn a_steady_climb_to_the_limit_explains_the_kill() {
        // 4 MiB/s from 2 s to the kill at 50 s: 192 MiB of 200 MiB.
        let d = run(&leaky(Verdict::Steady, 4.0));
        assert_eq!(d.len(), 1, "{d:#?}");
        let d = &d[0];
        assert_eq!(
            (d.id, d.kill, d.confidence),
            ("steady_leak", Some(0), Confidence::High)
        );
        assert_eq!(
            d.title,
            "python (pid 100) leaked steadily: +4 MiB/s for 48 s until the kill, adding 192 MiB of \
             the 200 MiB memory cgroup limit"
        );
        assert!(
            d.evidence[0].contains("from +2.0 s until the kill at +50.0 s"),
            "{d:#?}"
        );
        assert!(d.evidence.iter().any(|e| e.contains("(96%)")), "{d:#?}");
        assert!(d.fix[0].starts_with("Find what the loop keeps"), "{d:#?}");
        assert!(d.fix.iter().any(|f| f.contains("--no-stacks")), "{d:#?}");
        // A rougher short climb is less sure; a leak over the full span
        // is sure however rough.
        let mut r = leaky(Verdict::Steady, 4.0);
        r.leaks.trends[0].fit = 0.85;
        assert_eq!(run(&r)[0].confidence, Confidence::Medium);
        r.leaks.trends[0].verdict = Verdict::Leak;
        assert_eq!(run(&r)[0].confidence, Confidence::High);
        // A fifth of the limit: a cause, not the whole of it.
        let d = run(&leaky(Verdict::Steady, 0.9));
        assert_eq!(d[0].confidence, Confidence::Medium, "{d:#?}");
    }

    #[test]
    fn with_growth_stacks_it_names_where_it_grows() {
        use crate::decode::stacks::{Frame, StackDelta, StackSample};
        let mut r = leaky(Verdict::Steady, 4.0);
        let frame = |kind: &str, func: &str, file: &str| Frame {
            kind: kind.into(),
            addr: 1,
            function: Some(func.into()),
            file: Some(file.into()),
            line: Some(4),
            module: None,
            found: None,
        };
        r.stacks.observe(
            10 * S,
            StackSample {
                stacks: vec![StackDelta {
                    proc: crate::decode::ProcKey {
                        tgid: 100,
                        start_ns: 100,
                    },
                    stack_id: 7,
                    py_id: 0,
                    py_state: 0,
                    bytes: 150 << 20,
                    count: 150,
                    frames: Some(vec![
                        frame("native", "PyByteArray_Resize", "bytearrayobject.c"),
                        frame("python", "leak_step", "train.py"),
                    ]),
                    error: None,
                    gpu: false,
                    leaf_ret: 0,
                }],
            },
        );
        let d = run(&r);
        assert!(
            d[0].evidence.contains(
                &"Its heaviest growth stack: 150 MiB of new highs through leak_step (train.py:4)"
                    .to_string()
            ),
            "{d:#?}"
        );
        assert!(
            d[0].title.ends_with(", in leak_step (train.py:4)"),
            "the kill's line cites the user's own frame: {d:#?}"
        );
        assert!(
            d[0].fix[0].starts_with("It grows at leak_step (train.py:4): "),
            "{d:#?}"
        );
        assert!(!d[0].fix.iter().any(|f| f.contains("--stacks")), "{d:#?}");
    }

    #[test]
    fn a_climb_that_is_no_share_of_the_limit_or_not_steady_is_not_the_cause() {
        // 0.3 MiB/s for 48 s: 14 MiB of 200 MiB, under a tenth.
        assert!(run(&leaky(Verdict::Steady, 0.3)).is_empty());
        // Climbed, then levelled off: a warm-up, not a leak.
        assert!(run(&leaky(Verdict::Levelled, 4.0)).is_empty());
        assert!(run(&leaky(Verdict::TooShort, 4.0)).is_empty());
    }

    #[test]
    fn a_leak_still_climbing_at_the_end_is_the_runs_with_its_projection() {
        let mut r = job(100, 4096);
        let mut t = trend(100, 2.0, 10, Verdict::Leak);
        t.alive = true;
        t.until_ns = 700 * S;
        r.leaks.trends = vec![t];
        r.leaks.projection = Some(crate::model::leaks::Projection {
            domain: crate::model::leaks::Domain::Cgroup,
            limit_kb: 4096 << 10,
            usage_kb: 1500 << 10,
            slope_kb_per_s: 2048.0,
            seconds: Some(1300.0),
        });
        let d = run(&r);
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!(d[0].kill, None);
        assert_eq!(
            d[0].title,
            "python (pid 100) is leaking: +2 MiB/s for 11.5 min; at this rate the cgroup limit \
             of 4 GiB is reached in ~22 min"
        );
        // Not climbing any more: nothing to say.
        r.leaks.trends[0].verdict = Verdict::Levelled;
        assert!(run(&r).is_empty());
    }
}
