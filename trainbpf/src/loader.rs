//! Loads the eBPF object, fills in this kernel's offsets, and attaches each
//! probe at the best point the kernel allows, falling back and saying why.
//!
//! Choices, best first:
//! - kill context: `fentry/oom_kill_process` (5.5+, needs BPF trampolines and
//!   no lockdown veto), then `kprobe/oom_kill_process` (CONFIG_KPROBES);
//!   without either there is no `oom_control` (points, totalpages), but the
//!   victim is still caught:
//! - victim: `tp_btf/mark_victim` where its BTF prototype passes a
//!   `task_struct *` (upstream 6.8+, and distribution kernels that took the
//!   change, Debian's 6.1 among them), then the classic `oom:mark_victim`
//!   tracepoint (all fields where it has them, `pid` alone before);
//! - lifecycle: `tp_btf/sched_process_{fork,exec,exit}` (5.5+);
//! - honest growth: `tp_btf/mm_page_{alloc,free}` (5.5+), batched per CPU;
//! - memory (RSS): read by those page probes, once per batch of a process's
//!   pages and at each page table; `tp_btf/rss_stat` (5.5+) only where they
//!   are missing, since a third program on every fault costs the job more;
//! - kernel log: `printk:console`.
//!
//! This file loads the object and fills in its globals; `loader/attach.rs`
//! attaches the probes in that order, one step per group, and
//! `loader/features.rs` is `doctor`'s trial of each program type.

use crate::util::phases::Phases;
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::ProgramError,
};
use trainbpf_common::{Config, Counters};
use trainbpf_report::recording::{Attach, Fallback};

use kernel::KernelBtf;

use crate::util::values::{MAX_HEARTBEAT_MS, MAX_RELATIVE_SHIFT, parse_ring_size, parse_size};

pub mod batch;
mod ebpf_log;
mod features;
mod gpu_config;
pub mod kernel;
mod probes;
pub mod stack_maps;
mod uprobe_multi;
pub use ebpf_log::KernelLog;
pub use features::{Features, Probe, Unavailable, probe_features};
pub use probes::{AGENT_WAIT_BTF, AGENT_WAIT_CLASSIC, LATE_FAULTS, RSS_VIA_PAGES};
use probes::{attach_kill_context, attach_lifecycle, attach_memory, attach_printk, attach_victim};
pub use uprobe_multi::UprobeMulti;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading the kernel's BTF or a required field failed.
    #[error(transparent)]
    Kernel(#[from] kernel::KernelError),
    /// The object could not be loaded (maps, globals).
    #[error("loading the eBPF object: {0}")]
    Object(String),
    /// A probe with no fallback could not be attached.
    #[error("attaching {probe}: {reason}")]
    Attach { probe: String, reason: String },
}

/// Entries of the per-process map by default: every process on a busy
/// machine, a quarter held for the job.
pub const DEFAULT_PROC_MAP_ENTRIES: u32 = 32768;

