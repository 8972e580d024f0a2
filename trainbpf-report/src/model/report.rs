//! The [`Report`] the model builds: everything the renderers read, and
//! the lookups they share (wall-clock time, a grower's stacks, a process's
//! identity).

use std::collections::HashMap;

use super::*;
use crate::decode::ProcKey;
use crate::recording::{RecordingHeader, Skipped, Stop};

/// Everything the renderers need; they never see the recording itself.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub(crate) header: RecordingHeader,
    pub(crate) window_ns: u64,
    /// Time of the earliest and latest event; `None` for an empty recording.
    pub(crate) first_ns: Option<u64>,
    pub(crate) last_ns: Option<u64>,
    pub(crate) events: u64,
    /// `None` when the recording has no job-start record (cut short early).
    pub(crate) job: Option<Job>,
    /// In time order.
    pub(crate) kills: Vec<Kill>,
    /// Memory cgroup kills elsewhere on the machine (`kills::elsewhere`):
    /// another job's own limit, left out of `kills`.
    pub(crate) kills_elsewhere: u32,
    /// The job's processes, by birth.
    pub(crate) processes: Vec<Process>,
    /// Every job process that ended, with the cause, by time.
    pub(crate) deaths: Vec<Death>,
    /// The job's processes grouped by role over the whole run: the most each
    /// member added, summed (`grew_kb` holds the summed peak RSS here).
    pub(crate) groups: Vec<Group>,
    /// Shared-memory objects, each counted once, biggest first.
    pub(crate) shared_memory: Vec<crate::decode::ShmObject>,
    /// /dev/shm filesystems over the run (size and use at each look), and
    /// what looking at shared memory cost.
    pub(crate) shm: shm::ShmReport,
    /// The job's honest growth against its cgroup at the cgroup's peak.
    pub(crate) attribution_at_peak: Option<SumCheck>,
    /// What USS/PSS sampling cost: rounds and total µs.
    pub(crate) smaps_rounds: u64,
    pub(crate) smaps_cost_us: u64,
    /// Largest peak resident memory seen, any process on the machine.
    pub(crate) top_memory: Vec<MemoryUser>,
    /// The collector's last (cumulative) lost-event counts.
    pub(crate) lost: Lost,
    /// What reading the job's memory and files cost and skipped.
    pub(crate) job_reads: crate::decode::JobReads,
    /// Memory over the whole run, bounded, for charts.
    pub(crate) series: Series,
    /// Records in the file that did not decode: set by the caller from
    /// `recording::Reader::undecodable` once the events are consumed.
    pub(crate) undecodable: u64,
    /// Set by the caller from `recording::Reader::stop`.
    pub(crate) stopped_early: Option<Stop>,
    /// Damaged stretches in the middle that the reader skipped: set by the
    /// caller from `recording::Reader::skipped`.
    pub(crate) skipped: Skipped,
    /// GPU and pinned host memory per process, CUDA OOMs, Xid errors.
    pub(crate) gpu: gpu::GpuReport,
    /// Trends of honest memory, suspected leaks, and time to the limit.
    pub(crate) leaks: LeakReport,
    /// Set when `record --max-size` downsampled older history.
    pub(crate) compaction: Option<crate::decode::Compaction>,
    /// Leaks `record` warned of while the job ran, with when (ns).
    pub(crate) leak_warnings: Vec<(u64, crate::decode::LeakWarning)>,
    /// Growth stacks per process (`record --stacks`; empty without).
    pub stacks: Stacks,
    /// Job threads' stacks at a fatal signal (`record --stacks`).
    pub(crate) death_stacks: death_stacks::Deaths,
    /// What the kernel programs logged (`record --ebpf-log`).
    pub(crate) ebpf_log: EbpfLogReport,
    /// What most likely happened: per kill, surest first, then the run's
    /// own ([`diagnosis::diagnose`]).
    pub(crate) diagnoses: Vec<diagnosis::Diagnosis>,
    /// The job's short-lived helpers, which the text and HTML fold into
    /// one line ([`short_lived::fold`]).
    pub(crate) short_lived: ShortLived,
    /// What an attach recorded and the report left out of the job.
    pub(crate) left_out: LeftOut,
    /// Which recording of the job this is (`report A.rec B.rec`): every
    /// kill, death and process here is on `header.hostname`, in recording
    /// `source.index`.
    pub source: Source,
    /// Each process's rank, run, Slurm step and container, where its
    /// environment or cgroups told ([`Report::identity`]).
    pub(crate) identities: HashMap<ProcKey, identity::Identity>,
}

