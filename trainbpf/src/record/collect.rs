//! `collect`: the recorder's run from the probes' first record to the
//! job's end, in steps: start the job (or take in the attached one), drain
//! the rings until the job ends, follow the workers it orphaned, and close
//! the recording.

use std::{
    fs::File,
    io,
    time::{Duration, Instant},
};

use aya::maps::{MapData, PerCpuArray};
use nix::sys::signalfd::SignalFd;
use tokio::io::unix::AsyncFd;
use trainbpf_common as common;
use trainbpf_report::{
    decode::{ExitStatus, JobExit, UserBody},
    recording::Writer,
};

use super::{
    collector::{Collector, FLUSH_BYTES},
    error::{RecordError, io_err},
    options::Target,
};
use crate::{
    loader::Loaded,
    record::job::{self, MemCgroup},
    util::{clock::mono_ns, invoker::Invoker, phases::Phases},
};

mod start_job;
use start_job::{seed, start_job};

/// The kernel's map of the job's processes.
type JobMap = aya::maps::HashMap<MapData, u32, u32>;

/// What `record.rs` set up for the collector, handed over whole.
pub(super) struct Start<'a> {
    pub(super) loaded: Loaded,
    pub(super) writer: Writer<File>,
    pub(super) target: Target,
    pub(super) attached: Attached,
    pub(super) invoker: Invoker,
    /// The `oom_score_adj` the job starts with.
    pub(super) job_adj: i32,
    /// The job's own cgroup (`--memory-limit`).
    pub(super) cgroup: Option<&'a MemCgroup>,
    pub(super) sigfd: SignalFd,
    pub(super) status: crate::record::live::status::Status,
    pub(super) flight: Option<crate::record::compact::Flight>,
    pub(super) outputs: crate::record::live::metrics::Setup,
    /// The recording's path, as `trainbpf report` takes it.
    pub(super) recording: String,
    /// `-v`: what the GPU probes found is said at start too.
    pub(super) verbose: bool,
    /// The start-up's parts so far, said with `-v`.
    pub(super) startup: Phases,
}