/// The recorder's knobs: each is a `record` flag (the command line
/// flattens this struct) and is read where it is used. A new one is a
/// field here and its use, nothing else.
#[derive(clap::Args, Clone, Debug)]
pub struct Tunables {
    /// Report a process when its memory moved by at least this much.
    #[arg(long = "rss-threshold", value_name = "SIZE", default_value = "4M",
          value_parser = parse_size)]
    pub rss_threshold_bytes: u64,
    /// ...or by 1/2^N of its size, whichever is larger (0: off; at most 62).
    #[arg(long, value_name = "N", default_value_t = 6,
          value_parser = clap::value_parser!(u32).range(0..=MAX_RELATIVE_SHIFT))]
    pub rss_relative_shift: u32,
    /// Report a smaller change once this many milliseconds have passed
    /// (at most a day).
    #[arg(long, value_name = "MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(0..=MAX_HEARTBEAT_MS))]
    pub heartbeat_ms: u64,
    /// Probe on oom_kill_process: auto (fentry, then kprobe), fentry,
    /// kprobe, or none (the victim tracepoint alone).
    #[arg(long, value_enum, default_value_t = OomProbe::Auto)]
    pub oom_probe: OomProbe,
    /// Ring buffer size (a power of two, at least one page).
    #[arg(long = "ring-size", value_name = "SIZE", default_value = "4M",
          value_parser = parse_ring_size)]
    pub ring_bytes: u32,
    /// Entries of the kernel's per-process memory map, a quarter of them
    /// held for the job (tests set it small to fill it).
    #[arg(long, default_value_t = DEFAULT_PROC_MAP_ENTRIES, hide = true,
          value_parser = clap::value_parser!(u32).range(16..=1 << 22))]
    pub proc_map_entries: u32,
    /// Have the kernel programs log what only they can see (a map that
    /// filled, a ring that refused a record, a kernel read at BTF's
    /// offset that failed), each message with the program that logged
    /// it: into the recording, and to stderr. Off, the log calls are
    /// dead code the verifier drops.
    #[arg(long)]
    pub ebpf_log: bool,
    /// Take no stacks. By default a job process's user stack (and its
    /// Python frames) is taken each time its added memory climbs
    /// --stack-every above its last high, and each thread's at a fatal
    /// signal, and resolved while the process lives: `report` names the
    /// line that grew memory.
    #[arg(long)]
    pub no_stacks: bool,
    /// Stacks are on by default; the flag is kept so that older command
    /// lines still run.
    #[arg(long, hide = true, conflicts_with = "no_stacks")]
    pub stacks: bool,
    /// New high between two stacks of a process (e.g. 512K, 4M).
    #[arg(long, value_name = "SIZE", default_value = "512K", value_parser = parse_size,
          conflicts_with = "no_stacks")]
    pub stack_every: u64,
    /// `--all`: every process on the machine is the job's.
    #[arg(skip)]
    pub all_processes: bool,
    /// The recorder started the job itself (`record -- CMD`): only then may
    /// a job process that maps an unprobed CUDA driver be held until its
    /// probes are on. `--pid`, `--cgroup` and `--all` only watch, so there a
    /// late library's window is counted instead.
    #[arg(skip)]
    pub hold_late_cuda: bool,
}

impl Tunables {
    /// The climb above a process's last high between two of its stacks.
    /// `None`: stacks off (`--no-stacks`).
    pub fn stack_every_bytes(&self) -> Option<u64> {
        (!self.no_stacks).then_some(self.stack_every.max(1))
    }
}

/// The flags' own defaults, so that `doctor` and the tests load what a
/// plain `record` would.
impl Default for Tunables {
    fn default() -> Tunables {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            tunables: Tunables,
        }
        <Flags as clap::Parser>::parse_from(["trainbpf"]).tunables
    }
}

/// Which probe on `oom_kill_process` to try.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OomProbe {
    /// fentry, then kprobe.
    #[default]
    Auto,
    /// fentry only.
    Fentry,
    /// kprobe only (where fentry misbehaves, or to test the kprobe path).
    Kprobe,
    /// Neither: the victim tracepoint alone.
    None,
}

pub struct Loaded {
    /// Owns the programs and their links: dropping it detaches everything.
    pub ebpf: Ebpf,
    pub events: RingBuf<MapData>,
    /// Kills, deaths, signals and OOM log lines, kept apart from the
    /// memory records so that a burst of those cannot crowd them out.
    pub precious: RingBuf<MapData>,
    pub counters: PerCpuArray<MapData, Counters>,
    pub job: HashMap<MapData, u32, u32>,
    /// `--stacks`: the growth-stack maps; `None` when off.
    pub stacks: Option<stack_maps::StackMaps>,
    pub attach: Attach,
    pub fallbacks: Vec<Fallback>,
    /// The programs' own log, with `--ebpf-log`.
    pub kernel_log: Option<KernelLog>,
    /// torchelastic's agent hold, loaded and not attached (its attach
    /// point), or why not; `None` where no process may be held
    /// (`hold_late_cuda`).
    pub agent_wait: Option<Result<&'static str, String>>,
    /// The late driver library probe on the file fault tracepoints,
    /// loaded and not attached, or why not (the `mmap` and `ioctl` system
    /// call tracepoints are its fallback).
    pub late_faults: Result<(), String>,
    /// The CUDA uprobes loaded for multi links, or why not (aya's
    /// perf-event uprobes are their fallback).
    pub cuda_multi: Result<UprobeMulti, String>,
}

/// The eBPF object, built by build.rs with aya-build.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/trainbpf"));

/// `TRAINBPF_VERIFIER_LOG=1`: the verifier's whole log, each instruction
/// it walked, for a program a kernel refuses (docs/development.md).
fn full_verifier_log() -> bool {
    std::env::var_os("TRAINBPF_VERIFIER_LOG").is_some()
}

