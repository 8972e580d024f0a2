//! Short-lived helpers: a job launched through a pyenv shim runs dozens
//! of `bash` and `readlink` processes that live milliseconds and add
//! nothing. Listed one by one they bury the processes that matter, so the
//! text and HTML reports fold them into one line; the JSON keeps them all.

use std::collections::{HashMap, HashSet};

use crate::decode::{ExitStatus, ProcKey};

use super::{Kill, Process, SEC};

/// Lived less than this.
pub(crate) const SHORT_NS: u64 = SEC;
/// Added at most this (allocated minus freed in its own context): an
/// exec'd helper's own heap and stack.
pub(crate) const ADDED_NOTHING_KB: i64 = 4 * 1024;
/// Without the page probes nothing says what it added: a helper's
/// resident memory once it exec'd stays under this.
pub(crate) const SMALL_RSS_KB: u64 = 64 * 1024;

/// The job processes folded away, and their names with counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShortLived {
    keys: HashSet<ProcKey>,
    /// Name and count, most numerous first.
    pub(crate) by_comm: Vec<(String, u64)>,
}

impl ShortLived {
    pub(crate) fn count(&self) -> u64 {
        self.keys.len() as u64
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Any folded process had this pid (role groups know pids only).
    pub(crate) fn has_pid(&self, pid: u32) -> bool {
        self.keys.iter().any(|k| k.tgid == pid)
    }

    pub(crate) fn contains(&self, pid: u32, start_ns: u64) -> bool {
        self.keys.contains(&ProcKey {
            tgid: pid,
            start_ns,
        })
    }
}

/// Whether `p` folds: born and ended while recording, under [`SHORT_NS`],
/// by a normal exit (any code; never a signal), adding nothing, and not
/// the root nor in `involved` (a kill's victim, trigger or grower).
pub(crate) fn folds(p: &Process, involved: &HashSet<ProcKey>) -> bool {
    let key = ProcKey {
        tgid: p.pid,
        start_ns: p.start_ns,
    };
    let (Some(born), Some(died)) = (p.born_ns, p.died_ns) else {
        return false;
    };
    let added_nothing = match p.honest_peak_kb {
        Some(kb) => kb <= ADDED_NOTHING_KB,
        None => p.peak_rss_kb <= SMALL_RSS_KB,
    };
    p.parent.is_some()
        && died.saturating_sub(born) < SHORT_NS
        && matches!(p.exit, Some(ExitStatus::Code(_)))
        && !p.oom_killed
        && added_nothing
        && !involved.contains(&key)
}

/// Every process a kill involved: its victim, its trigger, its growers.
pub(crate) fn involved(kills: &[Kill]) -> HashSet<ProcKey> {
    let mut v = HashSet::new();
    for k in kills {
        v.insert(k.victim.key());
        for g in &k.growers {
            v.insert(ProcKey {
                tgid: g.pid,
                start_ns: g.start_ns,
            });
        }
    }
    v
}

/// The job's short-lived helpers (see [`folds`]). A kill's trigger is
/// known by pid only: every process with that pid stays.
pub(crate) fn fold(processes: &[Process], kills: &[Kill]) -> ShortLived {
    let involved = involved(kills);
    let triggers: HashSet<u32> = kills.iter().map(|k| k.trigger.tgid).collect();
    let mut keys = HashSet::new();
    let mut by: HashMap<&str, u64> = HashMap::new();
    for p in processes {
        if folds(p, &involved) && !triggers.contains(&p.pid) {
            keys.insert(ProcKey {
                tgid: p.pid,
                start_ns: p.start_ns,
            });
            *by.entry(p.comm.as_str()).or_default() += 1;
        }
    }
    let mut by_comm: Vec<(String, u64)> = by.into_iter().map(|(c, n)| (c.to_string(), n)).collect();
    by_comm.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ShortLived { keys, by_comm }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Grower, Trigger, Victim};

    const MS: u64 = 1_000_000;

    fn helper(pid: u32, comm: &str) -> Process {
        Process {
            pid,
            start_ns: u64::from(pid) * MS,
            comm: comm.into(),
            parent: Some(ProcKey {
                tgid: 1,
                start_ns: 1,
            }),
            born_ns: Some(u64::from(pid) * MS),
            died_ns: Some(u64::from(pid) * MS + 30 * MS),
            exit: Some(ExitStatus::Code(0)),
            honest_peak_kb: Some(200),
            ..Process::default()
        }
    }

    #[test]
    fn helpers_fold_by_name() {
        let mut ps: Vec<Process> = (10..44).map(|p| helper(p, "bash")).collect();
        ps.extend((50..55).map(|p| helper(p, "readlink")));
        // readlink failing is still a normal end.
        ps[35].exit = Some(ExitStatus::Code(1));
        let s = fold(&ps, &[]);
        assert_eq!(s.count(), 39);
        assert_eq!(
            s.by_comm,
            vec![("bash".to_string(), 34), ("readlink".to_string(), 5)]
        );
        assert!(s.contains(10, 10 * MS));
        assert!(!s.contains(10, 0));
    }

    #[test]
    fn what_matters_never_folds() {
        let long = Process {
            died_ns: Some(10 * MS + 2 * SEC),
            ..helper(10, "long")
        };
        let grew = Process {
            honest_peak_kb: Some(50 * 1024),
            ..helper(11, "grew")
        };
        let big_rss_no_probes = Process {
            honest_peak_kb: None,
            peak_rss_kb: 300 * 1024,
            ..helper(12, "big")
        };
        let signalled = Process {
            exit: Some(ExitStatus::Signal(15)),
            ..helper(13, "sig")
        };
        let root = Process {
            parent: None,
            ..helper(14, "root")
        };
        let alive = Process {
            died_ns: None,
            ..helper(15, "alive")
        };
        let victim = helper(16, "victim");
        let grower = helper(17, "grower");
        let trigger = helper(18, "trigger");
        let kill = Kill {
            victim: Victim {
                pid: victim.pid,
                start_ns: victim.start_ns,
                ..Victim::default()
            },
            trigger: Trigger {
                pid: 18,
                tgid: 18,
                start_ns: 0,
                comm: "trigger".into(),
            },
            growers: vec![Grower {
                pid: grower.pid,
                start_ns: grower.start_ns,
                comm: grower.comm.clone(),
                grew_kb: 0,
                honest_kb: None,
                window_ns: 0,
                rate_kb_per_s: None,
                rss_kb: 0,
                in_job: true,
                born_in_window: false,
                is_victim: false,
            }],
            ..Kill::default()
        };
        let ps = vec![
            long,
            grew,
            big_rss_no_probes,
            signalled,
            root,
            alive,
            victim,
            grower,
            trigger,
            helper(19, "bash"),
        ];
        let s = fold(&ps, &[kill]);
        assert_eq!(s.by_comm, vec![("bash".to_string(), 1)]);
    }
}
