//! Loads the eBPF object, fills in this kernel's offsets, and attaches each
//! probe at the best point the kernel allows, falling back and saying why.
//!
//! Choices, best first:
//! - kill context: `fentry/oom_kill_process` (5.5+, needs BPF trampolines and
//!   no lockdown veto), then `kprobe/oom_kill_process` (CONFIG_KPROBES);
//!   without either there is no `oom_control` (points, totalpages), but the
//!   victim is still caught:
//! - victim: `tp_btf/mark_victim` with a `task_struct *` (6.8+), then the
//!   classic `oom:mark_victim` tracepoint (all fields on 6.8+, `pid` alone
//!   before);
//! - lifecycle: `tp_btf/sched_process_{fork,exec,exit}` (5.5+);
//! - honest growth: `tp_btf/mm_page_{alloc,free}` (5.5+), batched per CPU;
//! - memory (RSS): read by those page probes, once per batch of a process's
//!   pages and at each page table; `tp_btf/rss_stat` (5.5+) only where they
//!   are missing, since a third program on every fault costs the job more;
//! - kernel log: `printk:console`.

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, FEntry, KProbe, ProgramError, TracePoint},
};
use trainbpf_common::{Config, Counters};

use crate::{
    kernel::{self, KernelBtf},
    recording::{Attach, Fallback},
};

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

pub struct Tunables {
    pub rss_threshold_bytes: u64,
    pub rss_relative_shift: u32,
    pub heartbeat_ms: u64,
    pub ring_bytes: u32,
    /// Entries of the per-process map (`PROCS`); a quarter is held for the
    /// job's processes.
    pub proc_map_entries: u32,
    pub oom_probe: OomProbe,
    /// `--all`: every process on the machine is the job's.
    pub all_processes: bool,
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
    pub attach: Attach,
    pub fallbacks: Vec<Fallback>,
}

/// The eBPF object, built by build.rs with aya-build.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/trainbpf"));

