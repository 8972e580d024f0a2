//! The collector: what happens to each record off the rings, and the
//! samplers that run beside them (loss counters, pressure, USS/PSS and
//! shared memory), and the flushes that keep the file current.

use std::{
    fs::File,
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::maps::MapData;
use trainbpf_common as common;
use trainbpf_report::{
    decode::{self, ExitStatus, Lost, UserBody},
    recording::Writer,
};

use super::error::{RecordError, io_err};
use crate::record::observe::Observe;
use crate::util::clock::mono_ns;

/// What the collector takes from each record: the job, names to ask for.
mod job_view;
/// Naming what the records point at: cgroups, executables, identities.
mod names;
/// A kill told as it happens: its line, and torchelastic's error file.
mod told;

/// What the recorder keeps while it records: the writer, what it has
/// named already, the job's processes, and the samplers' last readings.
pub(super) struct Collector {
    pub(super) writer: Writer<File>,
    /// The job's memory cgroup, sampled with the pressure: the one made for
    /// `--memory-limit`, or the one an attached job runs in (its limit is
    /// what a leak runs into).
    pub(super) job_memcg: Option<(PathBuf, String, bool)>,
    /// Keeps the file under `--max-size`.
    flight: Option<crate::record::compact::Flight>,
    pub(super) known_cgroups: std::collections::HashSet<u64>,
    known_exes: std::collections::HashSet<u32>,
    last_lost: Lost,
    last_sync: Instant,
    last_pressure: Option<trainbpf_report::decode::samples::Pressure>,
    stall: ([u64; 3], [u64; 3]),
    /// What the job's threads freed inside reclaim or compaction, kB.
    reclaim_freed_kb: u64,
    /// The job's live processes, from the lifecycle records.
    pub(super) job: std::collections::HashSet<u32>,
    /// Processes whose identity is recorded, or inherited from a parent
    /// at a fork seen (`identify`).
    pub(super) identified: std::collections::HashSet<u32>,
    /// Reads who a job process is off the draining thread (`identify`).
    ident: crate::record::samplers::procfs::identity::Reader,
    /// The workers every read of the job's memory and files runs on.
    pub(super) readers: crate::record::samplers::procfs::guard::Readers,
    last_reads: decode::JobReads,
    /// The job's main process, and how it ended as the kernel saw it (for
    /// an attached job, which the recorder cannot wait for).
    pub(super) root: u32,
    pub(super) root_exit: Option<ExitStatus>,
    /// Reads smaps_rollup off the draining thread.
    sampler: crate::record::samplers::smaps::Sampler,
    /// Looks at shared memory and /dev/shm off the draining thread: on a
    /// timer, and when a kill or a fatal signal is seen.
    shm: crate::record::samplers::shm::ShmSampler,
    /// Which processes' maps each look reads, holders of shared memory
    /// first (`observe`).
    pub(super) shm_pick: crate::record::samplers::shm::pick::Picker,
    last_procfs: Instant,
    procfs_every: Duration,
    /// The terminal's status line (live/status.rs).
    pub(super) status: crate::record::live::status::Status,
    /// `--stacks`: the growth stacks' thread (`stacks/thread.rs`), which
    /// names them off this one.
    pub(super) stacks: Option<crate::record::stacks::Stacks>,
    /// Job processes that mapped a driver library not yet probed, most of
    /// them held until it is (`GpuProbes::on_mapped`): taken after each
    /// drain.
    pub(super) gpu_maps: Vec<common::CudaMapEvent>,
    /// torchelastic's agents whose worker's error file is in: continued
    /// if held (`torchelastic::AgentHold`), after the batch.
    pub(super) agents_done: Vec<u32>,
    /// `--metrics` and `--events-jsonl` (live/metrics.rs).
    pub(super) live: Option<crate::record::live::metrics::Outputs>,
    /// The page size in kB, which the memory records are counted in.
    page_kb: u64,
    /// A kill's line, told at the kill (live/kill_line.rs).
    lines: crate::record::live::kill_line::KillLines,
    /// Kills' lines made as their records were read (`told.rs`).
    urgent_lines: Vec<(decode::ProcKey, String)>,
    /// torchelastic's error files of the job's processes
    /// (record/torchelastic.rs); `None` before the recording's path is set.
    pub(super) error_files: Option<crate::record::torchelastic::ErrorFiles>,
}

impl Collector {
    pub(super) fn new(
        writer: Writer<File>,
        job_memcg: Option<(PathBuf, String, bool)>,
        flight: Option<crate::record::compact::Flight>,
        status: crate::record::live::status::Status,
    ) -> Collector {
        let readers = crate::record::samplers::procfs::guard::Readers::new();
        Collector {
            writer,
            job_memcg,
            flight,
            known_cgroups: Default::default(),
            known_exes: Default::default(),
            last_lost: Lost {
                by_kind: vec![0; common::KIND_MAX as usize],
                ..Default::default()
            },
            last_sync: Instant::now(),
            last_pressure: None,
            stall: ([0; 3], [0; 3]),
            reclaim_freed_kb: 0,
            job: Default::default(),
            identified: Default::default(),
            ident: crate::record::samplers::procfs::identity::Reader::start(readers.clone()),
            readers,
            last_reads: Default::default(),
            root: 0,
            root_exit: None,
            sampler: crate::record::samplers::smaps::Sampler::start(),
            shm: crate::record::samplers::shm::ShmSampler::start(),
            shm_pick: Default::default(),
            status,
            last_procfs: Instant::now(),
            procfs_every: PROCFS_EVERY,
            stacks: None,
            gpu_maps: Vec::new(),
            agents_done: Vec::new(),
            live: None,
            lines: Default::default(),
            urgent_lines: Vec::new(),
            error_files: None,
            page_kb: nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
                .ok()
                .flatten()
                .map_or(4, |b| (b as u64 / 1024).max(1)),
        }
    }

    /// Publishes the kills and deaths settled since the last time and the
    /// gauges (`--metrics`, `--events-jsonl`); `last`: the recording ends,
    /// settle everything.
    pub(super) fn live_tick(&mut self, last: bool) {
        if let Some(o) = &mut self.live {
            let now = if last { u64::MAX } else { mono_ns() };
            o.tick(now, self.status.projection_seconds());
        }
    }

    pub(super) fn user(&mut self, body: UserBody) {
        self.lines.on_user(&body);
        if let Some(o) = &mut self.live {
            o.live.on_user(&body);
        }
        let (kind, bytes) = decode::encode_user(mono_ns(), body);
        self.writer.record(kind, &bytes);
    }

    fn on_record(&mut self, bytes: &[u8]) {
        if bytes.len() < size_of::<common::Header>() {
            self.last_lost.undecodable += 1;
            return;
        }
        let kind = u16::from_le_bytes([bytes[0], bytes[1]]);
        if kind == common::KIND_DEATH_STACK {
            self.on_death_stack(bytes);
            return;
        }
        if kind == common::KIND_CUDA_MAP {
            if bytes.len() >= size_of::<common::CudaMapEvent>() {
                // SAFETY: the length is checked; plain old data.
                self.gpu_maps.push(unsafe {
                    std::ptr::read_unaligned(bytes.as_ptr().cast::<common::CudaMapEvent>())
                });
            } else {
                self.last_lost.undecodable += 1;
            }
            return;
        }
        self.writer.record(kind, bytes);
        // Decoded once, for everyone who looks at records as they pass.
        let Ok(t) = decode::decode(kind, bytes, self.page_kb) else {
            return;
        };
        self.before_record(&t);
        let told = self.lines.observe(&t);
        self.status.observe(&t);
        if let Some(o) = &mut self.live {
            o.live.observe(&t);
        }
        if let Some(st) = &mut self.stacks {
            st.observe(&t);
        }
        self.observe(&t);
        if let Some((proc, line)) = told.or_else(|| self.told_urgently(&t)) {
            self.tell_kill(t.ts_ns, proc, line);
        }
    }

    /// A job thread's stacks at a fatal signal: named at once on the
    /// stacks' thread (the process is on its way out) and recorded named;
    /// the kernel's raw record is not kept.
    fn on_death_stack(&mut self, bytes: &[u8]) {
        let (Some(st), true) = (
            self.stacks.as_mut(),
            bytes.len() >= size_of::<common::DeathStack>(),
        ) else {
            self.last_lost.undecodable += 1;
            return;
        };
        // SAFETY: the length is checked; `DeathStack` is plain old data
        // (integers only), so any bytes are a valid value.
        let ev: common::DeathStack =
            unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<common::DeathStack>()) };
        st.death(ev);
    }

    pub(super) fn drain(&mut self, rings: &mut crate::record::rings::Rings) -> usize {
        let n = rings.drain(|bytes, urgent| {
            if urgent {
                self.urgent(bytes);
            } else {
                self.on_record(bytes);
            }
        });
        self.poll_error_files();
        self.poll_identities();
        self.poll_shm();
        self.poll_stacks();
        n
    }

    /// Records what the stacks' thread named since the last time (growth
    /// stacks, stacks at death), each stamped as it made it. Never waits.
    fn poll_stacks(&mut self) {
        let Some(st) = self.stacks.as_mut() else {
            return;
        };
        // The rings are read this far: the stacks' thread may read the
        // kernel's map (its stacks' execs and forks are sent already).
        st.send(crate::record::stacks::Msg::Tick);
        for (ts, body) in st.poll() {
            self.lines.on_user(&body);
            let (kind, bytes) = decode::encode_user(ts, body);
            self.writer.record(kind, &bytes);
        }
    }

    /// At the end: the stacks' last drain, waited for briefly.
    pub(super) fn finish_stacks(&mut self) {
        let Some(st) = self.stacks.as_mut() else {
            return;
        };
        for (ts, body) in st.finish(Duration::from_secs(10)) {
            let (kind, bytes) = decode::encode_user(ts, body);
            self.writer.record(kind, &bytes);
        }
    }

    /// Sums the per-CPU loss counters; writes a record when they moved.
    pub(super) fn poll_lost(
        &mut self,
        counters: &aya::maps::PerCpuArray<MapData, common::Counters>,
    ) {
        let Ok(per_cpu) = counters.get(&0, 0) else {
            return;
        };
        let mut lost = Lost {
            by_kind: vec![0; common::KIND_MAX as usize],
            undecodable: self.last_lost.undecodable,
            dropped_disk_full: self.writer.dropped_records(),
            ..Default::default()
        };
        let mut stall = ([0u64; 3], [0u64; 3]);
        let mut reclaim_pages = 0u64;
        for c in per_cpu.iter() {
            reclaim_pages = reclaim_pages.saturating_add(c.reclaim_freed_pages);
            for (i, v) in c.lost.iter().enumerate() {
                lost.by_kind[i] += v;
            }
            lost.proc_map_full += c.proc_map_full;
            lost.job_map_full += c.job_map_full;
            lost.other_map_full += c.other_map_full;
            lost.stack_map_full += c.stack_map_full;
            lost.stack_errors += c.stack_errors;
            lost.stack_copies_lost += c.stack_copies_lost;
            for i in 0..3 {
                stall.0[i] += c.stall_ns[i];
                stall.1[i] += c.stall_count[i];
            }
        }
        self.stall = stall;
        let page_kb = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096) as u64
            / 1024;
        self.reclaim_freed_kb = reclaim_pages.saturating_mul(page_kb);
        if lost != self.last_lost {
            self.last_lost = lost.clone();
            self.user(UserBody::Lost(lost));
        }
        let reads = crate::record::samplers::procfs::guard::STATS.snapshot();
        if reads != self.last_reads {
            self.last_reads = reads.clone();
            self.user(UserBody::JobReads(reads));
        }
    }

    /// Records a finished shared-memory look, stamped when it began, and
    /// asks for the next when it is time (`samplers/shm.rs`). Never waits.
    fn poll_shm(&mut self) {
        let (job, pick) = (&self.job, &mut self.shm_pick);
        let done = self.shm.tick(|| shm_pids(job, pick));
        if let Some(d) = done {
            let (kind, bytes) = decode::encode_user(d.ts_ns, UserBody::ShmLook(d.look));
            self.writer.record(kind, &bytes);
        }
    }

    /// At the end: the shared-memory look still in flight or due (a bus
    /// error just before the job ended), waited for briefly.
    pub(super) fn finish_shm(&mut self) {
        let (job, pick) = (&self.job, &mut self.shm_pick);
        for d in self
            .shm
            .finish(Duration::from_secs(1), || shm_pids(job, pick))
        {
            let (kind, bytes) = decode::encode_user(d.ts_ns, UserBody::ShmLook(d.look));
            self.writer.record(kind, &bytes);
        }
    }

    /// Every few seconds: USS/PSS of the job's processes (the kernel walks
    /// their page tables for it, so what it cost is recorded too). The
    /// reads run on the sampler's thread: a big job's take seconds, and the
    /// rings must not wait.
    pub(super) fn poll_procfs(&mut self) {
        if let Some(done) = self.sampler.poll() {
            // smaps_rollup walks page tables: about 50 ms per resident GiB.
            // Keep it to a quarter of 1% of a core by sampling less often as
            // the job grows, as the shared-memory looks are: the recorder's
            // whole budget on a busy node is 1%.
            self.procfs_every = PROCFS_EVERY.max(done.cost * SMAPS_COST_TIMES);
            if !done.procs.is_empty() {
                let cost_us = done.cost.as_micros() as u64;
                self.user(UserBody::Smaps(decode::SmapsSample {
                    procs: done.procs,
                    cost_us,
                }));
            }
        }
        if self.last_procfs.elapsed() < self.procfs_every {
            return;
        }
        // Forget processes that are gone without an exit record (lost): a
        // zombie stays until it is reaped, and its read comes back empty.
        self.job
            .retain(|&t| crate::record::samplers::procfs::exists(t));
        let pids = self.job.iter().take(MAX_SMAPS_PER_ROUND).copied().collect();
        if self.sampler.request(pids) {
            self.last_procfs = Instant::now();
        }
    }

    /// Samples memory pressure (and the job's memory cgroup); records it
    /// when it moved.
    pub(super) fn poll_pressure(&mut self) {
        let mut p = crate::record::samplers::pressure::sample(
            self.job_memcg
                .as_ref()
                .map(|(dir, _, v2)| (dir.as_path(), *v2)),
        );
        (p.stall_ns, p.stall_count) = self.stall;
        p.reclaim_freed_kb = self.reclaim_freed_kb;
        self.status.on_pressure(mono_ns(), &p);
        if self
            .last_pressure
            .as_ref()
            .is_none_or(|last| crate::record::samplers::pressure::moved(last, &p))
        {
            self.last_pressure = Some(p.clone());
            self.user(UserBody::Pressure(Box::new(p)));
        }
    }

    pub(super) fn flush(&mut self) -> Result<(), RecordError> {
        // A full disk is not an error: the writer holds the frames in
        // memory, within a bound, and says so (docs/recording-format.md).
        self.writer
            .flush()
            .map_err(io_err("writing the recording"))?;
        self.tell_writer_notices();
        if let Some(f) = &mut self.flight {
            let said = f.poll(&mut self.writer, mono_ns());
            self.tell(said);
        }
        // write() already survives a SIGKILL of the recorder; fdatasync now
        // and then bounds what a power loss can take.
        if self.last_sync.elapsed() > Duration::from_secs(10) && self.writer.held_bytes() == 0 {
            let _ = self.writer.get_ref().sync_data();
            self.last_sync = Instant::now();
        }
        Ok(())
    }

    /// Redraws the status line and warns of leaks suspected since the last
    /// time: on stderr, and in the recording, so that the report can show
    /// the warning came before the kill.
    pub(super) fn leak_warnings(&mut self) {
        let warnings = self.status.tick();
        if warnings.is_empty() {
            return;
        }
        self.status.clear();
        let now = mono_ns();
        for w in warnings {
            eprintln!(
                "trainbpf: warning: {}",
                trainbpf_report::render::text::warning_text(&w, now)
            );
            self.user(UserBody::LeakWarning(w));
        }
    }

    /// What the kernel programs logged since the last time
    /// (`--ebpf-log`): into the recording, and on stderr with the program
    /// that logged it.
    pub(super) fn kernel_log(&mut self, log: Option<&mut crate::loader::KernelLog>) {
        let Some(log) = log else { return };
        let lines = log.drain();
        if lines.is_empty() {
            return;
        }
        self.status.clear();
        for l in lines {
            // The programs wrote these from kernel memory: escaped.
            eprintln!(
                "trainbpf: kernel {} {}: {}",
                trainbpf_report::term::escape(&l.program),
                trainbpf_report::term::escape(&l.level),
                trainbpf_report::term::escape(&l.message)
            );
            self.user(UserBody::EbpfLog(l));
        }
    }

    /// Compaction's news, on their own lines under the status line.
    fn tell(&mut self, lines: Vec<String>) {
        if lines.is_empty() {
            return;
        }
        self.status.clear();
        for l in lines {
            eprintln!("trainbpf: {l}");
        }
    }

    fn tell_writer_notices(&mut self) {
        for n in self.writer.take_notices() {
            match n {
                trainbpf_report::recording::Notice::Resumed { .. } => eprintln!("trainbpf: {n}"),
                _ => eprintln!("trainbpf: warning: {n}"),
            }
        }
    }

    /// The last flush: frames still held for a full disk get one more try,
    /// and what could not be written is said.
    pub(super) fn finish(&mut self) -> Result<(), RecordError> {
        self.writer
            .flush_now()
            .map_err(io_err("writing the recording"))?;
        self.tell_writer_notices();
        if let Some(f) = &mut self.flight {
            let said = f.finish(&mut self.writer, mono_ns());
            self.tell(said);
        }
        let held = self.writer.held_bytes();
        if held > 0 {
            eprintln!(
                "trainbpf: warning: the disk is still full: {:.1} MiB of events held in memory were not written; the recording ends cleanly after byte {}, and `trainbpf report` reads it up to there",
                held as f64 / (1 << 20) as f64,
                self.writer.bytes_written()
            );
        }
        Ok(())
    }
}