/// Shortens aya's errors: a verifier log can run to pages. Its first line
/// may be a remark the verifier makes of any program (an argument's BTF
/// type), and its last says what it refused: both are kept.
fn why(e: &ProgramError) -> String {
    let s = e.to_string();
    if full_verifier_log() {
        return s;
    }
    let mut lines = s.lines().filter(|l| !l.trim().is_empty());
    let first = lines.next().unwrap_or("").to_string();
    let last = lines.next_back().map(str::trim);
    // aya appends "Verifier output:" and the log; an empty log says nothing.
    let first = match first.split_once(". Verifier output:") {
        Some((head, rest)) if rest.trim().is_empty() => head.to_string(),
        _ => first,
    };
    let first = match last {
        Some(l) if !l.starts_with("processed ") && !l.starts_with("verification time") => {
            format!("{first} ... {l}")
        }
        _ => first,
    };
    let source = std::error::Error::source(e)
        .map(|s| s.to_string())
        .unwrap_or_default();
    if source.is_empty() || first.contains(&source) {
        first
    } else {
        format!("{first}: {source}")
    }
}

/// This kernel's offsets and tracepoint layouts plus the tunables, to be
/// frozen into the object's `CONFIG`. tracefs must be mounted first for the
/// tracepoint fields to be found.
fn config(kbtf: &KernelBtf, t: &Tunables, page_size: u64) -> Result<Config, LoadError> {
    let mut config = Config::UNSET;
    kbtf.fill(&mut config)?;
    if let Some(f) = kernel::tp_format("oom", "mark_victim") {
        config.tp_mv_pid = kernel::field(&f, "pid");
        config.tp_mv_comm = kernel::field(&f, "comm");
        config.tp_mv_total_vm = kernel::field(&f, "total_vm");
        config.tp_mv_anon_rss = kernel::field(&f, "anon_rss");
        config.tp_mv_file_rss = kernel::field(&f, "file_rss");
        config.tp_mv_shmem_rss = kernel::field(&f, "shmem_rss");
        config.tp_mv_uid = kernel::field(&f, "uid");
        config.tp_mv_pgtables = kernel::field(&f, "pgtables");
        config.tp_mv_oom_score_adj = kernel::field(&f, "oom_score_adj");
    }
    if let Some(f) = kernel::tp_format("printk", "console") {
        config.tp_console_msg = kernel::field(&f, "msg");
    }
    config.rss_threshold_pages = (t.rss_threshold_bytes / page_size.max(1)).max(1) as i64;
    config.rss_relative_shift = t.rss_relative_shift as i64;
    config.heartbeat_ns = (t.heartbeat_ms * 1_000_000) as i64;
    config.all_processes = i64::from(t.all_processes);
    config.ebpf_log = i64::from(t.ebpf_log);
    // THREAD_SIZE: 16 KiB on x86-64 and arm64, twice that with KASAN, and
    // never under a page. Not in BTF; a wrong size would only make every
    // page event look like an interrupt's, so it errs large only by KASAN.
    let stack = if kbtf.has_func("kasan_report") {
        32 << 10
    } else {
        16 << 10
    };
    config.thread_size = if config.task_stack >= 0 {
        stack.max(page_size as i64)
    } else {
        -1
    };
    // The user registers sit at the top of the kernel stack on x86-64,
    // below TOP_OF_KERNEL_STACK_PADDING: 16 bytes in a kernel built with
    // FRED, none otherwise. Elsewhere the leaf's return address is not
    // read.
    let padding = if kbtf.has_func("fred_entry_from_user") {
        16
    } else {
        0
    };
    let user_reg = |name: &str| match (
        cfg!(target_arch = "x86_64") && config.thread_size > 0,
        kbtf.struct_size("pt_regs"),
        kbtf.offset("pt_regs", &[name]),
    ) {
        (true, Some(size), off) if off >= 0 => config.thread_size - padding - size as i64 + off,
        _ => -1,
    };
    config.user_sp = user_reg("sp");
    config.user_ip = user_reg("ip");
    config.user_bp = user_reg("bp");
    config.page_size = page_size as i64;
    // A PMD holds page_size / 8 entries: its order is log2 of that.
    config.max_folio_order = i64::from((page_size.max(8) / 8).trailing_zeros());
    config.procs_max = i64::from(t.proc_map_entries);
    config.procs_job_reserve = i64::from(t.proc_map_entries / 4);
    config.stack_every_pages = t
        .stack_every_bytes()
        .map_or(0, |b| (b / page_size.max(1)).max(1) as i64);
    Ok(config)
}

