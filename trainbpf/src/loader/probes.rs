//! Attaching each probe at the best point the kernel allows, falling back
//! and saying why: one step per group of probes, in the order `load` runs
//! them, then the one-program helpers they share.

use crate::util::phases;
use aya::{
    Btf, Ebpf,
    programs::{BtfTracePoint, FEntry, KProbe, ProgramError, TracePoint},
};
use trainbpf_common::Config;
use trainbpf_report::recording::Attach;

use super::{LoadError, OomProbe, Tunables, why};
use crate::loader::kernel;

/// The kill context: fentry, then kprobe, on `oom_kill_process`, as
/// `--oom-probe` allows.
pub(super) fn attach_kill_context(
    ebpf: &mut Ebpf,
    btf: &Btf,
    t: &Tunables,
    attach: &mut Attach,
    fell: &mut impl FnMut(&str, String),
) {
    // Kill context.
    let fentry = "fentry:oom_kill_process";
    let kprobe = "kprobe:oom_kill_process";
    let try_fentry = matches!(t.oom_probe, OomProbe::Auto | OomProbe::Fentry);
    let try_kprobe = matches!(t.oom_probe, OomProbe::Auto | OomProbe::Kprobe);
    let first = if try_fentry {
        attach_fentry(ebpf, btf, "oom_kill_fentry", "oom_kill_process")
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
                match attach_kprobe(ebpf, "oom_kill_kprobe", "oom_kill_process") {
                    Ok(()) => attach.oom_context = Some(kprobe.into()),
                    Err(e) => fell(kprobe, e),
                }
            }
        }
    }
}

