//! One process's side of the ledger: what it holds now by kind, the
//! pointers and `cuMemCreate` handles still live, and the change points
//! the timeline and the charts are drawn from.

use std::collections::HashMap;

use super::{GpuProcess, Held, KindStats, MAX_HISTORY, MemKind};

pub(super) const KINDS: [MemKind; 3] = [MemKind::Device, MemKind::Pinned, MemKind::Managed];

pub(super) fn idx(k: MemKind) -> usize {
    match k {
        MemKind::Device => 0,
        MemKind::Pinned => 1,
        MemKind::Managed => 2,
    }
}

/// A pointer allocated and not yet freed.
#[derive(Debug)]
pub(super) struct Live {
    pub(super) kind: MemKind,
    pub(super) size: u64,
    pub(super) registered: bool,
}

/// A `cuMemCreate` handle: its memory is freed at the later of its
/// release and its last unmap.
#[derive(Debug)]
pub(super) struct Vmm {
    pub(super) kind: MemKind,
    pub(super) size: u64,
    pub(super) released: bool,
    pub(super) maps: u32,
}

#[derive(Debug, Default)]
pub(super) struct ProcState {
    pub(super) p: GpuProcess,
    pub(super) cur: [u64; 3],
    pub(super) registered: u64,
    pub(super) live: HashMap<u64, Live>,
    pub(super) vmm: HashMap<u64, Vmm>,
    /// VA → handle of each `cuMemMap`.
    pub(super) maps: HashMap<u64, u64>,
    pub(super) history: Vec<(u64, Held)>,
    /// The last `cuInit` entry not yet followed by a context.
    pub(super) init_entry: Option<u64>,
    pub(super) seen_ns: u64,
}

impl ProcState {
    pub(super) fn held(&self) -> Held {
        Held {
            device: self.cur[0],
            pinned: self.cur[1],
            managed: self.cur[2],
        }
    }

    pub(super) fn stats(&mut self, k: MemKind) -> &mut KindStats {
        match k {
            MemKind::Device => &mut self.p.device,
            MemKind::Pinned => &mut self.p.pinned,
            MemKind::Managed => &mut self.p.managed,
        }
    }

    pub(super) fn add(&mut self, ts: u64, k: MemKind, size: u64) {
        self.cur[idx(k)] += size;
        let cur = self.cur[idx(k)];
        let s = self.stats(k);
        s.allocated += size;
        s.allocs += 1;
        s.peak = s.peak.max(cur);
        self.point(ts);
    }

    pub(super) fn sub(&mut self, ts: u64, k: MemKind, size: u64) {
        self.cur[idx(k)] = self.cur[idx(k)].saturating_sub(size);
        let s = self.stats(k);
        s.freed += size;
        s.frees += 1;
        self.point(ts);
    }

    pub(super) fn point(&mut self, ts: u64) {
        let h = self.held();
        self.history.push((ts, h));
        if self.history.len() > MAX_HISTORY {
            thin(&mut self.history);
        }
    }

    /// Held at or before `ts` (zero before the first change).
    pub(super) fn held_at(&self, ts: u64) -> Held {
        let i = self.history.partition_point(|(t, _)| *t <= ts);
        if i == 0 {
            Held::default()
        } else {
            self.history[i - 1].1
        }
    }
}

/// Keeps every other point, and always the last.
pub(super) fn thin<T: Copy>(v: &mut Vec<(u64, T)>) {
    let last = *v.last().expect("thinning a non-empty history");
    let mut i = 0;
    v.retain(|_| {
        i += 1;
        i % 2 == 1
    });
    if v.last().map(|l| l.0) != Some(last.0) {
        v.push(last);
    }
}