/// With the config: whether `mark_victim`'s prototype passes a task, or
/// what BTF showed instead.
type Facts = (Config, Result<(), String>);

/// The offsets and facts `load` reads from the kernel's BTF. Parsing it
/// (btf-rs, the whole of vmlinux's types) peaks near 50 MB, which would stay
/// the recorder's high-water mark for days: a short-lived child does it and
/// hands back the few bytes that matter. Without a child (fork refused), it
/// is done here.
fn btf_facts(t: &Tunables, page_size: u64) -> Result<Facts, LoadError> {
    let facts = || -> Result<Facts, LoadError> {
        let kbtf = KernelBtf::open()?;
        let config = config(&kbtf, t, page_size)?;
        Ok((
            config,
            kbtf.tp_first_arg_struct("mark_victim", "task_struct"),
        ))
    };
    let Ok((rd, wr)) = nix::unistd::pipe() else {
        return facts();
    };
    // SAFETY: the recorder is still single-threaded here (no runtime, no
    // helper threads yet), so the child may run ordinary code; it leaves
    // with _exit, running no destructors of the parent's state.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(rd);
            let mut out = std::fs::File::from(wr);
            let msg = match facts() {
                Ok((c, task)) => {
                    let mut m = vec![0u8, u8::from(task.is_ok())];
                    m.extend_from_slice(&trainbpf_report::decode::pod_bytes(&c));
                    m.extend_from_slice(task.err().unwrap_or_default().as_bytes());
                    m
                }
                Err(e) => {
                    let mut m = vec![1u8];
                    m.extend_from_slice(e.to_string().as_bytes());
                    m
                }
            };
            let ok = std::io::Write::write_all(&mut out, &msg).is_ok();
            // SAFETY: ends the child at once.
            unsafe { nix::libc::_exit(if ok { 0 } else { 1 }) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(wr);
            let mut msg = Vec::new();
            let read = std::io::Read::read_to_end(&mut std::fs::File::from(rd), &mut msg);
            let _ = nix::sys::wait::waitpid(child, None);
            match (read, msg.first()) {
                (Ok(_), Some(0)) if msg.len() >= 2 + size_of::<Config>() => {
                    // SAFETY: Config is plain #[repr(C)] integers, and the
                    // bytes are one, written by the same binary.
                    let c: Config =
                        unsafe { std::ptr::read_unaligned(msg[2..].as_ptr() as *const Config) };
                    let why = &msg[2 + size_of::<Config>()..];
                    let task = if msg[1] != 0 {
                        Ok(())
                    } else {
                        Err(String::from_utf8_lossy(why).into_owned())
                    };
                    Ok((c, task))
                }
                (Ok(_), Some(1)) => Err(LoadError::Object(
                    String::from_utf8_lossy(&msg[1..]).into_owned(),
                )),
                // The child died (out of memory itself?): try here.
                _ => facts(),
            }
        }
        Err(_) => facts(),
    }
}

