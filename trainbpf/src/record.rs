//! `trainbpf record`: load the probes, run the job, stream the ring buffer
//! into the recording until the job ends.
//!
//! The recorder is the one witness that must survive the kill, so it
//! protects itself: `oom_score_adj` -1000, a fixed-size ring buffer, a frame
//! buffer flushed at least every second (a SIGKILL loses at most that), and a
//! file the job's user owns, mode 0600.
//!
//! This file sets up: privileges checked (`privileges`), signals blocked,
//! the probes loaded, the recording created, then `collect` runs the job
//! and the collector (`collector`) writes each record as it comes.

mod collect;
mod collector;
pub mod compact;
mod error;
pub mod forward;
pub mod gpu;
pub mod job;
pub mod links;
pub mod live;
mod observe;
mod options;
mod privileges;
pub mod rings;
pub mod samplers;
pub mod stacks;
pub mod target;
pub mod torchelastic;

use std::{
    fs::File,
    io,
    path::{Path, PathBuf},
};

use nix::sys::{
    signal::{SigSet, SigmaskHow, Signal},
    signalfd::{SfdFlags, SignalFd},
};
use trainbpf_report::{
    decode::ExitStatus,
    recording::{ClockPair, RecordConfig, RecordingHeader, Writer},
};

use crate::{
    loader::{self, Loaded, Tunables},
    util::{
        invoker::Invoker,
        safe_file::{self, Place},
    },
};
use collect::{Attached, Start, collect};
pub use error::RecordError;
use error::io_err;
use job::MemCgroup;
pub use options::{RecordOptions, Target};
use privileges::missing_capabilities;
use privileges::{effective_caps, protect_from_oom_killer};

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

/// The recording: created new as the invoking user, locked, never through
/// a link or over someone's file (util/safe_file.rs).
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
    let mut startup = crate::util::phases::Phases::new();
    let invoker = Invoker::detect().map_err(job::JobError::from)?;
    let euid = nix::unistd::Uid::effective().as_raw();
    if let Some(missing) = missing_capabilities(effective_caps(), &invoker, euid) {
        return Err(RecordError::Privileges { missing });
    }
    // Before anything is loaded or written: an attach the invoker may not
    // make leaves no recording behind.
    let watcher = crate::record::target::Watcher::new(&invoker);
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
            let cg = crate::record::target::CgroupDir::open(dir)?;
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

    // Bound before anything loads: a port in use fails the recorder here.
    let mut outputs = crate::record::live::metrics::Setup {
        listener: match &opts.metrics {
            Some(addr) => Some(
                crate::record::live::metrics::bind(addr)
                    .map_err(io_err(format!("--metrics {addr}: listening")))?,
            ),
            None => None,
        },
        log: None,
    };
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

    // The frames' namer starts now and reads the C library while the
    // probes load (a process of its own: the recorder stays
    // single-threaded until the load has forked for the kernel's BTF).
    if opts.tunables.stack_every_bytes().is_some() {
        stacks::start_namer();
    }
    startup.mark("set-up");
    let loaded = loader::load(&opts.tunables, page_size, &mut startup)?;
    let mut header = recording_header(&loaded, &opts.tunables, page_size, unprotected);
    if let Some(h) = &opts.hostname {
        header.hostname = h.clone();
    }
    let (file, place) = open_output(&opts.output, &invoker)?;
    if let Some(path) = &opts.events_jsonl {
        outputs.log = Some(crate::record::live::metrics::EventsLog::open(
            path,
            (&invoker).into(),
            header.hostname.clone(),
        )?);
    }
    let writer = Writer::new(file, &header).map_err(|e| RecordError::Io {
        what: format!("writing {}", opts.output.display()),
        source: io::Error::other(e.to_string()),
    })?;
    // One line, as perf says nothing unless asked: the probes chosen are
    // in the recording (`report`, `doctor`), and said here with -v.
    if opts.verbose {
        eprintln!(
            "trainbpf: recording to {}; {}",
            opts.output.display(),
            loader::describe(&loaded.attach, &loaded.fallbacks)
        );
    } else {
        eprintln!("trainbpf: recording to {}", opts.output.display());
        let stacks = opts.tunables.stack_every_bytes().is_some();
        for w in loader::missing(&loaded.attach, stacks) {
            eprintln!("trainbpf: {w}");
        }
    }

    let cgroup = match opts.memory_limit {
        Some(limit) => Some(MemCgroup::create(limit)?),
        None => None,
    };

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_err("starting the runtime"))?;
    let attached = !matches!(opts.target, Target::Run(_));
    let (status, recording) = rt.block_on(collect(Start {
        loaded,
        writer,
        target: opts.target,
        attached: Attached {
            watcher,
            cgroup: cgroup_dir,
        },
        invoker,
        job_adj,
        cgroup: cgroup.as_ref(),
        sigfd,
        status: crate::record::live::status::Status::new(opts.quiet, opts.leaks.clone()),
        flight: opts
            .flight
            .map(|f| crate::record::compact::Flight::new(place.clone(), f)),
        outputs,
        recording: std::path::absolute(&opts.output)
            .unwrap_or_else(|_| opts.output.clone())
            .display()
            .to_string(),
        verbose: opts.verbose,
        startup,
    }))?;
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

/// The recording's header: the machine, the clocks, what was attached and
/// what fell back, and the settings the probes run with.
fn recording_header(
    loaded: &Loaded,
    tunables: &Tunables,
    page_size: u64,
    unprotected: Option<trainbpf_report::recording::Fallback>,
) -> RecordingHeader {
    let machine = crate::record::samplers::pressure::sample(None);
    let uts = nix::sys::utsname::uname().ok();
    RecordingHeader {
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
        overcommit: {
            let (memory, ratio, kbytes) = crate::doctor::read_overcommit();
            trainbpf_report::recording::Overcommit {
                memory,
                ratio,
                kbytes,
                commit_limit_kb: machine.commit_limit_kb,
            }
        },
        clock: ClockPair::read(),
        attach: loaded.attach.clone(),
        fallbacks: loaded
            .fallbacks
            .iter()
            .cloned()
            .chain(unprotected)
            .collect(),
        config: RecordConfig {
            rss_threshold_bytes: tunables.rss_threshold_bytes,
            rss_relative_shift: tunables.rss_relative_shift,
            heartbeat_ms: tunables.heartbeat_ms,
            ring_bytes: tunables.ring_bytes as u64,
        },
        recorder_pid: Some(std::process::id()),
    }
}
