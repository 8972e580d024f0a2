//! `trainbpf record`: load the probes, run the job, stream the ring buffer
//! into the recording until the job ends.
//!
//! The recorder is the one witness that must survive the kill, so it
//! protects itself: `oom_score_adj` -1000, a fixed-size ring buffer, a frame
//! buffer flushed at least every second (a SIGKILL loses at most that), and a
//! file the job's user owns, mode 0600.

use std::{
    ffi::OsString,
    fs::{self, File},
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aya::maps::MapData;
use nix::sys::{
    signal::{SigSet, SigmaskHow, Signal},
    signalfd::{SfdFlags, SignalFd},
};
use tokio::io::unix::AsyncFd;
use trainbpf_common as common;

use crate::{
    decode::{self, CgroupName, ExitStatus, JobExit, JobStart, Lost, UserBody},
    job::{self, Invoker, MemCgroup},
    loader::{self, Loaded, Tunables},
    recording::{ClockPair, RecordConfig, RecordingHeader, Writer},
    safe_file::{self, Place},
};

pub struct RecordOptions {
    pub output: PathBuf,
    pub memory_limit: Option<u64>,
    pub tunables: Tunables,
    pub target: Target,
    /// No status line on the terminal.
    pub quiet: bool,
    /// What the status line calls a leak.
    pub leaks: crate::model::LeakOptions,
    /// Keep the recording under a size (`--max-size`); `None`: unbounded.
    pub flight: Option<crate::compact::FlightOptions>,
}

/// What to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Run this command as the job.
    Run(Vec<OsString>),
    /// Attach to a running process and its descendants, born later too.
    Pid(u32),
    /// Everything in a cgroup (a container, a Slurm or systemd job).
    Cgroup(PathBuf),
    /// The whole machine.
    All,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The recorder lacks a capability it needs.
    #[error(
        "trainbpf record needs {missing} to load its eBPF programs and run the job; run it with sudo: sudo trainbpf record -- CMD"
    )]
    Privileges { missing: String },
    /// Loading or attaching the probes failed.
    #[error(transparent)]
    Load(#[from] loader::LoadError),
    /// Starting or containing the job failed.
    #[error(transparent)]
    Job(#[from] job::JobError),
    /// The recording could not be created safely (src/safe_file.rs).
    #[error(transparent)]
    File(#[from] safe_file::FileError),
    /// `--pid`, `--cgroup` or `--all` reaches what the invoker may not see.
    #[error(transparent)]
    Attach(#[from] crate::attach::AttachError),
    /// The recording file could not be written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> RecordError {
    let what = what.into();
    move |source| RecordError::Io { what, source }
}

/// What the caller needs after the job ended.
pub struct Outcome {
    /// The job's status; None after detaching from an attached job.
    pub status: Option<ExitStatus>,
    pub output: PathBuf,
    /// The recorder attached to a job it did not start.
    pub attached: bool,
    /// The recording as written, read back for the verdict through this
    /// descriptor: the path may name something else by now.
    pub recording: File,
}

impl Outcome {
    /// The job's own status, 128+N when it died of signal N, like a shell;
    /// 0 for an attached job, whose status is not the recorder's to pass on.
    pub fn exit_code(&self) -> i32 {
        match (self.attached, self.status) {
            (true, _) | (false, None) => 0,
            (false, Some(ExitStatus::Code(c))) => c,
            (false, Some(ExitStatus::Signal(s))) => 128 + s,
        }
    }
}

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const CAP_SETUID: u32 = 7;
const CAP_SETGID: u32 = 6;

/// Effective capability set, from /proc/self/status.
fn effective_caps() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Names the capabilities that are missing, or None when all are there.
pub fn missing_capabilities(caps: u64, invoker: &Invoker, euid: u32) -> Option<String> {
    let has = |c: u32| caps & (1 << c) != 0;
    let mut missing = Vec::new();
    if !has(CAP_SYS_ADMIN) {
        if !has(CAP_BPF) {
            missing.push("CAP_BPF");
        }
        if !has(CAP_PERFMON) {
            missing.push("CAP_PERFMON");
        }
        if !missing.is_empty() {
            missing.push("(or CAP_SYS_ADMIN)");
        }
    }
    if invoker.uid != euid && !has(CAP_SETUID) {
        missing.push("CAP_SETUID");
    }
    if invoker.uid != euid && !has(CAP_SETGID) {
        missing.push("CAP_SETGID");
    }
    (!missing.is_empty()).then(|| missing.join(", "))
}

fn now(clock: nix::time::ClockId) -> u64 {
    nix::time::clock_gettime(clock)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

fn mono_ns() -> u64 {
    now(nix::time::ClockId::CLOCK_MONOTONIC)
}

/// Sets our own oom_score_adj to -1000 and returns the old value, which the
/// job gets back, and, when that failed, why, for the recording's header
/// (the report then says the recorder was not protected).
fn protect_from_oom_killer() -> (i32, Option<crate::recording::Fallback>) {
    let old = fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    match fs::write("/proc/self/oom_score_adj", "-1000") {
        Ok(()) => (old, None),
        Err(e) => {
            let reason = format!(
                "{e}; lowering it needs CAP_SYS_RESOURCE (run outside a container that drops it, or grant it), so the OOM killer may pick the recorder"
            );
            eprintln!(
                "trainbpf: warning: could not set the recorder's oom_score_adj to -1000 ({reason})"
            );
            let f = crate::recording::Fallback {
                probe: "oom_score_adj -1000 (the recorder's OOM protection)".into(),
                reason,
            };
            (old, Some(f))
        }
    }
}

/// The recording: created new as the invoking user, locked, never through
/// a link or over someone's file (src/safe_file.rs).
fn open_output(path: &Path, invoker: &Invoker) -> Result<(File, Place), RecordError> {
    let created = safe_file::create_recording(path, invoker.into())?;
    if let Some(old) = &created.moved_aside {
        eprintln!(
            "trainbpf: moved the earlier {} aside to {}",
            path.display(),
            old.display()
        );
    }
    Ok((created.file, created.place))
}

pub fn run(mut opts: RecordOptions) -> Result<Outcome, RecordError> {
    let invoker = Invoker::detect()?;
    let euid = nix::unistd::Uid::effective().as_raw();
    if let Some(missing) = missing_capabilities(effective_caps(), &invoker, euid) {
        return Err(RecordError::Privileges { missing });
    }
    // Before anything is loaded or written: an attach the invoker may not
    // make leaves no recording behind.
    let watcher = crate::attach::Watcher::new(&invoker);
    let cgroup_dir = match &opts.target {
        Target::All => {
            watcher.all()?;
            None
        }
        Target::Pid(p) => {
            watcher.pid(*p)?;
            None
        }
        Target::Cgroup(dir) => {
            let cg = crate::attach::CgroupDir::open(dir)?;
            watcher.cgroup(&cg)?;
            opts.target = Target::Cgroup(cg.path.clone());
            Some(cg)
        }
        Target::Run(_) => None,
    };
    // Read SIGINT/SIGTERM from a signalfd so that we see who sent them;
    // blocked first of all, so that a Ctrl-C while the probes load is read
    // later rather than killing the recorder half set up.
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        mask.add(s);
    }
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None)
        .map_err(|e| io_err("sigprocmask")(e.into()))?;
    let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| io_err("signalfd")(e.into()))?;

    let (job_adj, unprotected) = protect_from_oom_killer();
    // Orphaned workers re-parent to us rather than to init, so they stay
    // visible as the job's until they exit.
    // SAFETY: prctl with integer arguments only.
    if unsafe { nix::libc::prctl(nix::libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        eprintln!(
            "trainbpf: warning: could not become the job's subreaper: orphaned workers re-parent to init"
        );
    }
    let page_size = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;

    let loaded = loader::load(&opts.tunables, page_size)?;
    let machine = crate::pressure::sample(None);
    let uts = nix::sys::utsname::uname().ok();
    let header = RecordingHeader {
        trainbpf_version: env!("CARGO_PKG_VERSION").into(),
        kernel: uts
            .as_ref()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        hostname: uts
            .as_ref()
            .map(|u| u.nodename().to_string_lossy().into_owned())
            .unwrap_or_default(),
        page_size,
        mem_total_kb: machine.mem_total_kb,
        swap_total_kb: machine.swap_total_kb,
        clock: ClockPair {
            monotonic_ns: mono_ns(),
            realtime_ns: now(nix::time::ClockId::CLOCK_REALTIME),
        },
        attach: loaded.attach.clone(),
        fallbacks: loaded
            .fallbacks
            .iter()
            .cloned()
            .chain(unprotected)
            .collect(),
        config: RecordConfig {
            rss_threshold_bytes: opts.tunables.rss_threshold_bytes,
            rss_relative_shift: opts.tunables.rss_relative_shift,
            heartbeat_ms: opts.tunables.heartbeat_ms,
            ring_bytes: opts.tunables.ring_bytes as u64,
        },
    };
    let (file, place) = open_output(&opts.output, &invoker)?;
    let writer = Writer::new(file, &header).map_err(|e| RecordError::Io {
        what: format!("writing {}", opts.output.display()),
        source: io::Error::other(e.to_string()),
    })?;
    eprintln!(
        "trainbpf: recording to {}; {}",
        opts.output.display(),
        loader::describe(&loaded.attach, &loaded.fallbacks)
    );

    let cgroup = match opts.memory_limit {
        Some(limit) => Some(MemCgroup::create(limit)?),
        None => None,
    };

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_err("starting the runtime"))?;
    let attached = !matches!(opts.target, Target::Run(_));
    let (status, recording) = rt.block_on(collect(
        loaded,
        writer,
        opts.target,
        Attached {
            watcher,
            cgroup: cgroup_dir,
        },
        invoker,
        job_adj,
        cgroup.as_ref(),
        sigfd,
        crate::status::Status::new(opts.quiet, opts.leaks.clone()),
        opts.flight
            .map(|f| crate::compact::Flight::new(place.clone(), f)),
    ))?;
    if !place.still_names(&recording) {
        eprintln!(
            "trainbpf: warning: {} no longer names this recording (moved or replaced while recording); the verdict is read from what the recorder wrote",
            opts.output.display()
        );
    }
    if let Some(cg) = cgroup
        && let Err(e) = cg.remove()
    {
        eprintln!("trainbpf: warning: {e}");
    }
    Ok(Outcome {
        status,
        output: opts.output,
        attached,
        recording,
    })
}

struct Collector {
    writer: Writer<File>,
    /// The job's memory cgroup, sampled with the pressure: the one made for
    /// `--memory-limit`, or the one an attached job runs in (its limit is
    /// what a leak runs into).
    job_memcg: Option<(PathBuf, String, bool)>,
    /// Keeps the file under `--max-size`.
    flight: Option<crate::compact::Flight>,
    known_cgroups: std::collections::HashSet<u64>,
    known_exes: std::collections::HashSet<u32>,
    last_lost: Lost,
    last_sync: Instant,
    last_pressure: Option<crate::pressure::Pressure>,
    stall: ([u64; 3], [u64; 3]),
    /// What the job's threads freed inside reclaim or compaction, kB.
    reclaim_freed_kb: u64,
    /// The job's live processes, from the lifecycle records.
    job: std::collections::HashSet<u32>,
    /// The job's main process, and how it ended as the kernel saw it (for
    /// an attached job, which the recorder cannot wait for).
    root: u32,
    root_exit: Option<ExitStatus>,
    /// Reads smaps_rollup and shared memory off the draining thread.
    sampler: crate::sampler::Sampler,
    last_procfs: Instant,
    procfs_every: Duration,
    /// The terminal's status line (src/status.rs).
    status: crate::status::Status,
}

impl Collector {
    fn user(&mut self, body: UserBody) {
        let (kind, bytes) = decode::encode_user(mono_ns(), body);
        self.writer.record(kind, &bytes);
    }

    /// Names a cgroup id once, while the directory still exists.
    fn name_cgroup(&mut self, id: u64) {
        if id == 0 || !self.known_cgroups.insert(id) {
            return;
        }
        if let Some(path) = job::cgroup_path_by_id(id) {
            self.user(UserBody::Cgroup(CgroupName { id, path }));
        }
    }

    /// Names a signal sender's executable now: it may be gone by report
    /// time. Once per process.
    fn name_exe(&mut self, tgid: u32) {
        if tgid == 0 || !self.known_exes.insert(tgid) {
            return;
        }
        let exe = fs::read_link(format!("/proc/{tgid}/exe"))
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let uid = fs::read_to_string(format!("/proc/{tgid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
            });
        self.user(UserBody::Exe(decode::ExeName { tgid, exe, uid }));
    }

    fn on_record(&mut self, bytes: &[u8]) {
        if bytes.len() < size_of::<common::Header>() {
            self.last_lost.undecodable += 1;
            return;
        }
        let kind = u16::from_le_bytes([bytes[0], bytes[1]]);
        self.writer.record(kind, bytes);
        self.status.on_record(kind, bytes);
        match kind {
            common::KIND_FORK | common::KIND_EXEC => {
                let tgid = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
                if self.job.len() < MAX_JOB_PROCS {
                    self.job.insert(tgid);
                }
                // Command line and torchrun rank, for grouping; read now,
                // while the process exists (a worker may live a second).
                if let Some(info) = crate::procfs::proc_info(tgid) {
                    self.user(UserBody::ProcInfo(info));
                }
            }
            common::KIND_EXIT => {
                let tgid = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
                self.job.remove(&tgid);
                if tgid == self.root
                    && let Ok(decode::Timed {
                        event: decode::Event::Exit { exit_code, .. },
                        ..
                    }) = decode::decode(kind, bytes, 4)
                {
                    self.root_exit = Some(crate::model::wait_status(exit_code));
                }
            }
            _ => {}
        }
        if kind == common::KIND_SIGNAL
            && let Ok(decode::Timed {
                event: decode::Event::Signal(s),
                ..
            }) = decode::decode(kind, bytes, 4)
        {
            self.name_exe(s.sender.tgid);
        }
        // Every memory cgroup a process allocates in is named once (a
        // bounded few): a memcg OOM's growers are those charged to it.
        if kind == common::KIND_MEM
            && self.known_cgroups.len() < MAX_NAMED_CGROUPS
            && let Ok(decode::Timed {
                event: decode::Event::Mem { memcg_id, .. },
                ..
            }) = decode::decode(kind, bytes, 4)
        {
            self.name_cgroup(memcg_id);
        }
        if (kind == common::KIND_OOM_VICTIM || kind == common::KIND_OOM_KILL)
            && let Ok(decode::Timed {
                event: decode::Event::Oom(r),
                ..
            }) = decode::decode(kind, bytes, 4)
        {
            self.name_cgroup(r.memcg_id);
            if let Some(oc) = r.oc {
                self.name_cgroup(oc.memcg_id);
            }
        }
    }

    fn drain(&mut self, rings: &mut crate::rings::Rings) -> usize {
        rings.drain(|bytes| self.on_record(bytes))
    }

    /// Sums the per-CPU loss counters; writes a record when they moved.
    fn poll_lost(&mut self, counters: &aya::maps::PerCpuArray<MapData, common::Counters>) {
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
    }

    /// Every few seconds: USS/PSS of the job's processes (the kernel walks
    /// their page tables for it, so what it cost is recorded too) and the
    /// shared-memory objects, each once. The reads run on the sampler's
    /// thread: a big job's take seconds, and the rings must not wait.
    fn poll_procfs(&mut self) {
        if let Some(done) = self.sampler.poll() {
            // smaps_rollup walks page tables: about 50 ms per resident GiB.
            // Keep it to 1% of a core by sampling less often as the job
            // grows.
            self.procfs_every = PROCFS_EVERY.max(done.cost * 100);
            if !done.procs.is_empty() {
                let cost_us = done.cost.as_micros() as u64;
                self.user(UserBody::Smaps(decode::SmapsSample {
                    procs: done.procs,
                    cost_us,
                }));
            }
            if !done.shm.is_empty() {
                self.user(UserBody::Shm(done.shm));
            }
        }
        if self.last_procfs.elapsed() < self.procfs_every {
            return;
        }
        // Forget processes that are gone without an exit record (lost).
        self.job.retain(|&t| crate::procfs::alive(t));
        let pids = self.job.iter().take(MAX_SMAPS_PER_ROUND).copied().collect();
        if self.sampler.request(pids) {
            self.last_procfs = Instant::now();
        }
    }

    /// Samples memory pressure (and the job's memory cgroup); records it
    /// when it moved.
    fn poll_pressure(&mut self) {
        let mut p = crate::pressure::sample(
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
            .is_none_or(|last| p.moved_from(last))
        {
            self.last_pressure = Some(p.clone());
            self.user(UserBody::Pressure(Box::new(p)));
        }
    }

    fn flush(&mut self) -> Result<(), RecordError> {
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
    fn leak_warnings(&mut self) {
        let warnings = self.status.tick();
        if warnings.is_empty() {
            return;
        }
        self.status.clear();
        let now = mono_ns();
        for w in warnings {
            eprintln!(
                "trainbpf: warning: {}",
                crate::status::warning_text(&w, now)
            );
            self.user(UserBody::LeakWarning(w));
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
                crate::recording::Notice::Resumed { .. } => eprintln!("trainbpf: {n}"),
                _ => eprintln!("trainbpf: warning: {n}"),
            }
        }
    }

    /// The last flush: frames still held for a full disk get one more try,
    /// and what could not be written is said.
    fn finish(&mut self) -> Result<(), RecordError> {
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
const FLUSH_BYTES: usize = 256 << 10;
/// How often USS/PSS and shared memory are sampled.
const PROCFS_EVERY: Duration = Duration::from_secs(5);
/// Bounds on the collector's own bookkeeping of the job's processes.
const MAX_JOB_PROCS: usize = 65536;
const MAX_SMAPS_PER_ROUND: usize = 512;

#[allow(
    clippy::too_many_arguments,
    reason = "each is a different part the collector owns; a struct of them would only rename the list"
)]
async fn collect(
    loaded: Loaded,
    writer: Writer<File>,
    target: Target,
    attached: Attached,
    invoker: Invoker,
    job_adj: i32,
    cgroup: Option<&MemCgroup>,
    sigfd: SignalFd,
    status: crate::status::Status,
    flight: Option<crate::compact::Flight>,
) -> Result<(Option<ExitStatus>, File), RecordError> {
    let Loaded {
        mut ebpf,
        events,
        precious,
        counters,
        mut job,
        attach,
        ..
    } = loaded;
    let job_memcg = match (&target, cgroup) {
        (_, Some(cg)) => Some((cg.dir.clone(), cg.rel.clone(), cg.v2)),
        (Target::Pid(p), None) => job::memcg_of_pid(*p),
        (Target::Cgroup(dir), None) => job::memcg_of_dir(dir),
        _ => None,
    };
    let mut c = Collector {
        writer,
        job_memcg: job_memcg.clone(),
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
        root: 0,
        root_exit: None,
        sampler: crate::sampler::Sampler::start(),
        status,
        last_procfs: Instant::now(),
        procfs_every: PROCFS_EVERY,
    };
    let mut rings =
        crate::rings::Rings::new(events, precious).map_err(io_err("polling the ring buffers"))?;
    // SAFETY: the fd is owned by the value moved in, and stays open until
    // the AsyncFd (and its registration) is dropped.
    let sigfd = unsafe { AsyncFd::register_with_interest(sigfd, tokio::io::Interest::READABLE) }
        .map_err(|e| io_err("polling the signalfd")(e.into()))?;

    // The GPU probes go on before the job starts, so that a libcuda it loads
    // from a known place is probed from its first call.
    let (mut gpu, records) =
        crate::gpu::GpuProbes::start(&mut ebpf, attach.printk.is_some(), mono_ns());
    for (kind, bytes) in records {
        c.writer.record(kind, &bytes);
    }
    eprintln!("trainbpf: {}", gpu.describe());

    let seed = |job: &mut aya::maps::HashMap<MapData, u32, u32>, pid: u32| {
        job.insert(pid, 1, 0).map_err(|e| RecordError::Io {
            what: "adding the job to the kernel's job map".into(),
            source: io::Error::other(e.to_string()),
        })
    };
    let (pid, argv, pending) = match &target {
        Target::Run(argv) => {
            let pending = job::spawn(argv, job_adj)?;
            seed(&mut job, pending.pid)?;
            (pending.pid, argv.clone(), Some(pending))
        }
        Target::Pid(p) => {
            // The process and every descendant alive now; the kernel adds
            // those born from here on.
            for t in crate::procfs::descendants(*p) {
                if !attached.watcher.may_watch(t) {
                    continue;
                }
                seed(&mut job, t)?;
                c.job.insert(t);
                if let Some(info) = crate::procfs::proc_info(t) {
                    c.user(UserBody::ProcInfo(info));
                }
            }
            let argv = crate::procfs::proc_info(*p)
                .map(|i| i.cmdline.into_iter().map(OsString::from).collect())
                .unwrap_or_default();
            (*p, argv, None)
        }
        Target::Cgroup(_) => {
            for t in attached.procs() {
                seed(&mut job, t)?;
                c.job.insert(t);
            }
            (0, Vec::new(), None)
        }
        Target::All => (0, Vec::new(), None),
    };
    if let Some(cg) = cgroup {
        cg.add(pid)?;
        c.known_cgroups.insert(cg.id());
        let (id, path) = (cg.id(), cg.rel.clone());
        c.user(UserBody::Cgroup(CgroupName { id, path }));
    }
    c.poll_pressure();
    c.user(UserBody::JobStart(JobStart {
        pid,
        // The kernel's start time isn't visible from here; the report
        // matches the root by pid from this record on.
        start_ns: 0,
        argv: argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default(),
        uid: invoker.uid,
        gid: invoker.gid,
        cgroup: match (&target, &job_memcg) {
            (_, Some((_, rel, _))) => Some(rel.clone()),
            (Target::Cgroup(dir), None) => Some(dir.display().to_string()),
            _ => None,
        },
        memory_limit_bytes: job_memcg.as_ref().and_then(|(dir, _, v2)| {
            let f = if *v2 {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            };
            fs::read_to_string(dir.join(f)).ok()?.trim().parse().ok()
        }),
        attached: match &target {
            Target::Run(_) => None,
            Target::Pid(_) => Some("pid".into()),
            Target::Cgroup(_) => Some("cgroup".into()),
            Target::All => Some("all".into()),
        },
    }));
    if pid != 0 {
        c.job.insert(pid);
        c.root = pid;
    }
    c.flush()?;
    if !matches!(target, Target::Run(_)) {
        eprintln!("trainbpf: attached; Ctrl-C detaches and leaves the job running");
    }
    let mut child = match pending {
        Some(p) => Some(p.release()?),
        None => None,
    };

    // The kernel programs submit routine records without waking us (a
    // wake-up per record cost the job a context switch each): this tick
    // drains them, so a record waits 50 ms at most; a quarter-full ring or
    // an OOM record wakes us at once.
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_flush = Instant::now();
    // Set once someone asked the job to stop (Ctrl-C, kill, systemd): the
    // recorder then does not wait for orphaned workers to finish too.
    let mut stopping = false;
    let status = loop {
        tokio::select! {
            r = rings.readable() => {
                r.map_err(io_err("ring buffer"))?;
                c.drain(&mut rings);
                if c.writer.pending() > FLUSH_BYTES {
                    c.flush()?;
                    last_flush = Instant::now();
                }
            }
            _ = tick.tick() => {
                c.drain(&mut rings);
                c.poll_lost(&counters);
                reap_orphans(Some(pid));
                if attached_done(&target, &c.job) {
                    break c.root_exit;
                }
                if last_flush.elapsed() >= Duration::from_secs(1) || c.writer.pending() > FLUSH_BYTES {
                    // Processes moved into the cgroup later (docker exec, a
                    // new unit process) join the job here; their children
                    // join in the kernel, at fork.
                    for t in attached.procs() {
                        if c.job.insert(t) {
                            seed(&mut job, t)?;
                        }
                    }
                    c.poll_pressure();
                    c.leak_warnings();
                    c.poll_procfs();
                    for (kind, bytes) in gpu.tick(&mut ebpf, &job, mono_ns()) {
                        c.writer.record(kind, &bytes);
                    }
                    c.flush()?;
                    last_flush = Instant::now();
                }
            }
            guard = sigfd.readable() => {
                let mut guard = guard.map_err(io_err("signalfd"))?;
                let mut detach = false;
                while let Ok(Some(info)) = guard.get_inner().read_signal() {
                    // Who really sent it is written first: the kernel's
                    // record of the kill passed on names the recorder.
                    let fwd = child.is_some() && crate::forward::should_forward(&info);
                    c.user(UserBody::SignalReceived(crate::forward::received(
                        &info,
                        fwd.then_some(pid),
                    )));
                    if fwd {
                        crate::forward::forward(pid, &info);
                    } else if child.is_none() {
                        detach = true;
                    }
                    stopping = true;
                }
                guard.clear_ready();
                if detach {
                    eprintln!("trainbpf: detached; the job runs on");
                    break None;
                }
            }
            st = wait_child(&mut child) => {
                let st = st.map_err(io_err("waiting for the job"))?;
                use std::os::unix::process::ExitStatusExt;
                break Some(match (st.code(), st.signal()) {
                    (Some(code), _) => ExitStatus::Code(code),
                    (None, Some(sig)) => ExitStatus::Signal(sig),
                    _ => ExitStatus::Code(-1),
                });
            }
        }
    };
    c.status.clear();
    // Exits of the last workers and the kill's log lines trail the main
    // process's exit by a little: keep reading briefly.
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        c.drain(&mut rings);
        reap_orphans(None);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Workers orphaned by the main process's death are still the job: the
    // recorder is their subreaper and records them until they exit.
    c.job.remove(&pid);
    c.job.retain(|&t| crate::procfs::alive(t));
    if child.is_none() {
        // Attached: nothing of the job is the recorder's to wait for.
    } else if stopping && !c.job.is_empty() {
        eprintln!(
            "trainbpf: asked to stop; {} job processes run on unrecorded",
            c.job.len()
        );
    } else if !c.job.is_empty() {
        eprintln!(
            "trainbpf: the job's main process ended; recording its {} remaining processes until they exit (Ctrl-C to stop)",
            c.job.len()
        );
        let mut last_flush = Instant::now();
        'orphans: loop {
            tokio::select! {
                _ = tick.tick() => {
                    c.drain(&mut rings);
                    c.poll_lost(&counters);
                    reap_orphans(None);
                    c.job.retain(|&t| crate::procfs::alive(t));
                    if c.job.is_empty() {
                        break 'orphans;
                    }
                    if last_flush.elapsed() >= Duration::from_secs(1) {
                        c.poll_pressure();
                        c.poll_procfs();
                        for (kind, bytes) in gpu.tick(&mut ebpf, &job, mono_ns()) {
                            c.writer.record(kind, &bytes);
                        }
                        c.flush()?;
                        last_flush = Instant::now();
                    }
                }
                guard = sigfd.readable() => {
                    let mut guard = guard.map_err(io_err("signalfd"))?;
                    let info = guard.get_inner().read_signal();
                    guard.clear_ready();
                    let stop = matches!(info, Ok(Some(_)));
                    if let Ok(Some(info)) = info {
                        c.user(UserBody::SignalReceived(crate::forward::received(&info, None)));
                    }
                    if stop {
                        eprintln!("trainbpf: stopped waiting; {} job processes run on", c.job.len());
                        break 'orphans;
                    }
                }
            }
        }
        c.drain(&mut rings);
    }
    c.drain(&mut rings);
    c.poll_lost(&counters);
    for (kind, bytes) in gpu.finish(mono_ns()) {
        c.writer.record(kind, &bytes);
    }
    match status {
        Some(status) => c.user(UserBody::JobExit(JobExit { pid, status })),
        None => c.user(UserBody::Note("detached: the job ran on".into())),
    }
    c.finish()?;
    let _ = c.writer.get_ref().sync_all();
    Ok((status, c.writer.into_inner()))
}

/// The spawned job's end; never, for an attached one.
async fn wait_child(
    child: &mut Option<tokio::process::Child>,
) -> io::Result<std::process::ExitStatus> {
    match child {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}

/// What an attached recorder may watch, and the `--cgroup` it reads.
struct Attached {
    watcher: crate::attach::Watcher,
    cgroup: Option<crate::attach::CgroupDir>,
}

impl Attached {
    /// The processes in the `--cgroup` now that the invoker may watch;
    /// none without one.
    fn procs(&self) -> Vec<u32> {
        let Some(cg) = &self.cgroup else {
            return Vec::new();
        };
        cg.procs()
            .into_iter()
            .filter(|&t| self.watcher.may_watch(t))
            .collect()
    }
}

/// An attached job is over when its processes are gone (`--pid`), or its
/// cgroup is (`--cgroup`); `--all` and a spawned job never end here.
fn attached_done(target: &Target, job: &std::collections::HashSet<u32>) -> bool {
    match target {
        Target::Pid(_) => job.iter().all(|&t| !crate::procfs::alive(t)),
        Target::Cgroup(dir) => !dir.exists(),
        Target::Run(_) | Target::All => false,
    }
}

/// Reaps children that were re-parented to the recorder (its subreaper
/// role), except `keep`, which tokio waits for. WNOWAIT peeks first so that
/// the main process's status is never taken from under tokio.
fn reap_orphans(keep: Option<u32>) {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
    for _ in 0..64 {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        let Ok(st) = waitid(Id::All, flags) else {
            return;
        };
        let Some(pid) = st.pid() else { return };
        if matches!(st, WaitStatus::StillAlive) || Some(pid.as_raw() as u32) == keep {
            return;
        }
        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_missing_capabilities() {
        let me = Invoker { uid: 0, gid: 0 };
        let all = u64::MAX;
        assert_eq!(missing_capabilities(all, &me, 0), None);
        let m = missing_capabilities(0, &me, 0).unwrap();
        assert!(m.contains("CAP_BPF") && m.contains("CAP_PERFMON"), "{m}");
        // CAP_SYS_ADMIN alone covers BPF on every kernel.
        assert_eq!(missing_capabilities(1 << CAP_SYS_ADMIN, &me, 0), None);
        // Running the job as someone else needs setuid/setgid too.
        let other = Invoker {
            uid: 1000,
            gid: 1000,
        };
        let m = missing_capabilities(1 << CAP_SYS_ADMIN, &other, 0).unwrap();
        assert_eq!(m, "CAP_SETUID, CAP_SETGID");
    }
}