/// Loads and attaches the probes; `startup` gets the parts of the time.
pub fn load(t: &Tunables, page_size: u64, startup: &mut Phases) -> Result<Loaded, LoadError> {
    // Mounted first, here: the child reads tracepoint layouts from it.
    let tracefs = kernel::ensure_tracefs();
    let (mut config, mark_victim_task) = btf_facts(t, page_size)?;
    startup.mark("kernel BTF");
    // Signals sent to the recorder are kept too: it passes them on to the
    // job, and the kernel's record of who sent them is the evidence. Set
    // here, not in `config`, which may run in a child.
    config.recorder_tgid = i64::from(std::process::id());
    // The Xid tracepoint's layout, from tracefs (mounted above).
    let mut gpu_config = gpu_config::gpu_config();
    // A hold is ended by the watchdog through a pidfd checked against the
    // process's start time: without that field no process is held.
    if !t.hold_late_cuda || config.task_start_boottime < 0 {
        gpu_config.late_hold = 0;
    }

    let (mut ebpf, btf) = load_object(
        &config,
        Some(&gpu_config),
        Some(t.ring_bytes),
        Some(t.proc_map_entries),
        t.stack_every_bytes().is_some(),
    )
    .map_err(|e| LoadError::Object(e.to_string()))?;
    startup.mark("object and maps");

    let mut attach = Attach::default();
    let mut fallbacks = Vec::new();
    let mut fell = |probe: &str, reason: String| {
        fallbacks.push(Fallback {
            probe: probe.to_string(),
            reason,
        })
    };
    attach_kill_context(&mut ebpf, &btf, t, &mut attach, &mut fell);
    attach_victim(
        &mut ebpf,
        &btf,
        &tracefs,
        &mark_victim_task,
        &mut attach,
        &mut fell,
    )?;
    attach_lifecycle(&mut ebpf, &btf, &mut attach, &mut fell)?;
    attach_memory(&mut ebpf, &btf, &config, &mut attach, &mut fell);
    attach_printk(&mut ebpf, &config, &tracefs, &mut attach, &mut fell);
    let agent_wait = t
        .hold_late_cuda
        .then(|| probes::load_agent_wait(&mut ebpf, &btf));
    let late_faults = probes::load_late_faults(&mut ebpf, &btf);
    startup.mark_programs("probes");
    // Before any map is taken out: the programs are relocated to them.
    let cuda_multi = UprobeMulti::load(&ebpf, OBJECT, &btf);
    startup.mark_programs("CUDA programs");
    let kernel_log = if t.ebpf_log {
        match KernelLog::open(&mut ebpf) {
            Ok(l) => {
                attach.ebpf_log = Some("aya-log ring AYA_LOGS".into());
                Some(l)
            }
            Err(e) => {
                fell("aya-log ring AYA_LOGS", e.to_string());
                None
            }
        }
    } else {
        None
    };

    let take = |ebpf: &mut Ebpf, name: &str| {
        ebpf.take_map(name)
            .ok_or_else(|| LoadError::Object(format!("map {name} missing from the object")))
    };
    let events = RingBuf::try_from(take(&mut ebpf, "EVENTS")?)
        .map_err(|e| LoadError::Object(e.to_string()))?;
    let precious = RingBuf::try_from(take(&mut ebpf, "PRECIOUS")?)
        .map_err(|e| LoadError::Object(e.to_string()))?;
    let counters = PerCpuArray::try_from(take(&mut ebpf, "COUNTERS")?)
        .map_err(|e| LoadError::Object(e.to_string()))?;
    let job =
        HashMap::try_from(take(&mut ebpf, "JOB")?).map_err(|e| LoadError::Object(e.to_string()))?;
    let stacks = if t.stack_every_bytes().is_some() && attach.stacks.is_some() {
        let obj = |e: aya::maps::MapError| LoadError::Object(e.to_string());
        Some(stack_maps::StackMaps {
            stacks: aya::maps::StackTraceMap::try_from(take(&mut ebpf, "STACKS")?).map_err(obj)?,
            agg: HashMap::try_from(take(&mut ebpf, "STACK_AGG")?).map_err(obj)?,
            gpu_agg: HashMap::try_from(take(&mut ebpf, "GPU_STACK_AGG")?).map_err(obj)?,
            high: HashMap::try_from(take(&mut ebpf, "STACK_HIGH")?).map_err(obj)?,
            py_procs: HashMap::try_from(take(&mut ebpf, "PY_PROCS")?).map_err(obj)?,
            py_stacks: HashMap::try_from(take(&mut ebpf, "PY_STACKS")?).map_err(obj)?,
            copies: RingBuf::try_from(take(&mut ebpf, "STACK_COPIES")?).map_err(obj)?,
            py_exes: Some((
                HashMap::try_from(take(&mut ebpf, "PY_EXES")?).map_err(obj)?,
                HashMap::try_from(take(&mut ebpf, "EXE_OF")?).map_err(obj)?,
            )),
            exec_hold: Some(HashMap::try_from(take(&mut ebpf, "EXEC_HOLD")?).map_err(obj)?),
        })
    } else {
        None
    };
    startup.mark("maps taken");
    Ok(Loaded {
        ebpf,
        events,
        precious,
        counters,
        job,
        stacks,
        attach,
        fallbacks,
        kernel_log,
        agent_wait,
        late_faults,
        cuda_multi,
    })
}