/// Memory cgroups named from memory records (OOM records always are):
/// each new one walks the hierarchy once.
const MAX_NAMED_CGROUPS: usize = 256;
/// Frame buffer size that forces a flush before the timer: bounds the
/// recorder's memory in a burst.
pub(super) const FLUSH_BYTES: usize = 256 << 10;
/// How often USS/PSS and shared memory are sampled.
const PROCFS_EVERY: Duration = Duration::from_secs(5);
/// The USS/PSS rounds' interval, in times what the last one cost.
const SMAPS_COST_TIMES: u32 = 400;
/// Bounds on the collector's own bookkeeping of the job's processes.
const MAX_JOB_PROCS: usize = 65536;
const MAX_SMAPS_PER_ROUND: usize = 512;
/// Signals that end a process unless it handles them, and that programs
/// do not send each other by the thousand (SIGUSR1, SIGALRM and real-time
/// signals do not bring a shared-memory look forward).
const ENDING_SIGNALS: [u32; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 15, 24, 25, 31];
/// Job processes whose /dev/shm one shared-memory look finds.
const MAX_SHM_PIDS: usize = 4096;

/// The job's processes for a shared-memory look, and the slice of them
/// whose maps and descriptors it reads.
fn shm_pids(
    job: &std::collections::HashSet<u32>,
    pick: &mut crate::record::samplers::shm::pick::Picker,
) -> crate::record::samplers::shm::Pids {
    use crate::record::samplers::shm::{Pids, pick::MAX_SCAN};
    Pids {
        job: job.iter().take(MAX_SHM_PIDS).copied().collect(),
        scan: pick.pick(job, MAX_SCAN),
    }
}
