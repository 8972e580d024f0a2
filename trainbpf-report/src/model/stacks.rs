//! Growth stacks (`record --stacks`): where each process's new highs of
//! added memory were taken, summed per stack from the collector's deltas.
//! A kill's growers get the stacks recorded up to the kill; the report's
//! processes get the whole run's.

use std::collections::BTreeMap;

/// A frame as recorded: resolved while the process lived.
pub(crate) use crate::decode::stacks::Frame;
use crate::decode::{ProcKey, stacks::StackSample};

/// The collector drains the kernel's map each second and at a kill: what
/// a process added before the kill may be recorded this long after it.
pub(crate) const KILL_SLACK_NS: u64 = 2_000_000_000;
/// Deltas kept per stack before neighbours are merged (halving their time
/// resolution): bounds the model on a run of days.
const MAX_DELTAS: usize = 4096;
/// Stacks kept per process, heaviest first, past which the rest are
/// summed into one "other stacks" entry.
pub(crate) const MAX_STACKS_PER_PROC: usize = 256;

/// One stack of one process: its bytes of new high, how often it was
/// taken, and its frames innermost first (empty, with `error`, for a
/// stack that could not be read or resolved).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct GrowthStack {
    pub(crate) bytes: u64,
    pub(crate) count: u64,
    pub(crate) frames: Vec<Frame>,
    pub(crate) error: Option<String>,
}

#[derive(Clone, Debug, Default)]
struct Entry {
    frames: Vec<Frame>,
    error: Option<String>,
    /// (ts, bytes, count), in time order.
    deltas: Vec<(u64, u64, u64)>,
}

impl Entry {
    fn push(&mut self, ts: u64, bytes: u64, count: u64) {
        if self.deltas.len() >= MAX_DELTAS {
            // Merge neighbours: each pair keeps the later time, so a
            // cut-off never counts bytes recorded after it.
            let merged = self
                .deltas
                .chunks(2)
                .map(|c| {
                    c.iter()
                        .fold((0, 0, 0), |(_, b, n), &(t, b2, n2)| (t, b + b2, n + n2))
                })
                .collect();
            self.deltas = merged;
        }
        self.deltas.push((ts, bytes, count));
    }

    fn until(&self, until: Option<u64>) -> (u64, u64) {
        self.deltas
            .iter()
            .filter(|d| until.is_none_or(|u| d.0 <= u))
            .fold((0, 0), |(b, n), d| {
                (b.saturating_add(d.1), n.saturating_add(d.2))
            })
    }
}

/// Every process's growth stacks, as recorded.
/// What names a recorded stack: the kernel's native stack id, its
/// Python frames' id and walk state (0, 0 for a native-only one), and the
/// return address a frameless leaf left (0: none).
type StackName = (i32, u64, u32, u64);

#[derive(Clone, Debug, Default)]
pub struct Stacks {
    procs: BTreeMap<ProcKey, BTreeMap<StackName, Entry>>,
}