/// Loads the object with its globals filled in, and returns it with the
/// kernel BTF that its tracing programs attach by. aya's loader parses the
/// kernel BTF when made; that copy is dropped before the one kept here is
/// parsed and handed back to it, so only one is ever held.
fn load_object(
    config: &Config,
    gpu_config: Option<&trainbpf_common::GpuConfig>,
    ring_bytes: Option<u32>,
    proc_map_entries: Option<u32>,
    stacks: bool,
) -> Result<(Ebpf, Btf), aya::EbpfError> {
    let mut loader = EbpfLoader::new();
    if full_verifier_log() {
        loader.verifier_log_level(aya::VerifierLogLevel::VERBOSE | aya::VerifierLogLevel::STATS);
    }
    loader.btf(None);
    let btf = Btf::from_sys_fs()?;
    loader.btf(Some(&btf));
    loader.override_global("CONFIG", config, true);
    // Every log call already waits on `CONFIG.ebpf_log`; aya-log's own
    // level (all, unless told) is set to match, so that none can slip by.
    let log_level: u8 = if config.ebpf_log != 0 { u8::MAX } else { 0 };
    loader.override_global(aya_log::LEVEL, &log_level, true);
    if let Some(g) = gpu_config {
        loader.override_global("GPU_CONFIG", g, true);
    }
    if let Some(r) = ring_bytes {
        loader.map_max_entries("EVENTS", r);
    }
    if let Some(n) = proc_map_entries {
        loader.map_max_entries("PROCS", n);
    }
    // Growth stacks' maps take memory only when used (the stack table
    // alone is about 1 KiB an entry).
    let (st, agg, gpu_agg, high, py_procs, py_stacks) = if stacks {
        use stack_maps::{
            AGG_MAP_ENTRIES, GPU_AGG_MAP_ENTRIES, HIGH_MAP_ENTRIES, PY_PROC_ENTRIES,
            PY_STACK_ENTRIES, STACK_MAP_ENTRIES,
        };
        (
            STACK_MAP_ENTRIES,
            AGG_MAP_ENTRIES,
            GPU_AGG_MAP_ENTRIES,
            HIGH_MAP_ENTRIES,
            PY_PROC_ENTRIES,
            PY_STACK_ENTRIES,
        )
    } else {
        (1, 1, 1, 1, 1, 1)
    };
    loader.map_max_entries("STACKS", st);
    loader.map_max_entries("STACK_AGG", agg);
    loader.map_max_entries("GPU_STACK_AGG", gpu_agg);
    loader.map_max_entries("STACK_HIGH", high);
    loader.map_max_entries("PY_PROCS", py_procs);
    loader.map_max_entries("PY_STACKS", py_stacks);
    if !stacks {
        loader.map_max_entries("PY_EXES", 1);
        loader.map_max_entries("EXE_OF", 1);
    }
    loader.map_max_entries(
        "STACK_COPIES",
        if stacks {
            stack_maps::COPY_RING_BYTES
        } else {
            config.page_size as u32
        },
    );
    let ebpf = loader.load(OBJECT)?;
    drop(loader);
    Ok((ebpf, btf))
}

/// What a recording will miss for want of a probe, one line each, for
/// `record`'s quiet start: the rest of [`describe`] is for `-v`.
pub fn missing(attach: &Attach, stacks: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut say = |what: Option<&String>, missed: &str| {
        if what.is_none() {
            out.push(format!("warning: {missed} (-v says why)"));
        }
    };
    say(
        attach.oom_victim.as_ref(),
        "no OOM kill probe: kills are named only from the kernel log",
    );
    say(
        attach.memory.as_ref(),
        "no memory probe: no process's growth is recorded",
    );
    say(
        attach.lifecycle.as_ref(),
        "no process probe: forks, execs and exits are not recorded",
    );
    if stacks {
        say(
            attach.stacks.as_ref(),
            "no growth stacks: the report names no line that grew memory",
        );
    }
    out
}

/// One line for `record -v`'s start-up message and the report: what is
/// used, and what was given up.
pub fn describe(attach: &Attach, fallbacks: &[Fallback]) -> String {
    let mut s = format!(
        "OOM kill via {}",
        attach.oom_victim.as_deref().unwrap_or("(no victim probe)")
    );
    match &attach.oom_context {
        Some(c) => s.push_str(&format!(" + {c}")),
        None => s.push_str(" (no oom_kill_process probe: kernel points/totalpages unavailable)"),
    }
    s.push_str(&format!(
        "; memory via {}",
        attach.memory.as_deref().unwrap_or("(none)")
    ));
    if let Some(st) = &attach.stacks {
        s.push_str(&format!("; growth stacks via {st}"));
    }
    if attach.ebpf_log.is_some() {
        s.push_str("; the programs' own log on (--ebpf-log)");
    }
    for f in fallbacks {
        s.push_str(&format!("\n  fallback: {} not used: {}", f.probe, f.reason));
    }
    s
}
