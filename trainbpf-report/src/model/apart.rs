//! Processes kept apart from the job: with `--all` (and a `--cgroup` the
//! recorder runs in) the recorder, the helpers it runs and the kernel's
//! own threads are recorded like any process, and a report that listed
//! them as the job's would bury it. Their memory stays, as outside the
//! job (a kill can still name them); their lives are not the job's.

use crate::decode::MemSample;
use std::collections::HashSet;

use crate::decode::{Event, ProcKey, Timed};

/// kthreadd: every kernel thread's parent.
const KTHREADD: u32 = 2;
/// Keys remembered at most: a machine forks kernel threads all day.
const MAX_KEYS: usize = 1 << 16;

#[derive(Debug, Default)]
pub(super) struct Apart {
    recorder: Option<u32>,
    keys: HashSet<ProcKey>,
    /// Processes left out of the job: the recorder and its helpers, and
    /// kernel threads.
    pub(super) recorder_procs: u64,
    pub(super) kernel_threads: u64,
}

impl Apart {
    pub(super) fn new(recorder: Option<u32>) -> Apart {
        Apart {
            recorder: recorder.filter(|&p| p != 0),
            ..Apart::default()
        }
    }

    fn is_apart(&self, k: &ProcKey) -> bool {
        Some(k.tgid) == self.recorder || k.tgid == KTHREADD || self.keys.contains(k)
    }

    fn remember(&mut self, k: ProcKey) {
        if self.keys.len() < MAX_KEYS {
            self.keys.insert(k);
        }
    }

    /// The event as the job's model should see it: a process kept apart
    /// loses its lifecycle records and its memory counts as outside the
    /// job. `None` drops the event.
    pub(super) fn filter(&mut self, mut t: Timed) -> Option<Timed> {
        match &mut t.event {
            Event::Fork {
                child,
                parent,
                kthread,
                ..
            } => {
                let kernel = *kthread || parent.tgid == KTHREADD || child.tgid == KTHREADD;
                let recorder = !kernel && self.is_apart(parent);
                if kernel || recorder || self.is_apart(child) {
                    if kernel {
                        self.kernel_threads += 1;
                    } else {
                        self.recorder_procs += 1;
                    }
                    self.remember(*child);
                    return None;
                }
            }
            Event::Exec { proc, .. } if self.is_apart(proc) => return None,
            Event::Exit { proc, kthread, .. } => {
                if *kthread && !self.keys.contains(proc) {
                    // One that was running before the recording began.
                    self.kernel_threads += 1;
                }
                if *kthread || self.is_apart(proc) {
                    self.keys.remove(proc);
                    return None;
                }
            }
            Event::Mem(MemSample { proc, in_job, .. }) | Event::OomAdj { proc, in_job, .. }
                if self.is_apart(proc) =>
            {
                *in_job = false;
            }
            Event::Oom(rec) if self.is_apart(&rec.victim) => rec.in_job = false,
            _ => {}
        }
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32) -> ProcKey {
        ProcKey {
            tgid,
            start_ns: u64::from(tgid) * 10,
        }
    }

    fn fork(child: u32, parent: u32, kthread: bool) -> Timed {
        Timed {
            ts_ns: 1,
            event: Event::Fork {
                child: key(child),
                parent: key(parent),
                comm: "x".into(),
                kthread,
            },
        }
    }

    fn exit(pid: u32, kthread: bool) -> Timed {
        Timed {
            ts_ns: 2,
            event: Event::Exit {
                proc: key(pid),
                comm: "x".into(),
                exit_code: 0,
                group_exit_code: 0,
                kthread,
            },
        }
    }

    fn mem_in_job(a: &mut Apart, pid: u32) -> bool {
        let t = Timed {
            ts_ns: 3,
            event: Event::Mem(MemSample {
                proc: key(pid),
                in_job: true,
                comm: "x".into(),
                rss: Default::default(),
                faults: 0,
                reason: 0,
                oom_score_adj: 0,
                pgtables_kb: 0,
                memcg_id: 0,
                stall_ns: 0,
                alloc_kb: 0,
                freed_kb: 0,
                cache_kb: 0,
            }),
        };
        match a.filter(t).map(|t| t.event) {
            Some(Event::Mem(MemSample { in_job, .. })) => in_job,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_recorder_and_its_helpers_are_not_the_job() {
        let mut a = Apart::new(Some(500));
        assert!(a.filter(fork(501, 500, false)).is_none(), "its helper");
        assert!(
            a.filter(fork(502, 501, false)).is_none(),
            "the helper's child"
        );
        assert!(!mem_in_job(&mut a, 500));
        assert!(!mem_in_job(&mut a, 502));
        assert!(a.filter(exit(501, false)).is_none());
        assert_eq!(a.recorder_procs, 2);
        // Anyone else's fork is the job's.
        assert!(a.filter(fork(600, 1, false)).is_some());
        assert!(mem_in_job(&mut a, 600));
        assert!(a.filter(exit(600, false)).is_some());
    }

    #[test]
    fn kernel_threads_are_left_out() {
        let mut a = Apart::new(None);
        assert!(a.filter(fork(700, 2, false)).is_none(), "kthreadd's child");
        assert!(a.filter(fork(701, 9, true)).is_none(), "flagged");
        assert!(a.filter(exit(700, false)).is_none());
        // One running before the recording: only its exit says so.
        assert!(a.filter(exit(42, true)).is_none());
        assert_eq!(a.kernel_threads, 3);
        // No recorder pid (an older recording): nothing else is left out.
        assert!(a.filter(fork(800, 1, false)).is_some());
    }
}