/// Processes seen but not the job's (`--all`, `--cgroup`): the recorder
/// and the helpers it ran, and kernel threads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LeftOut {
    pub(crate) recorder_pid: Option<u32>,
    /// The recorder's helpers, its own process not counted.
    pub(crate) recorder_helpers: u64,
    pub(crate) kernel_threads: u64,
}

impl Report {
    /// A process's rank, run, Slurm step and container, if any told.
    pub(crate) fn identity(&self, pid: u32, start_ns: u64) -> Option<&identity::Identity> {
        self.identities.get(&ProcKey {
            tgid: pid,
            start_ns,
        })
    }

    /// A process in prose, the same in every part of the report and in
    /// every format: `rank 1 (pid 700)` for a rank's own process (what a
    /// distributed job's logs call it), `pt_data_worker of rank 1 (pid
    /// 701)` for one it started, else `python3 (pid 700)`. Unescaped: the
    /// renderers escape.
    pub(crate) fn who(&self, pid: u32, start_ns: u64, comm: &str) -> String {
        let rank = self
            .identity(pid, start_ns)
            .and_then(|id| Some((id.rank?, id.inherited)));
        super::verdict::who(pid, comm, rank)
    }

    /// A process in a name column beside its pid (a table, a chart's
    /// label, a trace's track): `rank 1` for a rank's own process, else its
    /// comm. Unescaped.
    pub(crate) fn name(&self, pid: u32, start_ns: u64, comm: &str) -> String {
        match self.identity(pid, start_ns) {
            Some(id) if !id.inherited && id.rank.is_some() => {
                format!("rank {}", id.rank.unwrap_or_default())
            }
            _ => comm.to_string(),
        }
    }

    /// Marks each death that followed the job's first OOM kill as its
    /// consequence ([`deaths::consequence`]).
    pub(crate) fn mark_consequences(&mut self) {
        let Some((i, k)) = self.kills.iter().enumerate().find(|(_, k)| k.victim.in_job) else {
            return;
        };
        let after = |d: &deaths::Death| deaths::After {
            kill: i + 1,
            victim: self.who(k.victim.pid, k.victim.start_ns, &k.victim.comm),
            victim_pid: k.victim.pid,
            after_ns: d.ts_ns.saturating_sub(k.ts_ns),
        };
        let born = |d: &deaths::Death| {
            self.processes
                .iter()
                .find(|p| p.pid == d.pid && p.start_ns == d.start_ns)
                .and_then(|p| p.born_ns)
        };
        let marks: Vec<Option<deaths::After>> = self
            .deaths
            .iter()
            .map(|d| {
                deaths::consequence(d.cause, d.code, born(d), d.ts_ns, k.ts_ns).then(|| after(d))
            })
            .collect();
        for (d, m) in self.deaths.iter_mut().zip(marks) {
            d.after = m;
        }
    }

    /// Ends each kill window's cgroup line at the kill with the kernel's own
    /// figure for the job's cgroup (its OOM report's `memory: usage`): the
    /// samples come once a second, and a job that fills its limit within
    /// one was charted at 0 KiB of a limit it had reached.
    pub(crate) fn cgroup_at_kills(&mut self) {
        let job = self.job.as_ref().and_then(|j| j.cgroup.as_deref());
        for w in &mut self.series.windows {
            let Some(k) = self.kills.iter().find(|k| k.ts_ns == w.kill_ns) else {
                continue;
            };
            let (Some(usage), Some(memcg)) = (k.memcg_usage_kb, k.memcg.as_deref()) else {
                continue;
            };
            if job != Some(memcg) || k.constraint != Constraint::Memcg {
                continue;
            }
            if let Some(last) = w.cgroup_usage.last_mut() {
                *last = Some(last.map_or(usage, |v| v.max(usage)));
                w.cgroup_limit_kb = w.cgroup_limit_kb.or(k.memcg_limit_kb);
            }
        }
    }

