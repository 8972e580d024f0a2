//! Several recordings of one job, one per node, on one timeline (pure).
//!
//! Each recording's event times are its own host's CLOCK_MONOTONIC, which
//! means nothing on another host. The header's clock pair (both clocks read
//! at one instant) turns them into wall-clock time, which the hosts share
//! as well as their time sync (NTP, PTP) keeps them. So every kill and
//! death goes on the wall clock. How far two hosts' wall clocks disagree
//! cannot be seen from the recordings; how precisely each anchor was taken
//! can (the header's `clock.uncertainty_ns`), and the report says both.
//!
//! Each recording keeps its own [`Report`], built as for one file; the
//! merge labels it ([`Source`]: its index and path, its host from the
//! header), so that every kill, death and process in it carries its host
//! and recording, and adds what only the whole job shows: one timeline and
//! the first failure.

use super::{Cause, Death, Kill, Report};

/// Which recording of a job a [`Report`] is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Source {
    /// Its place among the recordings given to `report`.
    pub(crate) index: usize,
    /// How many recordings were merged: above 1, the text names the host
    /// on each kill and death.
    pub(crate) of: usize,
    /// The file, as given.
    pub path: String,
}

impl Source {
    /// Part of a merge of several recordings.
    pub(crate) fn merged(&self) -> bool {
        self.of > 1
    }
}

/// One recording, as the merged report introduces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recording {
    pub(crate) index: usize,
    pub(crate) path: String,
    pub host: String,
    /// Wall-clock time of its first event; `None` for an empty recording or
    /// one without a clock pair.
    pub started_ns: Option<u64>,
    /// From the job's start (the earliest first event of any recording, on
    /// the wall clock) to this recording's first event: added to this
    /// recording's times from its own start, it places them on the job's.
    pub(crate) clock_offset_ns: u64,
    /// How precisely its clock anchor was taken; `None` in older recordings.
    pub(crate) anchor_uncertainty_ns: Option<u64>,
}

impl Recording {
    /// A report's own entry: as the merge would list it, alone.
    pub fn of(r: &Report, job_start_ns: Option<u64>) -> Recording {
        let started_ns = r.first_ns.and_then(|t| r.realtime_ns(t));
        Recording {
            index: r.source.index,
            path: r.source.path.clone(),
            host: r.header.hostname.clone(),
            started_ns,
            clock_offset_ns: match (started_ns, job_start_ns) {
                (Some(s), Some(j)) => s.saturating_sub(j),
                _ => 0,
            },
            anchor_uncertainty_ns: r.header.clock.uncertainty_ns,
        }
    }
}

/// A kill or a death, by its index in its recording's report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum What {
    Kill(usize),
    Death(usize),
}

/// One kill or death on the job's timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Happening {
    /// Wall clock, ns since the epoch; a recording without a clock pair
    /// has its own monotonic time here, and cannot be placed.
    pub(crate) at_ns: u64,
    pub(crate) recording: usize,
    pub(crate) what: What,
    /// An OOM kill of a job process, a death by a signal or a crash, or
    /// an exit with a nonzero code.
    pub(crate) failure: bool,
    /// The process it is about.
    pub(crate) pid: u32,
}

/// The recordings of one job, on one timeline.
#[derive(Clone, Debug, Default)]
pub struct Merged {
    pub recordings: Vec<Recording>,
    /// Each recording's own report, labelled with its [`Source`].
    pub(crate) reports: Vec<Report>,
    /// Every kill and death of every recording, by wall-clock time.
    pub(crate) timeline: Vec<Happening>,
    /// The first failure across the job (an index into `timeline`).
    pub(crate) first: Option<usize>,
    /// The failures after it on other processes, each process once (what
    /// the other ranks did then), as indices into `timeline`.
    pub(crate) then: Vec<usize>,
    /// Recordings without a clock pair: their times are not aligned.
    pub(crate) unanchored: Vec<usize>,
}

impl Merged {
    /// The widest of the anchors' uncertainties; `None` when any anchor's
    /// is unknown.
    pub(crate) fn anchor_uncertainty_ns(&self) -> Option<u64> {
        self.recordings
            .iter()
            .map(|r| r.anchor_uncertainty_ns)
            .try_fold(0, |m, u| u.map(|u| u.max(m)))
    }

    pub(crate) fn kill(&self, h: &Happening) -> Option<&Kill> {
        match h.what {
            What::Kill(i) => self.reports.get(h.recording)?.kills.get(i),
            What::Death(_) => None,
        }
    }

