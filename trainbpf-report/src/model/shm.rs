//! /dev/shm over the run: each filesystem's size and use at each look
//! (kept where they changed, bounded), its peak, and what looking cost.
//! The `shm_full` rule reads the look nearest a bus error from here.

use std::collections::HashMap;

use crate::decode::{ShmLook, ShmTrigger};

/// One look's figures for one filesystem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShmFsSample {
    pub(crate) ts_ns: u64,
    pub(crate) size_kb: u64,
    pub(crate) used_kb: u64,
    pub(crate) trigger: ShmTrigger,
}

/// One /dev/shm filesystem over the run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShmFsHistory {
    /// `st_dev`: the filesystem's identity.
    pub(crate) dev: u64,
    /// A job process saw it as its /dev/shm.
    pub(crate) job: bool,
    /// Looks where its size or use moved by 1% of its size or more, and
    /// every look a kill or a signal asked for; in time order, bounded.
    pub(crate) samples: Vec<ShmFsSample>,
    /// The look with the most used.
    pub(crate) peak: ShmFsSample,
    pub(crate) last: ShmFsSample,
}

impl ShmFsHistory {
    /// The look that shows it as it stood at `ts`: the first one taken at
    /// or after it within `after_ns` (a look a bus error asked for comes
    /// just after it), else the last one before it.
    pub(crate) fn at(&self, ts: u64, after_ns: u64) -> Option<ShmFsSample> {
        let after = self
            .samples
            .iter()
            .find(|s| s.ts_ns >= ts && s.ts_ns <= ts.saturating_add(after_ns));
        after
            .or_else(|| self.samples.iter().rev().find(|s| s.ts_ns < ts))
            .copied()
    }
}

/// What looking at shared memory cost, and how often it looked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShmSampling {
    pub(crate) looks: u64,
    /// Looks a kill or a fatal signal asked for.
    pub(crate) triggered: u64,
    pub(crate) total_cost_us: u64,
    pub(crate) max_cost_us: u64,
    /// The timer's interval after the last look, ms.
    pub(crate) interval_ms: u64,
}

/// /dev/shm filesystems and the looks' cost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShmReport {
    /// The job's first, then by device.
    pub(crate) filesystems: Vec<ShmFsHistory>,
    pub(crate) sampling: ShmSampling,
}

/// Filesystems followed: a job has one or a few /dev/shm.
const MAX_FS: usize = 32;
/// Samples kept per filesystem; beyond, the oldest go (the peak stays).
const MAX_SAMPLES: usize = 2048;

#[derive(Default)]
pub(super) struct ShmBuilder {
    fs: HashMap<u64, ShmFsHistory>,
    sampling: ShmSampling,
}

impl ShmBuilder {
    pub(super) fn observe(&mut self, ts: u64, look: &ShmLook) {
        let s = &mut self.sampling;
        s.looks += 1;
        s.triggered += u64::from(look.trigger != ShmTrigger::Timer);
        s.total_cost_us = s.total_cost_us.saturating_add(look.cost_us);
        s.max_cost_us = s.max_cost_us.max(look.cost_us);
        if look.interval_ms > 0 {
            s.interval_ms = look.interval_ms;
        }
        for f in &look.fs {
            if !self.fs.contains_key(&f.dev) && self.fs.len() >= MAX_FS {
                continue;
            }
            let h = self.fs.entry(f.dev).or_insert_with(|| ShmFsHistory {
                dev: f.dev,
                ..ShmFsHistory::default()
            });
            h.job |= f.job;
            let sample = ShmFsSample {
                ts_ns: ts,
                size_kb: f.size_kb,
                used_kb: f.size_kb.saturating_sub(f.free_kb),
                trigger: look.trigger,
            };
            let moved = h.samples.last().is_none_or(|l| {
                l.size_kb != sample.size_kb
                    || l.used_kb.abs_diff(sample.used_kb) >= (sample.size_kb / 100).max(1)
            });
            if moved || look.trigger != ShmTrigger::Timer {
                if h.samples.len() >= MAX_SAMPLES {
                    h.samples.remove(0);
                }
                h.samples.push(sample);
            }
            if h.samples.len() == 1 || sample.used_kb > h.peak.used_kb {
                h.peak = sample;
            }
            h.last = sample;
        }
    }

    pub(super) fn finish(&self) -> ShmReport {
        let mut filesystems: Vec<ShmFsHistory> = self.fs.values().cloned().collect();
        filesystems.sort_by_key(|f| (!f.job, f.dev));
        ShmReport {
            filesystems,
            sampling: self.sampling.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::ShmFs;

    fn look(trigger: ShmTrigger, used_kb: u64) -> ShmLook {
        ShmLook {
            fs: vec![ShmFs {
                dev: 45,
                size_kb: 65536,
                free_kb: 65536 - used_kb,
                job: true,
            }],
            trigger,
            cost_us: 300,
            interval_ms: 1000,
            ..ShmLook::default()
        }
    }

    #[test]
    fn the_look_a_bus_error_asked_for_shows_the_fs_at_the_error() {
        let mut b = ShmBuilder::default();
        let s = 1_000_000_000;
        for t in 1..=5 {
            b.observe(t * s, &look(ShmTrigger::Timer, 1024));
        }
        b.observe(6 * s, &look(ShmTrigger::Timer, 30_000));
        b.observe(6 * s + 50_000_000, &look(ShmTrigger::Signal, 65536));
        let r = b.finish();
        let f = &r.filesystems[0];
        // Unchanged looks are not kept; the signal's always is.
        assert_eq!(f.samples.len(), 3, "{f:#?}");
        assert_eq!(f.peak.used_kb, 65536);
        assert_eq!(f.at(6 * s + 10, 2 * s).unwrap().used_kb, 65536);
        assert_eq!(f.at(6 * s, 0).unwrap().used_kb, 30_000);
        assert_eq!(f.at(3 * s, 0).unwrap().used_kb, 1024);
        assert_eq!(r.sampling.looks, 7);
        assert_eq!(r.sampling.triggered, 1);
        assert_eq!(r.sampling.max_cost_us, 300);
        assert_eq!(r.sampling.interval_ms, 1000);
    }
}