pub(super) async fn collect(start: Start<'_>) -> Result<(Option<ExitStatus>, File), RecordError> {
    let Start {
        loaded,
        writer,
        target,
        attached,
        invoker,
        job_adj,
        cgroup,
        sigfd,
        status,
        flight,
        outputs,
        recording,
        verbose,
        mut startup,
    } = start;
    let Loaded {
        mut ebpf,
        events,
        precious,
        counters,
        mut job,
        attach,
        stacks,
        kernel_log,
        agent_wait,
        late_faults,
        cuda_multi,
        ..
    } = loaded;
    let job_memcg = match (&target, cgroup) {
        (_, Some(cg)) => Some((cg.dir.clone(), cg.rel.clone(), cg.v2)),
        (Target::Pid(p), None) => job::memcg_of_pid(*p),
        (Target::Cgroup(dir), None) => job::memcg_of_dir(dir),
        _ => None,
    };
    let has_memcg = job_memcg.is_some();
    let mut c = Collector::new(writer, job_memcg, flight, status);
    c.live = outputs
        .start(has_memcg)
        .map_err(io_err("starting the --metrics server"))?;
    c.stacks = stacks.map(crate::record::stacks::Stacks::start);
    // A job's own processes only: `--all` has no job of a user's to speak
    // for, and writes into no one's directories.
    if !matches!(target, Target::All) {
        c.error_files = Some(crate::record::torchelastic::ErrorFiles::start(recording));
    }
    let rings = crate::record::rings::Rings::new(events, precious)
        .map_err(io_err("polling the ring buffers"))?;
    // SAFETY: the fd is owned by the value moved in, and stays open until
    // the AsyncFd (and its registration) is dropped.
    let sigfd = unsafe { AsyncFd::register_with_interest(sigfd, tokio::io::Interest::READABLE) }
        .map_err(|e| io_err("polling the signalfd")(e.into()))?;

    // The GPU probes go on before the job starts, so that a libcuda it loads
    // from a known place is probed from its first call.
    // The kernel holds a late driver mapping only of a job the recorder
    // runs (the loader's `hold_late_cuda`).
    let (mut gpu, records) = crate::record::gpu::GpuProbes::start(
        &mut ebpf,
        attach.printk.is_some(),
        matches!(target, Target::Run(_)),
        matches!(target, Target::Pid(_) | Target::Cgroup(_)),
        crate::record::gpu::Preloaded {
            faults: late_faults,
            multi: cuda_multi,
        },
        (&invoker).into(),
        mono_ns(),
    );
    for (kind, bytes) in records {
        c.writer.record(kind, &bytes);
    }
    startup.mark_programs("GPU probes");
    gpu.set_verbose(verbose);
    if verbose {
        eprintln!("trainbpf: {}", gpu.describe());
    }
    // torchelastic's agent is held at its wait on a killed worker only
    // where the hold is bounded by the watchdog (`hold_agents`).
    if let Some(ef) = &mut c.error_files {
        let not = match (gpu.holds(), agent_wait) {
            (true, Some(Ok(point))) => {
                match crate::record::torchelastic::AgentHold::take(&mut ebpf, point) {
                    Ok(h) => {
                        ef.hold_with(h);
                        None
                    }
                    Err(e) => Some(e),
                }
            }
            (true, Some(Err(e))) => Some(e),
            (_, None) => Some("an attached recorder holds no one".into()),
            (false, Some(_)) => Some("no watchdog would bound the hold on this kernel".into()),
        };
        if let Some(why) = not {
            c.user(trainbpf_report::decode::UserBody::Note(format!(
                "torchelastic's agent is not held at its wait: {why}"
            )));
        }
    }

    let (pid, child) = start_job(
        &mut c, &mut job, &target, &attached, &invoker, job_adj, cgroup,
    )?;
    // The job's processes from before the probes: the only ones the GPU
    // maps scan may need to read. For `--all`, every process on the node
    // now: a DaemonSet's recorder restarted beside running trainers must
    // find the driver they mapped before it, which no fault will show
    // again. Read a scan's worth a second, once each.
    if matches!(target, Target::All) {
        let me = std::process::id();
        gpu.predating(
            crate::record::samplers::procfs::pids()
                .into_iter()
                .filter(|&p| p != me),
        );
    } else {
        gpu.predating(c.job.iter().copied());
    }
    startup.mark("job started");

    // The kernel programs submit routine records without waking us (a
    // wake-up per record cost the job a context switch each): this tick
    // drains them, so a record waits 50 ms at most; a quarter-full ring or
    // an OOM record wakes us at once.
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut s = Session {
        c,
        rings,
        sigfd,
        ebpf,
        counters,
        job,
        gpu,
        tick,
        target,
        attached,
        pid,
        child,
        kernel_log,
        startup: verbose.then(|| (startup, Instant::now())),
        verbose,
    };
    let (status, stopping) = s.until_the_job_ends().await?;
    let mut exit = Phases::new();
    s.c.status.clear();
    s.follow_orphans(stopping).await?;
    exit.mark("orphans followed");
    s.close(status, exit)
}

/// `-v`: the start-up's parts, once the rings first hold records (`n`
/// read), with how long after the job's start that was.
fn said_started(startup: &mut Option<(Phases, Instant)>, n: usize) {
    if n > 0
        && let Some((p, job)) = startup.take()
    {
        eprintln!(
            "trainbpf: started the job in {}; its first records read {} later",
            p.line(),
            crate::util::phases::ms(job.elapsed())
        );
    }
}

/// Everything the collect loop drives once the job runs.
struct Session {
    c: Collector,
    rings: crate::record::rings::Rings,
    sigfd: AsyncFd<SignalFd>,
    /// Owns the programs and their links: dropping it detaches them.
    ebpf: aya::Ebpf,
    counters: PerCpuArray<MapData, common::Counters>,
    job: JobMap,
    gpu: crate::record::gpu::GpuProbes,
    tick: tokio::time::Interval,
    target: Target,
    attached: Attached,
    /// The job's main process; 0 for `--cgroup` and `--all`.
    pid: u32,
    /// The spawned job; `None` for an attached one.
    child: Option<tokio::process::Child>,
    /// The kernel programs' own log, with `--ebpf-log`.
    kernel_log: Option<crate::loader::KernelLog>,
    /// `-v`: the start-up's parts and the job's start, until said.
    startup: Option<(Phases, Instant)>,
    verbose: bool,
}