/// Shortens aya's errors: a verifier log can run to pages, and the first
/// line says what a user needs.
fn why(e: &ProgramError) -> String {
    let s = e.to_string();
    let first = s.lines().next().unwrap_or("").to_string();
    // aya appends "Verifier output:" and the log; an empty log says nothing.
    let first = match first.split_once(". Verifier output:") {
        Some((head, rest)) if rest.trim().is_empty() => head.to_string(),
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
    config.page_size = page_size as i64;
    config.procs_max = i64::from(t.proc_map_entries);
    config.procs_job_reserve = i64::from(t.proc_map_entries / 4);
    Ok(config)
}

/// The offsets and facts `load` reads from the kernel's BTF. Parsing it
/// (btf-rs, the whole of vmlinux's types) peaks near 50 MB, which would stay
/// the recorder's high-water mark for days: a short-lived child does it and
/// hands back the few bytes that matter. Without a child (fork refused), it
/// is done here.
fn btf_facts(t: &Tunables, page_size: u64) -> Result<(Config, bool), LoadError> {
    let facts = || -> Result<(Config, bool), LoadError> {
        let kbtf = KernelBtf::open()?;
        let config = config(&kbtf, t, page_size)?;
        Ok((config, kbtf.tp_first_arg_is("mark_victim", "task_struct")))
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
                Ok((c, has_task)) => {
                    let mut m = vec![0u8, u8::from(has_task)];
                    m.extend_from_slice(&crate::decode::pod_bytes(&c));
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
                (Ok(_), Some(0)) if msg.len() == 2 + size_of::<Config>() => {
                    // SAFETY: Config is plain #[repr(C)] integers, and the
                    // bytes are exactly one, written by the same binary.
                    let c: Config =
                        unsafe { std::ptr::read_unaligned(msg[2..].as_ptr() as *const Config) };
                    Ok((c, msg[1] != 0))
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

pub fn load(t: &Tunables, page_size: u64) -> Result<Loaded, LoadError> {
    // Mounted first, here: the child reads tracepoint layouts from it.
    let tracefs = kernel::ensure_tracefs();
    let (mut config, mark_victim_has_task) = btf_facts(t, page_size)?;
    // Signals sent to the recorder are kept too: it passes them on to the
    // job, and the kernel's record of who sent them is the evidence. Set
    // here, not in `config`, which may run in a child.
    config.recorder_tgid = i64::from(std::process::id());
    // The Xid tracepoint's layout, from tracefs (mounted above).
    let gpu_config = crate::gpu::config();

    let (mut ebpf, btf) = load_object(
        &config,
        Some(&gpu_config),
        Some(t.ring_bytes),
        Some(t.proc_map_entries),
    )
    .map_err(|e| LoadError::Object(e.to_string()))?;

    let mut attach = Attach::default();
    let mut fallbacks = Vec::new();
    let mut fell = |probe: &str, reason: String| {
        fallbacks.push(Fallback {
            probe: probe.to_string(),
            reason,
        })
    };

    // Kill context.
    let fentry = "fentry:oom_kill_process";
    let kprobe = "kprobe:oom_kill_process";
    let try_fentry = matches!(t.oom_probe, OomProbe::Auto | OomProbe::Fentry);
    let try_kprobe = matches!(t.oom_probe, OomProbe::Auto | OomProbe::Kprobe);
    let first = if try_fentry {
        attach_fentry(&mut ebpf, &btf, "oom_kill_fentry", "oom_kill_process")
    } else {
        Err(format!("skipped (--oom-probe {:?})", t.oom_probe).to_lowercase())
    };
    match first {
        Ok(()) => attach.oom_context = Some(fentry.into()),
        Err(e) => {
            fell(fentry, e);
            if !try_kprobe {
                fell(
                    kprobe,
                    format!("skipped (--oom-probe {:?})", t.oom_probe).to_lowercase(),
                );
            } else if !kernel::kprobes_available() {
                fell(
                    kprobe,
                    "kernel has no kprobes (CONFIG_KPROBES unset: /sys/bus/event_source/devices/kprobe missing)"
                        .into(),
                );
            } else {
                match attach_kprobe(&mut ebpf, "oom_kill_kprobe", "oom_kill_process") {
                    Ok(()) => attach.oom_context = Some(kprobe.into()),
                    Err(e) => fell(kprobe, e),
                }
            }
        }
    }

    // Victim.
    let tp_btf = "tp_btf:mark_victim";
    let classic = "tracepoint:oom:mark_victim";
    let btf_ok = if mark_victim_has_task {
        match attach_tp_btf(&mut ebpf, &btf, "mark_victim_btf", "mark_victim") {
            Ok(()) => true,
            Err(e) => {
                fell(tp_btf, e);
                false
            }
        }
    } else {
        fell(
            tp_btf,
            "this kernel's mark_victim passes a pid, not a task_struct (before 6.8)".into(),
        );
        false
    };
    if btf_ok {
        attach.oom_victim = Some(tp_btf.into());
    } else {
        match attach_tp(&mut ebpf, "mark_victim_tp", "oom", "mark_victim", &tracefs) {
            Ok(()) => attach.oom_victim = Some(classic.into()),
            Err(e) => fell(classic, e),
        }
    }
    if attach.oom_context.is_none() && attach.oom_victim.is_none() {
        return Err(LoadError::Attach {
            probe: "any OOM-kill probe".into(),
            reason: "none of fentry, kprobe, tp_btf or tracepoint could attach".into(),
        });
    }

    // Lifecycle: no fallback; without it there is no job tree.
    for (prog, tp) in [
        ("sched_fork", "sched_process_fork"),
        ("sched_exec", "sched_process_exec"),
        ("sched_exit", "sched_process_exit"),
    ] {
        attach_tp_btf(&mut ebpf, &btf, prog, tp).map_err(|reason| LoadError::Attach {
            probe: format!("tp_btf:{tp}"),
            reason,
        })?;
    }
    attach.lifecycle = Some("tp_btf:sched_process_{fork,exec,exit}".into());

    match attach_tp_btf(&mut ebpf, &btf, "signal_generate", "signal_generate") {
        Ok(()) => attach.signals = Some("tp_btf:signal_generate".into()),
        Err(e) => fell("tp_btf:signal_generate", e),
    }
    match attach_tp_btf(&mut ebpf, &btf, "oom_adj_update", "oom_score_adj_update") {
        Ok(()) => attach.oom_score_adj = Some("tp_btf:oom_score_adj_update".into()),
        Err(e) => fell("tp_btf:oom_score_adj_update", e),
    }
    // Allocation stalls: optional; the report says when they are missing.
    let mut stalls = Vec::new();
    for (prog, tp) in [
        ("direct_reclaim_begin", "mm_vmscan_direct_reclaim_begin"),
        ("direct_reclaim_end", "mm_vmscan_direct_reclaim_end"),
        ("memcg_reclaim_begin", "mm_vmscan_memcg_reclaim_begin"),
        ("memcg_reclaim_end", "mm_vmscan_memcg_reclaim_end"),
        ("compaction_begin", "mm_compaction_begin"),
        ("compaction_end", "mm_compaction_end"),
    ] {
        match attach_tp_btf(&mut ebpf, &btf, prog, tp) {
            Ok(()) => stalls.push(tp),
            Err(e) => fell(&format!("tp_btf:{tp}"), e),
        }
    }
    if !stalls.is_empty() {
        attach.stalls = Some(format!("tp_btf:{}", stalls.join(",")));
    }
    // Honest growth: pages allocated and freed in each process's context.
    let mut pages = Vec::new();
    for (prog, tp) in [
        ("page_alloc", "mm_page_alloc"),
        // Not mm_page_free_batched: a batched free passes through
        // free_pages_prepare too, so mm_page_free already saw it.
        ("page_free", "mm_page_free"),
    ] {
        match attach_tp_btf(&mut ebpf, &btf, prog, tp) {
            Ok(()) => pages.push(tp),
            Err(e) => fell(&format!("tp_btf:{tp}"), e),
        }
    }
    if !pages.is_empty() {
        attach.pages = Some(format!("tp_btf:{}", pages.join(",")));
    }
    // Page cache brought in by a process is not its growth: both ends, or
    // neither (one alone would drift).
    if pages.len() == 2 {
        let add = "mm_filemap_add_to_page_cache";
        let del = "mm_filemap_delete_from_page_cache";
        match attach_cache(&mut ebpf, &btf, add, del) {
            Ok(()) => attach.page_cache = Some(format!("tp_btf:{add},{del}")),
            Err(e) => fell(&format!("tp_btf:{add}"), e),
        }
        // A forked child's page tables, allocated in the parent's
        // context, are taken back out of it at sched_process_fork.
        if config.mm_pgtables_bytes >= 0 {
            attach.forks = Some("tp_btf:sched_process_fork (the child's page tables)".into());
        }
    }
    // RSS: read by the page probes at each batch of a process's pages and at
    // each page table it allocates. `rss_stat` would see every counter
    // move, but a third program on every fault cost a fork storm over 5%
    // (BENCHMARKS.md); it stands in only where the page probes are missing.
    if pages.len() == 2 {
        attach.memory = Some(RSS_VIA_PAGES.into());
    } else {
        match attach_tp_btf(&mut ebpf, &btf, "rss_stat", "rss_stat") {
            Ok(()) => attach.memory = Some("tp_btf:rss_stat".into()),
            Err(e) => fell("tp_btf:rss_stat", e),
        }
    }
    // `attach.faults` stays null: user page faults are not counted. A probe
    // on `exceptions:page_fault_user` cost the job 5 to 8% in a fault storm,
    // and no report used the count.
    if config.tp_console_msg >= 0 {
        match attach_tp(&mut ebpf, "printk_console", "printk", "console", &tracefs) {
            Ok(()) => attach.printk = Some("tracepoint:printk:console".into()),
            Err(e) => fell("tracepoint:printk:console", e),
        }
    } else {
        fell(
            "tracepoint:printk:console",
            "no format file in tracefs".into(),
        );
    }

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
    Ok(Loaded {
        ebpf,
        events,
        precious,
        counters,
        job,
        attach,
        fallbacks,
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
) -> Result<(Ebpf, Btf), aya::EbpfError> {
    let mut loader = EbpfLoader::new();
    loader.btf(None);
    let btf = Btf::from_sys_fs()?;
    loader.btf(Some(&btf));
    loader.override_global("CONFIG", config, true);
    if let Some(g) = gpu_config {
        loader.override_global("GPU_CONFIG", g, true);
    }
    if let Some(r) = ring_bytes {
        loader.map_max_entries("EVENTS", r);
    }
    if let Some(n) = proc_map_entries {
        loader.map_max_entries("PROCS", n);
    }
    let ebpf = loader.load(OBJECT)?;
    drop(loader);
    Ok((ebpf, btf))
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, String>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let p = ebpf
        .program_mut(name)
        .ok_or_else(|| format!("program {name} missing from the object"))?;
    p.try_into().map_err(|e: ProgramError| why(&e))
}

/// `attach.memory` when the page probes read the RSS counters.
pub const RSS_VIA_PAGES: &str =
    "tp_btf:mm_page_alloc,mm_page_free (RSS read per 256 pages, or 8 with a page table)";

fn attach_fentry(ebpf: &mut Ebpf, btf: &Btf, prog: &str, func: &str) -> Result<(), String> {
    let p: &mut FEntry = program(ebpf, prog)?;
    p.load(func, btf).map_err(|e| why(&e))?;
    p.attach().map_err(|e| why(&e))?;
    Ok(())
}

fn attach_kprobe(ebpf: &mut Ebpf, prog: &str, func: &str) -> Result<(), String> {
    let p: &mut KProbe = program(ebpf, prog)?;
    p.load().map_err(|e| why(&e))?;
    p.attach(func, 0).map_err(|e| why(&e))?;
    Ok(())
}

fn attach_tp_btf(ebpf: &mut Ebpf, btf: &Btf, prog: &str, tp: &str) -> Result<(), String> {
    let p: &mut BtfTracePoint = program(ebpf, prog)?;
    p.load(tp, btf).map_err(|e| why(&e))?;
    p.attach().map_err(|e| why(&e))?;
    Ok(())
}

/// Both page-cache probes or neither: one alone would count one side.
fn attach_cache(ebpf: &mut Ebpf, btf: &Btf, add: &str, del: &str) -> Result<(), String> {
    for (prog, tp) in [("cache_add", add), ("cache_del", del)] {
        let p: &mut BtfTracePoint = program(ebpf, prog)?;
        p.load(tp, btf).map_err(|e| why(&e))?;
    }
    let p: &mut BtfTracePoint = program(ebpf, "cache_add")?;
    let first = p.attach().map_err(|e| why(&e))?;
    let p: &mut BtfTracePoint = program(ebpf, "cache_del")?;
    if let Err(e) = p.attach() {
        let p: &mut BtfTracePoint = program(ebpf, "cache_add")?;
        let _ = p.detach(first);
        return Err(why(&e));
    }
    Ok(())
}

fn attach_tp(
    ebpf: &mut Ebpf,
    prog: &str,
    category: &str,
    name: &str,
    tracefs: &Result<(), String>,
) -> Result<(), String> {
    if let Err(e) = tracefs {
        return Err(format!("tracefs unavailable: {e}"));
    }
    let p: &mut TracePoint = program(ebpf, prog)?;
    p.load().map_err(|e| why(&e))?;
    p.attach(category, name).map_err(|e| why(&e))?;
    Ok(())
}

/// One line for `record`'s start-up message and the report: what is used,
/// and what was given up.
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
    for f in fallbacks {
        s.push_str(&format!("\n  fallback: {} not used: {}", f.probe, f.reason));
    }
    s
}

/// Why a feature probed by [`probe_features`] is unavailable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The kernel refused with EPERM or EACCES: missing privileges, a
    /// security policy, or a kernel that forbids this program type.
    Denied(String),
    /// The kernel does not have it (not configured, or too old).
    Missing(String),
    /// It failed for another reason.
    Failed(String),
}

impl Unavailable {
    pub fn reason(&self) -> &str {
        match self {
            Unavailable::Denied(r) | Unavailable::Missing(r) | Unavailable::Failed(r) => r,
        }
    }

    /// Classifies by the errno found in the error's source chain, so that
    /// "the kernel said no" (EPERM) reads differently from a real failure.
    fn from_error(e: &(dyn std::error::Error + 'static), reason: String) -> Self {
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(io) = err.downcast_ref::<std::io::Error>()
                && matches!(io.raw_os_error(), Some(libc::EPERM | libc::EACCES))
            {
                return Unavailable::Denied(reason);
            }
            cur = err.source();
        }
        Unavailable::Failed(reason)
    }
}

/// The outcome of trying one feature.
pub type Probe = Result<(), Unavailable>;

/// What this kernel lets trainbpf do, found by trying it with the real
/// object rather than guessing from version numbers: fentry in particular
/// can be compiled in and still be refused (EPERM) at load time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Features {
    /// `fentry/oom_kill_process`, loaded and attached.
    pub fentry: Probe,
    /// `kprobe/oom_kill_process`, loaded and attached.
    pub kprobe: Probe,
    /// `tp_btf/mark_victim` with a `task_struct *` (6.8+).
    pub tp_btf: Probe,
    /// The classic `oom:mark_victim` tracepoint (needs tracefs).
    pub tracepoint: Probe,
    /// A BPF ring buffer map (5.8+).
    pub ringbuf: Probe,
    /// Fields of the classic `oom:mark_victim` record: `pid` alone before
    /// 6.8, the victim's memory figures since. Empty when tracefs is absent.
    pub mark_victim_fields: Vec<String>,
}

/// Loads the object with the same `CONFIG` fill as [`load`] and tries each
/// OOM attach point. Needs the privileges `record` needs; without them every
/// probe reads [`Unavailable::Denied`]. Nothing stays attached: the links
/// and maps go when the `Ebpf` is dropped on return.
pub fn probe_features() -> Features {
    // Mounted first: the classic tracepoint's fields are read from it.
    let tracefs = kernel::ensure_tracefs();
    let fields: Vec<String> = kernel::tp_format("oom", "mark_victim")
        .map(|f| f.into_iter().map(|f| f.name).collect())
        .unwrap_or_default();
    let all_fail = |why: Unavailable| Features {
        fentry: Err(why.clone()),
        kprobe: Err(why.clone()),
        tp_btf: Err(why.clone()),
        tracepoint: Err(why.clone()),
        ringbuf: ringbuf_supported(),
        mark_victim_fields: fields.clone(),
    };
    let kbtf = match KernelBtf::open() {
        Ok(k) => k,
        Err(e) => return all_fail(Unavailable::Missing(e.to_string())),
    };
    // Thresholds don't matter here: nothing is recorded.
    let t = Tunables {
        rss_threshold_bytes: 4 << 20,
        rss_relative_shift: 6,
        heartbeat_ms: 5000,
        ring_bytes: 0,
        proc_map_entries: DEFAULT_PROC_MAP_ENTRIES,
        oom_probe: OomProbe::Auto,
        all_processes: false,
    };
    let config = match config(&kbtf, &t, 4096) {
        Ok(c) => c,
        Err(e) => return all_fail(Unavailable::Missing(e.to_string())),
    };
    // The object's own ring size (the record default), so the ring buffer
    // map is created just as `record` creates it.
    let mut ebpf = match EbpfLoader::new()
        .override_global("CONFIG", &config, true)
        .load(OBJECT)
    {
        Ok(e) => e,
        Err(e) => {
            let why = format!("loading the eBPF object: {e}");
            return all_fail(Unavailable::from_error(&e, why));
        }
    };
    let btf = match Btf::from_sys_fs() {
        Ok(b) => b,
        Err(e) => return all_fail(Unavailable::Missing(format!("aya BTF: {e}"))),
    };

    let fentry = tried(
        probe_program::<FEntry>(&mut ebpf, "oom_kill_fentry").and_then(
            |p| -> Result<(), ProbeErr> {
                p.load("oom_kill_process", &btf)?;
                p.attach()?;
                Ok(())
            },
        ),
    );
    let kprobe = if !kernel::kprobes_available() {
        Err(Unavailable::Missing(
            "CONFIG_KPROBES unset: /sys/bus/event_source/devices/kprobe missing".into(),
        ))
    } else {
        tried(
            probe_program::<KProbe>(&mut ebpf, "oom_kill_kprobe").and_then(
                |p| -> Result<(), ProbeErr> {
                    p.load()?;
                    p.attach("oom_kill_process", 0)?;
                    Ok(())
                },
            ),
        )
    };
    // Same test as `load`: before 6.8 the program would load but read a
    // pid as if it were a task_struct pointer.
    let tp_btf = if !kbtf.tp_first_arg_is("mark_victim", "task_struct") {
        Err(Unavailable::Missing(
            "this kernel's mark_victim passes a pid, not a task_struct (before 6.8)".into(),
        ))
    } else {
        tried(
            probe_program::<BtfTracePoint>(&mut ebpf, "mark_victim_btf").and_then(
                |p| -> Result<(), ProbeErr> {
                    p.load("mark_victim", &btf)?;
                    p.attach()?;
                    Ok(())
                },
            ),
        )
    };
    let tracepoint = match &tracefs {
        Err(e) => Err(Unavailable::Missing(format!("tracefs unavailable: {e}"))),
        Ok(()) => tried(
            probe_program::<TracePoint>(&mut ebpf, "mark_victim_tp").and_then(
                |p| -> Result<(), ProbeErr> {
                    p.load()?;
                    p.attach("oom", "mark_victim")?;
                    Ok(())
                },
            ),
        ),
    };
    // The object holds EVENTS, a ring buffer: it loaded, so the map exists.
    let ringbuf = match ebpf.map("EVENTS") {
        Some(aya::maps::Map::RingBuf(_)) => Ok(()),
        _ => Err(Unavailable::Failed(
            "the object's EVENTS ring buffer is missing".into(),
        )),
    };
    Features {
        fentry,
        kprobe,
        tp_btf,
        tracepoint,
        ringbuf,
        mark_victim_fields: fields,
    }
}

/// A program of the object as its concrete type, for [`probe_features`]:
/// errors stay [`ProgramError`]s so their errno can be classified.
fn probe_program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, ProbeErr>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let p = ebpf
        .program_mut(name)
        .ok_or_else(|| ProbeErr::Missing(format!("program {name} missing from the object")))?;
    Ok(p.try_into()?)
}

/// An error while probing: aya's, or a program the object lacks.
enum ProbeErr {
    Program(ProgramError),
    Missing(String),
}

impl From<ProgramError> for ProbeErr {
    fn from(e: ProgramError) -> Self {
        ProbeErr::Program(e)
    }
}

fn tried(r: Result<(), ProbeErr>) -> Probe {
    match r {
        Ok(()) => Ok(()),
        Err(ProbeErr::Program(e)) => Err(Unavailable::from_error(&e, why(&e))),
        Err(ProbeErr::Missing(m)) => Err(Unavailable::Failed(m)),
    }
}

/// Asks the kernel for a ring buffer map alone, for when the object did not
/// load and so says nothing about ring buffers.
fn ringbuf_supported() -> Probe {
    match aya::sys::is_map_supported(aya::maps::MapType::RingBuf) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Unavailable::Missing(
            "the kernel has no BPF ring buffer (5.8+)".into(),
        )),
        Err(e) => {
            let why = e.to_string();
            Err(Unavailable::from_error(&e, why))
        }
    }
}