    /// Gives the charts' lines their names once the identities are known
    /// (they come from the processes' environments, read after the lines
    /// began).
    pub(crate) fn name_lines(&mut self) {
        let mut procs = std::mem::take(&mut self.series.procs);
        for l in &mut procs {
            l.name = self.name(l.pid, l.start_ns, &l.comm);
        }
        self.series.procs = procs;
        let mut windows = std::mem::take(&mut self.series.windows);
        for l in windows.iter_mut().flat_map(|w| w.lines.iter_mut()) {
            l.name = self.name(l.pid, l.start_ns, &l.comm);
        }
        self.series.windows = windows;
    }

    /// Wall-clock ns since the epoch for a monotonic timestamp; `None` when
    /// the header has no clock pair.
    pub(crate) fn realtime_ns(&self, mono_ns: u64) -> Option<u64> {
        (self.header.clock.realtime_ns != 0).then(|| self.header.clock.to_realtime_ns(mono_ns))
    }

    /// What was recorded, for a title: the job's command, or what was
    /// attached to (`Job::title`); empty without a start record.
    pub(crate) fn title(&self) -> String {
        let Some(j) = &self.job else {
            return String::new();
        };
        let root = self
            .processes
            .iter()
            .find(|p| p.pid == j.pid && (j.start_ns == 0 || p.start_ns == j.start_ns));
        j.title(root.map(|p| p.comm.as_str()))
    }

    /// Seconds from the first event to `mono_ns`.
    pub(crate) fn since_start_s(&self, mono_ns: u64) -> f64 {
        ns_to_s(mono_ns.saturating_sub(self.first_ns.unwrap_or(mono_ns)))
    }

    pub(crate) fn duration_ns(&self) -> u64 {
        match (self.first_ns, self.last_ns) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => 0,
        }
    }

    /// Ring-buffer records lost plus records that did not decode, on either
    /// side of the file, plus the driver calls of uncovered GPU windows.
    pub(crate) fn lost_events(&self) -> u64 {
        self.lost
            .total()
            .saturating_add(self.undecodable)
            .saturating_add(self.gpu.lost.window_calls)
    }

    /// A kill's grower's stacks: those recorded up to the kill (and the
    /// drain that follows it).
    pub(crate) fn grower_stacks(&self, kill: &Kill, g: &Grower) -> Vec<GrowthStack> {
        let key = crate::decode::ProcKey {
            tgid: g.pid,
            start_ns: g.start_ns,
        };
        self.stacks
            .of(key, Some(kill.ts_ns.saturating_add(stacks::KILL_SLACK_NS)))
    }

    /// A kill's victim's stacks at death: `Ok(None)` when stacks were
    /// not recorded, `Err` why there are none.
    pub(crate) fn victim_stack_at_death(
        &self,
        kill: &Kill,
    ) -> Result<Option<death_stacks::StackAtDeath>, String> {
        let trigger = if kill.trigger.tgid == kill.victim.pid {
            kill.trigger.pid
        } else {
            0
        };
        self.death_stacks
            .of(kill.victim.key(), trigger, kill.victim.thread_pid)
    }

    /// A process's stacks at death (any fatal signal), its main thread's
    /// first; `None` where none was recorded.
    pub(crate) fn process_stack_at_death(
        &self,
        pid: u32,
        start_ns: u64,
    ) -> Option<death_stacks::StackAtDeath> {
        let key = crate::decode::ProcKey {
            tgid: pid,
            start_ns,
        };
        self.death_stacks.of(key, 0, pid).ok().flatten()
    }

    /// A process's stacks over the whole run.
    pub(crate) fn process_stacks(&self, pid: u32, start_ns: u64) -> Vec<GrowthStack> {
        self.stacks.of(
            crate::decode::ProcKey {
                tgid: pid,
                start_ns,
            },
            None,
        )
    }
}