impl Session {
    /// Drains the rings and runs the samplers until the job's main process
    /// ends, an attached job is gone, or a signal detaches the recorder.
    /// Returns the job's status (`None`: detached) and whether someone
    /// asked the job to stop.
    async fn until_the_job_ends(&mut self) -> Result<(Option<ExitStatus>, bool), RecordError> {
        let pid = self.pid;
        let Session {
            c,
            rings,
            sigfd,
            ebpf,
            counters,
            job,
            gpu,
            tick,
            target,
            attached,
            child,
            kernel_log,
            startup,
            ..
        } = self;
        let mut last_flush = Instant::now();
        let error_file_read = c.error_file_read();
        // Set once someone asked the job to stop (Ctrl-C, kill, systemd): the
        // recorder then does not wait for orphaned workers to finish too.
        let mut stopping = false;
        let status = loop {
            tokio::select! {
                r = rings.readable() => {
                    r.map_err(io_err("ring buffer"))?;
                    said_started(startup, c.drain(rings));
                    gpu_late(c, gpu, ebpf);
                    if c.writer.pending() > FLUSH_BYTES {
                        c.flush()?;
                        last_flush = Instant::now();
                    }
                }
                // A worker whose agent may be held: the hold is attached
                // and the worker marked now, not at the next tick.
                () = error_file_read.notified() => {
                    c.poll_identities();
                    gpu_late(c, gpu, ebpf);
                }
                _ = tick.tick() => {
                    said_started(startup, c.drain(rings));
                    gpu_late(c, gpu, ebpf);
                    c.poll_lost(counters);
                    c.kernel_log(kernel_log.as_mut());
                    c.live_tick(false);
                    reap_orphans(Some(pid));
                    if attached_done(target, &c.job) {
                        break c.root_exit;
                    }
                    if last_flush.elapsed() >= Duration::from_secs(1) || c.writer.pending() > FLUSH_BYTES {
                        // Processes moved into the cgroup later (docker exec, a
                        // new unit process) join the job here; their children
                        // join in the kernel, at fork.
                        for t in attached.procs() {
                            if c.job.insert(t) {
                                seed(job, t)?;
                                // It may have mapped a driver library
                                // before it was the job's.
                                gpu.predating(std::iter::once(t));
                            }
                        }
                        c.poll_pressure();
                        c.leak_warnings();
                        c.poll_procfs();
                        for (kind, bytes) in gpu.tick(ebpf, job, mono_ns()) {
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
                        let fwd = child.is_some() && crate::record::forward::should_forward(&info);
                        c.user(UserBody::SignalReceived(crate::record::forward::received(
                            &info,
                            fwd.then_some(pid),
                        )));
                        if fwd {
                            crate::record::forward::forward(pid, &info);
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
                st = wait_child(child) => {
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
        Ok((status, stopping))
    }

    /// After the main process: the last records trailing its exit, then
    /// the workers it orphaned, until they exit or the recorder is told to
    /// stop.
    async fn follow_orphans(&mut self, stopping: bool) -> Result<(), RecordError> {
        let pid = self.pid;
        let Session {
            c,
            rings,
            sigfd,
            ebpf,
            counters,
            job,
            gpu,
            tick,
            child,
            kernel_log,
            ..
        } = self;
        // Exits of the last workers and the kill's log lines trail the main
        // process's exit by a little: keep reading briefly.
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            c.drain(rings);
            gpu_late(c, gpu, ebpf);
            c.live_tick(false);
            reap_orphans(None);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Workers orphaned by the main process's death are still the job: the
        // recorder is their subreaper and records them until they exit.
        c.job.remove(&pid);
        c.job.retain(|&t| crate::record::samplers::procfs::alive(t));
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
                        c.drain(rings);
                        gpu_late(c, gpu, ebpf);
                        c.poll_lost(counters);
                        c.kernel_log(kernel_log.as_mut());
                        c.live_tick(false);
                        reap_orphans(None);
                        c.job.retain(|&t| crate::record::samplers::procfs::alive(t));
                        if c.job.is_empty() {
                            break 'orphans;
                        }
                        if last_flush.elapsed() >= Duration::from_secs(1) {
                            c.poll_pressure();
                            c.poll_procfs();
                            for (kind, bytes) in gpu.tick(ebpf, job, mono_ns()) {
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
                            c.user(UserBody::SignalReceived(crate::record::forward::received(&info, None)));
                        }
                        if stop {
                            eprintln!("trainbpf: stopped waiting; {} job processes run on", c.job.len());
                            break 'orphans;
                        }
                    }
                }
            }
            c.drain(rings);
        }
        Ok(())
    }

    /// The last records, the job's end, and the recording's last flush.
    fn close(
        self,
        status: Option<ExitStatus>,
        mut exit: Phases,
    ) -> Result<(Option<ExitStatus>, File), RecordError> {
        let Session {
            mut c,
            mut rings,
            counters,
            mut gpu,
            ebpf,
            pid,
            mut kernel_log,
            verbose,
            ..
        } = self;
        let mut ebpf = ebpf;
        c.drain(&mut rings);
        gpu_late(&mut c, &mut gpu, &mut ebpf);
        exit.mark("last records drained");
        c.finish_identities();
        c.finish_shm();
        c.finish_stacks();
        exit.mark("names and stacks finished");
        c.poll_lost(&counters);
        c.kernel_log(kernel_log.as_mut());
        c.live_tick(true);
        for (kind, bytes) in gpu.finish(&mut ebpf, mono_ns()) {
            c.writer.record(kind, &bytes);
        }
        match status {
            Some(status) => c.user(UserBody::JobExit(JobExit { pid, status })),
            None => c.user(UserBody::Note("detached: the job ran on".into())),
        }
        c.finish()?;
        let _ = c.writer.get_ref().sync_all();
        exit.mark("recording written");
        // The recording is whole: the probes go, together.
        gpu.detach();
        exit.mark("CUDA probes detached");
        drop(ebpf);
        exit.mark("other probes detached");
        if verbose {
            eprintln!("trainbpf: left the job's end in {}", exit.line());
        }
        // A read abandoned past its deadline may still wait in the kernel;
        // most such waits end with this process, but a page of a FUSE file
        // in the server's hands holds it until the server answers or goes.
        let stuck = crate::record::samplers::procfs::guard::STATS
            .snapshot()
            .stuck;
        if stuck > 0 {
            eprintln!(
                "trainbpf: {stuck} read(s) of the job's memory are still blocked in the kernel; the recording is complete (report: job_reads), and this process may end only when they do"
            );
        }
        Ok((status, c.writer.into_inner()))
    }
}

/// Job processes that mapped a driver library not yet probed: probed and
/// continued at once (they are held until then), and the forced windows of
/// the test switch that have run their length; torchelastic's agents
/// whose worker's error file is in, continued (`hold_agents` attaches
/// their hold when first needed).
fn gpu_late(c: &mut Collector, gpu: &mut crate::record::gpu::GpuProbes, ebpf: &mut aya::Ebpf) {
    let now = mono_ns();
    let evs = std::mem::take(&mut c.gpu_maps);
    let mut recs = gpu.on_mapped(ebpf, evs, now);
    recs.extend(gpu.due(ebpf, now));
    for (kind, bytes) in recs {
        c.writer.record(kind, &bytes);
    }
    hold_agents(c, ebpf);
    for agent in std::mem::take(&mut c.agents_done) {
        if let Some(note) = gpu.release_agent(agent) {
            c.user(trainbpf_report::decode::UserBody::Note(note));
        }
    }
}

/// The agent's hold, attached at the first process torchelastic's agent
/// waits on: its program runs at every wait on the machine, which a
/// recording without torchelastic does not pay for.
fn hold_agents(c: &mut Collector, ebpf: &mut aya::Ebpf) {
    let Some(ef) = c.error_files.as_mut() else {
        return;
    };
    if ef.wants_hold() {
        let said = ef.attach_hold(ebpf);
        c.user(trainbpf_report::decode::UserBody::Note(said));
    }
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
pub(super) struct Attached {
    pub(super) watcher: crate::record::target::Watcher,
    pub(super) cgroup: Option<crate::record::target::CgroupDir>,
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
        Target::Pid(_) => job
            .iter()
            .all(|&t| !crate::record::samplers::procfs::alive(t)),
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