impl Stacks {
    /// A drain's deltas. A stack's frames come with its first delta; a
    /// later delta of a stack never seen (its first record was lost) keeps
    /// its bytes as unresolved.
    pub(crate) fn observe(&mut self, ts: u64, s: StackSample) {
        for d in s.stacks {
            let e = self
                .procs
                .entry(d.proc)
                .or_default()
                .entry((d.stack_id, d.py_id, d.py_state, d.leaf_ret))
                .or_default();
            // The first record with frames names the stack, with its error
            // if it has one (addresses the process no longer mapped).
            if let Some(frames) = d.frames
                && e.frames.is_empty()
            {
                e.frames = frames;
                e.error = d.error;
            } else if d.error.is_some() && e.error.is_none() && e.frames.is_empty() {
                e.error = d.error;
            }
            e.push(ts, d.bytes, d.count);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// The processes with stacks.
    pub(crate) fn processes(&self) -> impl Iterator<Item = ProcKey> + '_ {
        self.procs.keys().copied()
    }

    /// A process's stacks recorded up to `until` (all: `None`), heaviest
    /// first; stacks past `MAX_STACKS_PER_PROC` summed into a last one.
    pub(crate) fn of(&self, key: ProcKey, until: Option<u64>) -> Vec<GrowthStack> {
        let Some(stacks) = self.procs.get(&key) else {
            return Vec::new();
        };
        let mut out: Vec<GrowthStack> = Vec::new();
        for (&(id, ..), e) in stacks {
            let (bytes, count) = e.until(until);
            if count == 0 {
                continue;
            }
            let s = GrowthStack {
                bytes,
                count,
                frames: e.frames.clone(),
                error: e.error.clone().or_else(|| {
                    e.frames
                        .is_empty()
                        .then(|| format!("stack {id}: frames not recorded"))
                }),
            };
            // Stacks the kernel told apart that read the same once named
            // (two instructions of one Python line) are one stack.
            match out
                .iter_mut()
                .find(|o| !o.frames.is_empty() && o.frames == s.frames && o.error == s.error)
            {
                Some(o) => {
                    o.bytes += s.bytes;
                    o.count += s.count;
                }
                None => out.push(s),
            }
        }
        out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)));
        if out.len() > MAX_STACKS_PER_PROC {
            let rest = out.split_off(MAX_STACKS_PER_PROC - 1);
            out.push(GrowthStack {
                bytes: rest.iter().map(|s| s.bytes).sum(),
                count: rest.iter().map(|s| s.count).sum(),
                frames: Vec::new(),
                error: Some(format!("{} lighter stacks, summed", rest.len())),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::stacks::StackDelta;

    fn key(tgid: u32) -> ProcKey {
        ProcKey { tgid, start_ns: 7 }
    }

    fn frame(f: &str) -> Frame {
        Frame {
            kind: "native".into(),
            function: Some(f.into()),
            ..Default::default()
        }
    }

    fn delta(tgid: u32, id: i32, kb: u64, frames: Option<Vec<Frame>>) -> StackDelta {
        StackDelta {
            proc: key(tgid),
            stack_id: id,
            py_id: 0,
            py_state: 0,
            bytes: kb << 10,
            count: 1,
            frames,
            error: None,
            gpu: false,
            leaf_ret: 0,
        }
    }

    /// Deltas of one stack add up; frames from the first record name the
    /// later ones; a kill's cut-off leaves out what came after.
    #[test]
    fn deltas_sum_per_stack_and_cut_at_kill() {
        let mut s = Stacks::default();
        let f = vec![frame("grow_here"), frame("main")];
        s.observe(
            10,
            StackSample {
                stacks: vec![
                    delta(1, 3, 512, Some(f.clone())),
                    delta(1, 4, 100, Some(vec![frame("other")])),
                ],
            },
        );
        s.observe(
            20,
            StackSample {
                stacks: vec![delta(1, 3, 1024, None)],
            },
        );
        s.observe(
            30,
            StackSample {
                stacks: vec![delta(1, 3, 2048, None)],
            },
        );
        let all = s.of(key(1), None);
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].bytes, (512 + 1024 + 2048) << 10);
        assert_eq!(all[0].count, 3);
        assert_eq!(all[0].frames, f);
        assert_eq!(all[0].error, None);
        let cut = s.of(key(1), Some(20));
        assert_eq!(cut[0].bytes, (512 + 1024) << 10);
        assert_eq!(cut[1].frames, vec![frame("other")]);
        assert!(s.of(key(2), None).is_empty());
    }

    /// An unreadable stack keeps its bytes and says why; one whose first
    /// record is missing says its frames were not recorded.
    #[test]
    fn unreadable_and_unresolved_stacks_are_shown() {
        let mut s = Stacks::default();
        let mut bad = delta(1, -14, 64, None);
        bad.error = Some("stack could not be read: EFAULT".into());
        s.observe(
            5,
            StackSample {
                stacks: vec![bad, delta(1, 9, 32, None)],
            },
        );
        let st = s.of(key(1), None);
        assert_eq!(
            st[0].error.as_deref(),
            Some("stack could not be read: EFAULT")
        );
        assert_eq!(st[0].bytes, 64 << 10);
        assert_eq!(st[1].error.as_deref(), Some("stack 9: frames not recorded"));
        let mut gone = delta(2, 4, 16, Some(vec![Frame::default()]));
        gone.error = Some("the process was gone".into());
        s.observe(6, StackSample { stacks: vec![gone] });
        let st = s.of(key(2), None);
        assert_eq!(st[0].frames.len(), 1);
        assert_eq!(st[0].error.as_deref(), Some("the process was gone"));
    }

    /// Two Python stacks the kernel told apart (another instruction of the
    /// same line) that name the same frames are shown as one.
    #[test]
    fn stacks_named_alike_are_one() {
        let mut s = Stacks::default();
        let py = Frame {
            kind: "python".into(),
            addr: 0x7000,
            function: Some("leak_step".into()),
            file: Some("leak.py".into()),
            line: Some(4),
            module: None,
            found: None,
        };
        let mut a = delta(1, 3, 100, Some(vec![py.clone()]));
        a.py_id = 11;
        a.py_state = 1;
        let mut b = delta(1, 3, 50, Some(vec![py.clone()]));
        b.py_id = 12;
        b.py_state = 1;
        let c = delta(1, 3, 10, Some(vec![frame("native_only")]));
        s.observe(
            1,
            StackSample {
                stacks: vec![a, b, c],
            },
        );
        let st = s.of(key(1), None);
        assert_eq!(st.len(), 2, "{st:?}");
        assert_eq!((st[0].bytes, st[0].count), (150 << 10, 2));
        assert_eq!(st[0].frames, vec![py]);
        assert_eq!(st[1].frames, vec![frame("native_only")]);
    }

    /// GPU allocation stacks go to the GPU report's process, growth
    /// stacks to the processes' own: one recorded drain holds both.
    #[test]
    fn gpu_stacks_go_to_the_gpu_process() {
        use crate::decode::gpu::{CudaCall, CudaOp, GpuEvent};
        use crate::decode::{Event, Timed};
        let cuda = Timed {
            ts_ns: 10,
            event: Event::Gpu(Box::new(GpuEvent::Cuda(CudaCall {
                proc: key(1),
                tid: 1,
                comm: "job".into(),
                op: CudaOp::MemAlloc,
                result: 0,
                device: None,
                size: 8 << 20,
                ptr: 0x1000,
                handle: 0,
                aux: 0,
                entry_ns: 9,
            }))),
        };
        let mut gpu = delta(1, 5, 8 << 10, Some(vec![frame("alloc_here")]));
        gpu.gpu = true;
        let growth = delta(1, 5, 512, Some(vec![frame("grow_here")]));
        let drain = Timed {
            ts_ns: 20,
            event: Event::Stacks(StackSample {
                stacks: vec![gpu, growth],
            }),
        };
        let r = crate::model::build(
            &Default::default(),
            [cuda, drain].into_iter(),
            &Default::default(),
        );
        let p = &r.gpu.processes[0];
        assert_eq!(p.pid, 1);
        assert_eq!(p.stacks.len(), 1, "{:?}", p.stacks);
        assert_eq!(p.stacks[0].bytes, 8 << 20);
        assert_eq!(p.stacks[0].frames, vec![frame("alloc_here")]);
        let own = r.stacks.of(key(1), None);
        assert_eq!(own.len(), 1);
        assert_eq!(own[0].frames, vec![frame("grow_here")]);
    }

    /// A long run's deltas are merged, never dropped: the sum holds.
    #[test]
    fn merging_keeps_the_sum() {
        let mut s = Stacks::default();
        for i in 0..(MAX_DELTAS as u64 * 3) {
            s.observe(
                i,
                StackSample {
                    stacks: vec![delta(1, 1, 1, None)],
                },
            );
        }
        let st = s.of(key(1), None);
        assert_eq!(st[0].bytes, (MAX_DELTAS as u64 * 3) << 10);
        assert!(s.procs[&key(1)][&(1, 0, 0, 0)].deltas.len() <= MAX_DELTAS + 1);
        // A cut-off counts at most what was recorded by then.
        let cut = s.of(key(1), Some(100));
        assert!(cut[0].bytes <= 101 << 10);
    }
}