    pub(crate) fn death(&self, h: &Happening) -> Option<&Death> {
        match h.what {
            What::Death(i) => self.reports.get(h.recording)?.deaths.get(i),
            What::Kill(_) => None,
        }
    }

    pub(crate) fn host(&self, recording: usize) -> &str {
        self.recordings
            .get(recording)
            .map(|r| r.host.as_str())
            .unwrap_or("")
    }

    /// What a job's timeline shows: every kill and every failure, less an
    /// OOM victim's own death, which its kill already stands for.
    pub(crate) fn shown(&self) -> impl Iterator<Item = &Happening> {
        self.timeline.iter().filter(|h| match h.what {
            What::Kill(_) => true,
            What::Death(_) => {
                h.failure
                    && !self.death(h).is_some_and(|d| {
                        matches!(d.cause, Cause::OomMemcg | Cause::OomGlobal)
                            && self.timeline.iter().any(|k| {
                                matches!(k.what, What::Kill(_))
                                    && (k.recording, k.pid) == (h.recording, h.pid)
                            })
                    })
            }
        })
    }

    /// The job's start: the earliest first event of any recording, on the
    /// wall clock.
    pub(crate) fn started_ns(&self) -> Option<u64> {
        self.recordings.iter().filter_map(|r| r.started_ns).min()
    }
}

/// Merges `parts` (each a path and the report built from it, in the order
/// given) into one job.
pub fn merge(parts: Vec<(String, Report)>) -> Merged {
    let n = parts.len();
    let mut reports: Vec<Report> = parts
        .into_iter()
        .enumerate()
        .map(|(index, (path, mut r))| {
            r.source = Source { index, of: n, path };
            r
        })
        .collect();
    let job_start = reports
        .iter()
        .filter_map(|r| r.first_ns.and_then(|t| r.realtime_ns(t)))
        .min();
    let recordings = reports
        .iter()
        .map(|r| Recording::of(r, job_start))
        .collect();
    let unanchored = reports
        .iter()
        .filter(|r| r.header.clock.realtime_ns == 0)
        .map(|r| r.source.index)
        .collect();

    let mut timeline = Vec::new();
    for r in &mut reports {
        let at = |t: u64| r.realtime_ns(t).unwrap_or(t);
        for (i, k) in r.kills.iter().enumerate() {
            timeline.push(Happening {
                at_ns: k.realtime_ns.unwrap_or_else(|| at(k.ts_ns)),
                recording: r.source.index,
                what: What::Kill(i),
                failure: k.victim.in_job,
                pid: k.victim.pid,
            });
        }
        for (i, d) in r.deaths.iter().enumerate() {
            timeline.push(Happening {
                at_ns: at(d.ts_ns),
                recording: r.source.index,
                what: What::Death(i),
                failure: d.cause != Cause::Exit || d.code.is_some_and(|c| c != 0),
                pid: d.pid,
            });
        }
    }
    // A kill before the victim's death at the same instant: the kill is
    // the cause.
    timeline.sort_by_key(|h| (h.at_ns, h.recording, matches!(h.what, What::Death(_))));

    let first = timeline.iter().position(|h| h.failure);
    if let Some(f) = first {
        mark_consequences(&mut reports, &timeline, f);
    }
    let mut then = Vec::new();
    if let Some(f) = first {
        let mut seen = vec![(timeline[f].recording, timeline[f].pid)];
        for (i, h) in timeline.iter().enumerate().skip(f + 1) {
            if h.failure && !seen.contains(&(h.recording, h.pid)) {
                seen.push((h.recording, h.pid));
                then.push(i);
            }
        }
    }
    Merged {
        recordings,
        reports,
        timeline,
        first,
        then,
        unanchored,
    }
}