/// The victim: `tp_btf/mark_victim` where its BTF prototype passes a task
/// (`mark_victim_task`: else what BTF showed), else the classic
/// tracepoint. Fails when neither this nor the kill context
/// attached: there would be no OOM kill to record.
pub(super) fn attach_victim(
    ebpf: &mut Ebpf,
    btf: &Btf,
    tracefs: &Result<(), String>,
    mark_victim_task: &Result<(), String>,
    attach: &mut Attach,
    fell: &mut impl FnMut(&str, String),
) -> Result<(), LoadError> {
    // Victim.
    let tp_btf = "tp_btf:mark_victim";
    let classic = "tracepoint:oom:mark_victim";
    let btf_ok = match mark_victim_task {
        Ok(()) => match attach_tp_btf(ebpf, btf, "mark_victim_btf", "mark_victim") {
            Ok(()) => true,
            Err(e) => {
                fell(tp_btf, e);
                false
            }
        },
        // The program would load, and read a pid as a task_struct pointer.
        Err(why) => {
            fell(tp_btf, why.clone());
            false
        }
    };
    if btf_ok {
        attach.oom_victim = Some(tp_btf.into());
    } else {
        match attach_tp(ebpf, "mark_victim_tp", "oom", "mark_victim", tracefs) {
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
    Ok(())
}

/// The process tree (required), signals, oom_score_adj changes and
/// allocation stalls (optional).
pub(super) fn attach_lifecycle(
    ebpf: &mut Ebpf,
    btf: &Btf,
    attach: &mut Attach,
    fell: &mut impl FnMut(&str, String),
) -> Result<(), LoadError> {
    // Lifecycle: no fallback; without it there is no job tree.
    for (prog, tp) in [
        ("sched_fork", "sched_process_fork"),
        ("sched_exec", "sched_process_exec"),
        ("sched_exit", "sched_process_exit"),
    ] {
        attach_tp_btf(ebpf, btf, prog, tp).map_err(|reason| LoadError::Attach {
            probe: format!("tp_btf:{tp}"),
            reason,
        })?;
    }
    attach.lifecycle = Some("tp_btf:sched_process_{fork,exec,exit}".into());

    match attach_tp_btf(ebpf, btf, "signal_generate", "signal_generate") {
        Ok(()) => attach.signals = Some("tp_btf:signal_generate".into()),
        Err(e) => fell("tp_btf:signal_generate", e),
    }
    match attach_tp_btf(ebpf, btf, "oom_adj_update", "oom_score_adj_update") {
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
        match attach_tp_btf(ebpf, btf, prog, tp) {
            Ok(()) => stalls.push(tp),
            Err(e) => fell(&format!("tp_btf:{tp}"), e),
        }
    }
    if !stalls.is_empty() {
        attach.stalls = Some(format!("tp_btf:{}", stalls.join(",")));
    }
    Ok(())
}

/// Memory: the page probes, the page cache, forked page tables, and RSS.
pub(super) fn attach_memory(
    ebpf: &mut Ebpf,
    btf: &Btf,
    config: &Config,
    attach: &mut Attach,
    fell: &mut impl FnMut(&str, String),
) {
    // Honest growth: pages allocated and freed in each process's context.
    let mut pages = Vec::new();
    // With growth stacks, the page_alloc that takes them stands in for the
    // plain one: with them off, the page path is the same code as ever.
    let stacks = config.stack_every_pages > 0;
    let alloc = if stacks {
        "page_alloc_stacks"
    } else {
        "page_alloc"
    };
    // The page probes know a thread by its kernel stack, and a new task
    // may run on a dead one's: without a word of each new task they would
    // drop its pages (pages.rs, `task_new`), so without it they stay off.
    let new_task = attach_tp_btf(ebpf, btf, "task_new", "task_newtask");
    for (prog, tp) in [
        (alloc, "mm_page_alloc"),
        // Not mm_page_free_batched: a batched free passes through
        // free_pages_prepare too, so mm_page_free already saw it.
        ("page_free", "mm_page_free"),
    ] {
        let attached = match &new_task {
            Ok(()) => attach_tp_btf(ebpf, btf, prog, tp),
            Err(e) => Err(format!(
                "tp_btf:task_newtask, which the page probes need, could not attach: {e}"
            )),
        };
        match attached {
            Ok(()) => pages.push(tp),
            Err(e) => fell(&format!("tp_btf:{tp}"), e),
        }
    }
    if !pages.is_empty() {
        attach.pages = Some(format!("tp_btf:{}", pages.join(",")));
    }
    if stacks && pages.contains(&"mm_page_alloc") {
        // The victim's stack at death: each job thread's, at a fatal signal.
        let death = match attach_tp_btf(ebpf, btf, "signal_deliver_stack", "signal_deliver") {
            Ok(()) => "; stacks at death via tp_btf:signal_deliver",
            Err(e) => {
                fell("tp_btf:signal_deliver", e);
                ""
            }
        };
        // A new stack's copy is unwound by the files' tables where the
        // user registers could be located; else frame pointers alone.
        let how = if config.user_ip >= 0 && config.user_sp >= 0 && config.user_bp >= 0 {
            "unwind tables on a copy of the user stack, and frame pointers"
        } else {
            "user stack by frame pointers"
        };
        attach.stacks = Some(format!(
            "tp_btf:mm_page_alloc ({how}, every {} KiB of new high){death}",
            config.stack_every_pages * config.page_size / 1024
        ));
    } else if stacks {
        fell(
            "growth stacks",
            "mm_page_alloc could not be probed: no stacks".into(),
        );
    }
    // Page cache brought in by a process is not its growth: both ends, or
    // neither (one alone would drift).
    if pages.len() == 2 {
        let add = "mm_filemap_add_to_page_cache";
        let del = "mm_filemap_delete_from_page_cache";
        match attach_cache(ebpf, btf, add, del) {
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
        match attach_tp_btf(ebpf, btf, "rss_stat", "rss_stat") {
            Ok(()) => attach.memory = Some("tp_btf:rss_stat".into()),
            Err(e) => fell("tp_btf:rss_stat", e),
        }
    }
    // `attach.faults` stays null: user page faults are not counted. A probe
    // on `exceptions:page_fault_user` cost the job 5 to 8% in a fault storm,
    // and no report used the count.
}

/// The kernel log, where tracefs has the console tracepoint's format.
pub(super) fn attach_printk(
    ebpf: &mut Ebpf,
    config: &Config,
    tracefs: &Result<(), String>,
    attach: &mut Attach,
    fell: &mut impl FnMut(&str, String),
) {
    if config.tp_console_msg >= 0 {
        match attach_tp(ebpf, "printk_console", "printk", "console", tracefs) {
            Ok(()) => attach.printk = Some("tracepoint:printk:console".into()),
            Err(e) => fell("tracepoint:printk:console", e),
        }
    } else {
        fell(
            "tracepoint:printk:console",
            "no format file in tracefs".into(),
        );
    }
}

/// torchelastic's agent hold (record/torchelastic/agent_hold.rs), loaded
/// now and attached only once a worker with an error file is seen: the
/// load (the verifier, the BTF lookup) is done before the job starts, so
/// that the attach at a worker's start is one system call, in time for a
/// worker that is OOM-killed in its first tenth of a second. Returns the
/// attach point of the program loaded.
pub(super) fn load_agent_wait(ebpf: &mut Ebpf, btf: &Btf) -> Result<&'static str, String> {
    let btf_err = match program::<BtfTracePoint>(ebpf, AGENT_WAIT_BTF.0)
        .and_then(|p| phases::verify(|| p.load("sched_process_wait", btf)).map_err(|e| why(&e)))
    {
        Ok(()) => return Ok(AGENT_WAIT_BTF.1),
        Err(e) => e,
    };
    let p: &mut TracePoint = program(ebpf, AGENT_WAIT_CLASSIC.0)?;
    phases::verify(|| p.load()).map_err(|e| {
        format!(
            "{}: {btf_err}; {}: {}",
            AGENT_WAIT_BTF.1,
            AGENT_WAIT_CLASSIC.1,
            why(&e)
        )
    })?;
    Ok(AGENT_WAIT_CLASSIC.1)
}

/// Loads the late driver library probe's fault programs
/// ([`LATE_FAULTS`]), to be attached by the GPU probes: a kernel without
/// these tracepoints refuses them, and the system call
/// tracepoints stand in.
pub(super) fn load_late_faults(ebpf: &mut Ebpf, btf: &Btf) -> Result<(), String> {
    for (prog, tp) in LATE_FAULTS {
        program::<BtfTracePoint>(ebpf, prog)?
            .load(tp, btf)
            .map_err(|e| format!("tp_btf:{tp}: {}", why(&e)))?;
    }
    Ok(())
}

/// The late driver library probe's programs on the file fault
/// tracepoints, and their tracepoints.
pub const LATE_FAULTS: [(&str, &str); 2] = [
    ("late_fault", "mm_filemap_fault"),
    ("late_map_pages", "mm_filemap_map_pages"),
];

/// The agent hold's programs and their attach points: the BTF
/// tracepoint builds no trace record, so every wait on the machine pays
/// less for it; the classic one is its fallback.
pub const AGENT_WAIT_BTF: (&str, &str) = ("agent_wait_btf", "tp_btf:sched_process_wait");
pub const AGENT_WAIT_CLASSIC: (&str, &str) = ("agent_wait", "sched:sched_process_wait");

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
    phases::verify(|| p.load(func, btf)).map_err(|e| why(&e))?;
    phases::attach(|| p.attach()).map_err(|e| why(&e))?;
    Ok(())
}

fn attach_kprobe(ebpf: &mut Ebpf, prog: &str, func: &str) -> Result<(), String> {
    let p: &mut KProbe = program(ebpf, prog)?;
    phases::verify(|| p.load()).map_err(|e| why(&e))?;
    phases::attach(|| p.attach(func, 0)).map_err(|e| why(&e))?;
    Ok(())
}

fn attach_tp_btf(ebpf: &mut Ebpf, btf: &Btf, prog: &str, tp: &str) -> Result<(), String> {
    let p: &mut BtfTracePoint = program(ebpf, prog)?;
    phases::verify(|| p.load(tp, btf)).map_err(|e| why(&e))?;
    phases::attach(|| p.attach()).map_err(|e| why(&e))?;
    Ok(())
}

/// Both page-cache probes or neither: one alone would count one side.
fn attach_cache(ebpf: &mut Ebpf, btf: &Btf, add: &str, del: &str) -> Result<(), String> {
    for (prog, tp) in [("cache_add", add), ("cache_del", del)] {
        let p: &mut BtfTracePoint = program(ebpf, prog)?;
        phases::verify(|| p.load(tp, btf)).map_err(|e| why(&e))?;
    }
    let p: &mut BtfTracePoint = program(ebpf, "cache_add")?;
    let first = phases::attach(|| p.attach()).map_err(|e| why(&e))?;
    let p: &mut BtfTracePoint = program(ebpf, "cache_del")?;
    if let Err(e) = phases::attach(|| p.attach()) {
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
    phases::verify(|| p.load()).map_err(|e| why(&e))?;
    phases::attach(|| p.attach(category, name)).map_err(|e| why(&e))?;
    Ok(())
}
