//! What an exited process leaves in the kernel's maps (its keys, its high,
//! its interpreter's entry, the stacks only it had) goes after the drain
//! that read them last. The deletions of a drain go together, in a few
//! calls (`loader::batch`), not one a key: a node's churn exits a
//! thousand processes a second.

use trainbpf_common::{ProcId, StackKey};
use trainbpf_report::decode::ProcKey;

use super::{StackCollector, name_of};
use crate::loader::batch;

/// Stacks waiting for deletion at most; past it one is left in the
/// kernel's table (which the kernel bounds).
const MAX_DOOMED: usize = 65_536;

/// Exited processes' keys, deleted from the kernel's maps together.
#[derive(Default)]
struct Gone {
    agg: Vec<StackKey>,
    gpu: Vec<StackKey>,
    high: Vec<ProcId>,
    py: Vec<ProcId>,
}

impl StackCollector {
    /// Forgets the processes that exited before this drain, in the
    /// kernel's maps too.
    pub(super) fn forget_exited(&mut self, exited: Vec<ProcKey>) {
        let mut gone = Gone::default();
        for p in exited {
            self.forget(p, &mut gone);
        }
        batch::delete_or_remove(&mut self.maps.agg, &gone.agg);
        batch::delete_or_remove(&mut self.maps.gpu_agg, &gone.gpu);
        batch::delete_or_remove(&mut self.maps.high, &gone.high);
        batch::delete_or_remove(&mut self.maps.py_procs, &gone.py);
    }

    /// Forgets an exited process: its keys and high go into `gone`, for
    /// the kernel's maps, and the stacks no one else has are doomed.
    fn forget(&mut self, p: ProcKey, gone: &mut Gone) {
        let growth = self.deltas.forget(p.tgid, p.start_ns);
        let gpu = self.gpu_deltas.forget(p.tgid, p.start_ns);
        gone.agg.extend_from_slice(&growth);
        gone.gpu.extend_from_slice(&gpu);
        for (k, g) in growth
            .iter()
            .map(|k| (k, false))
            .chain(gpu.iter().map(|k| (k, true)))
        {
            self.named.remove(&(p, name_of(k), g));
            if (k.stack_id >= 0 || k.py_id != 0) && self.doomed.len() < MAX_DOOMED {
                self.doomed.push((k.stack_id, k.py_id));
            }
        }
        self.pythons.forget(p, &mut gone.py);
        self.known.remove(&p);
        self.mapped.remove(&p);
        self.copies.retain(|(q, _), _| *q != p);
        gone.high.push(ProcId {
            tgid: p.tgid,
            _pad: 0,
            start_ns: p.start_ns,
        });
    }

    /// Deletes the stacks of forgotten processes that no key read in this
    /// drain uses: both maps name stacks in the same tables, and one goes
    /// when neither has it. Right after the read, so that a key the
    /// kernel makes meanwhile is read first or comes later than this (a
    /// stack taken anew is put back in the table).
    pub(super) fn delete_doomed(&mut self) {
        let mut py_gone = Vec::new();
        for (id, py) in std::mem::take(&mut self.doomed) {
            let in_use = |id| self.deltas.in_use(id) || self.gpu_deltas.in_use(id);
            if id >= 0 && !in_use(id) {
                // A stack trace map has no batch delete.
                let _ = self.maps.stacks.remove(&(id as u32));
            }
            let py_in_use = |id| self.deltas.py_in_use(id) || self.gpu_deltas.py_in_use(id);
            // A repeat is no error: a key already gone is skipped.
            if py != 0 && !py_in_use(py) {
                py_gone.push(py);
            }
        }
        batch::delete_or_remove(&mut self.maps.py_stacks, &py_gone);
    }
}