/// When the job's first failure is an OOM kill, marks the deaths on other
/// hosts that followed it as its consequences, by the same rule as within
/// one recording ([`super::deaths::consequence`]), on the wall clock: the
/// ranks a node's agent stopped after another node's rank was killed.
fn mark_consequences(reports: &mut [Report], timeline: &[Happening], first: usize) {
    let f = &timeline[first];
    let What::Kill(ki) = f.what else {
        return;
    };
    let Some(k) = reports.get(f.recording).and_then(|r| r.kills.get(ki)) else {
        return;
    };
    let host = &reports[f.recording].header.hostname;
    let victim = format!(
        "{} on {host}",
        reports[f.recording].who(k.victim.pid, k.victim.start_ns, &k.victim.comm)
    );
    let (victim_pid, kill_at) = (k.victim.pid, f.at_ns);
    for h in &timeline[first + 1..] {
        let What::Death(di) = h.what else { continue };
        if h.recording == f.recording {
            continue; // marked by its own report
        }
        let r = &mut reports[h.recording];
        let born = r.deaths.get(di).and_then(|d| {
            r.processes
                .iter()
                .find(|p| p.pid == d.pid && p.start_ns == d.start_ns)
                .and_then(|p| p.born_ns)
                .map(|b| r.realtime_ns(b).unwrap_or(b))
        });
        let Some(d) = r.deaths.get_mut(di) else {
            continue;
        };
        if d.after.is_none() && super::deaths::consequence(d.cause, d.code, born, h.at_ns, kill_at)
        {
            d.after = Some(super::deaths::After {
                kill: ki + 1,
                victim: victim.clone(),
                victim_pid,
                after_ns: h.at_ns - kill_at,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Cause, Death};

    const SEC: u64 = 1_000_000_000;
    /// 2026-12-01T18:00:00Z
    const WALL: u64 = 1_796_148_000 * SEC;

    /// A report of `host` whose monotonic clock read `mono` at `WALL +
    /// wall_off`; first event at monotonic `mono`.
    fn report(host: &str, mono: u64, wall_off: u64, unc: Option<u64>) -> Report {
        let mut r = crate::render::fixture::sample_report();
        r.header.hostname = host.into();
        r.header.clock.monotonic_ns = mono;
        r.header.clock.realtime_ns = WALL + wall_off;
        r.header.clock.uncertainty_ns = unc;
        r.first_ns = Some(mono);
        r.last_ns = Some(mono + 60 * SEC);
        r.kills.clear();
        r.deaths.clear();
        r
    }

    fn death(pid: u32, ts_ns: u64, cause: Cause, code: Option<i32>) -> Death {
        Death {
            pid,
            start_ns: 1,
            comm: format!("p{pid}"),
            ts_ns,
            cause,
            signal: None,
            code,
            sender: None,
            memcg: None,
            memcg_limit_kb: None,
            after: None,
        }
    }

    fn with_kill(mut r: Report, pid: u32, ts_ns: u64, in_job: bool) -> Report {
        let mut k = crate::render::fixture::sample_report().kills.remove(0);
        k.ts_ns = ts_ns;
        k.realtime_ns = r.realtime_ns(ts_ns);
        k.victim.pid = pid;
        k.victim.in_job = in_job;
        r.kills.push(k);
        r
    }

    /// node1's monotonic clock runs days ahead of node2's (it booted
    /// earlier); by the wall clock node2's kill came first.
    fn two_nodes() -> Merged {
        let mut a = report("node1", 900_000 * SEC, 0, Some(2_000));
        // node1 at +5 s: a rank exits 1 after its peer vanished.
        a.deaths
            .push(death(11, 900_005 * SEC, Cause::Exit, Some(1)));
        a.deaths
            .push(death(10, 900_001 * SEC, Cause::Exit, Some(0)));
        a.deaths.sort_by_key(|d| d.ts_ns);
        // node2 starts 1 s later by the wall clock; OOM kill at +3 s of
        // the job (+2 s of its own).
        let mut b = report("node2", 50 * SEC, SEC, Some(7_000));
        b = with_kill(b, 33, 52 * SEC, true);
        b.deaths
            .push(death(33, 52 * SEC + 1_000, Cause::OomMemcg, None));
        b.deaths.push(death(34, 54 * SEC, Cause::Signal, None));
        merge(vec![
            ("/run/node1.rec".into(), a),
            ("/run/node2.rec".into(), b),
        ])
    }

    #[test]
    fn clocks_align_by_the_wall_clock_anchors() {
        let m = two_nodes();
        assert_eq!(m.recordings.len(), 2);
        assert_eq!(m.recordings[0].host, "node1");
        assert_eq!(m.recordings[1].host, "node2");
        assert_eq!(m.recordings[0].started_ns, Some(WALL));
        assert_eq!(m.recordings[1].started_ns, Some(WALL + SEC));
        assert_eq!(m.recordings[0].clock_offset_ns, 0);
        assert_eq!(m.recordings[1].clock_offset_ns, SEC);
        assert_eq!(m.started_ns(), Some(WALL));
        assert_eq!(m.anchor_uncertainty_ns(), Some(7_000));
        assert!(m.unanchored.is_empty());
        for (i, r) in m.reports.iter().enumerate() {
            assert_eq!(r.source.index, i);
            assert_eq!(r.source.of, 2);
            assert!(r.source.merged());
        }
        assert_eq!(m.reports[1].source.path, "/run/node2.rec");
    }

    #[test]
    fn the_timeline_is_in_wall_clock_order_across_hosts() {
        let m = two_nodes();
        let order: Vec<(u64, usize, u32)> = m
            .timeline
            .iter()
            .map(|h| ((h.at_ns - WALL) / 1_000_000, h.recording, h.pid))
            .collect();
        // node1's exit at +1 s, node2's kill and its death at +3 s, node2's
        // signal at +5 s, node1's failed exit at +5 s (node1 sorts first at
        // the same millisecond).
        assert_eq!(
            order,
            vec![
                (1000, 0, 10),
                (3000, 1, 33),
                (3000, 1, 33),
                (5000, 0, 11),
                (5000, 1, 34)
            ]
        );
        assert!(matches!(m.timeline[1].what, What::Kill(0)));
        assert!(matches!(m.timeline[2].what, What::Death(0)));
        // Shown: the kill stands for its victim's death; no clean exit.
        let shown: Vec<(usize, u32)> = m.shown().map(|h| (h.recording, h.pid)).collect();
        assert_eq!(shown, vec![(1, 33), (0, 11), (1, 34)]);
    }

    #[test]
    fn deaths_on_other_hosts_after_the_first_kill_are_its_consequences() {
        let m = two_nodes();
        let on_node1 = |pid: u32| {
            m.reports[0]
                .deaths
                .iter()
                .find(|d| d.pid == pid)
                .unwrap()
                .after
                .clone()
        };
        let a = on_node1(11).expect("node1's rank exited 1 two seconds after the kill");
        assert_eq!((a.kill, a.victim_pid, a.after_ns), (1, 33, 2 * SEC));
        assert!(a.victim.ends_with("(pid 33) on node2"), "{}", a.victim);
        assert_eq!(on_node1(10), None, "a clean exit, before the kill");
    }

    #[test]
    fn the_first_failure_is_the_earliest_across_the_job() {
        let m = two_nodes();
        let f = &m.timeline[m.first.unwrap()];
        assert_eq!((f.recording, f.pid), (1, 33), "node2's OOM kill");
        assert!(m.kill(f).is_some());
        assert_eq!(m.host(f.recording), "node2");
        // Then: node1's rank exiting 1 and node2's other process, each
        // once; not the victim's own death again, not the clean exit.
        let then: Vec<(usize, u32)> = m
            .then
            .iter()
            .map(|&i| (m.timeline[i].recording, m.timeline[i].pid))
            .collect();
        assert_eq!(then, vec![(0, 11), (1, 34)]);
    }

    #[test]
    fn a_kill_outside_the_job_is_no_failure_of_it() {
        let a = with_kill(report("node1", 100 * SEC, 0, None), 99, 101 * SEC, false);
        let mut b = report("node2", 100 * SEC, 0, None);
        b.deaths.push(death(5, 110 * SEC, Cause::Crash, None));
        let m = merge(vec![("a".into(), a), ("b".into(), b)]);
        let f = &m.timeline[m.first.unwrap()];
        assert_eq!((f.recording, f.pid), (1, 5));
        assert_eq!(m.anchor_uncertainty_ns(), None, "unknown, not zero");
    }

    #[test]
    fn a_job_that_did_not_fail_has_no_first() {
        let mut a = report("n", SEC, 0, Some(1));
        a.deaths.push(death(1, 2 * SEC, Cause::Exit, Some(0)));
        let m = merge(vec![("a".into(), a)]);
        assert_eq!(m.first, None);
        assert!(m.then.is_empty());
        assert!(!m.reports[0].source.merged());
    }

    #[test]
    fn a_recording_without_a_clock_pair_is_named() {
        let mut a = report("n1", SEC, 0, None);
        a.header.clock.realtime_ns = 0;
        let b = report("n2", SEC, 0, None);
        let m = merge(vec![("a".into(), a), ("b".into(), b)]);
        assert_eq!(m.unanchored, vec![0]);
        assert_eq!(m.recordings[0].started_ns, None);
        assert_eq!(m.started_ns(), Some(WALL));
    }
}
