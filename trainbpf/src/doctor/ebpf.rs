//! The eBPF checks: tracefs, BTF, kprobes, fentry, tp_btf, lockdown, the
//! ring buffer, and what `record` will attach given all of them.

use std::fs;

use super::{Check, Mount, Status, check, needs_root, selected};
use crate::{
    loader::kernel,
    loader::{Features, Probe, Unavailable},
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TracefsFacts {
    /// Already mounted at /sys/kernel/tracing.
    Mounted,
    /// Was not mounted; doctor (as root) mounted it.
    MountedNow,
    /// Not mounted, and not root to try.
    NotMounted,
    /// Not mounted, and mounting failed.
    Unavailable(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockdownFacts {
    /// `/sys/kernel/security/lockdown`, e.g. `none [integrity] confidentiality`.
    Read {
        text: String,
        mounted_now: bool,
    },
    /// securityfs is there but has no lockdown file: no lockdown LSM.
    NoLsm,
    /// securityfs is not mounted and mounting it needs root.
    NeedsRoot,
    Error(String),
}

fn probe_state(p: &Probe) -> &'static str {
    match p {
        Ok(()) => "available",
        Err(Unavailable::Denied(_)) => "denied",
        Err(Unavailable::Missing(_)) => "absent",
        Err(Unavailable::Failed(_)) => "failed",
    }
}

fn probe_finding(p: &Probe, ok: &str) -> String {
    match p {
        Ok(()) => ok.to_string(),
        Err(Unavailable::Denied(r)) => format!("denied: {r}"),
        Err(Unavailable::Missing(r)) => format!("absent: {r}"),
        Err(Unavailable::Failed(r)) => format!("failed: {r}"),
    }
}

pub fn check_tracefs(t: &TracefsFacts) -> Check {
    let id = "tracefs";
    let why = "classic tracepoints (printk:console, and oom:mark_victim where tp_btf can't be used) and their field layouts live in tracefs; tp_btf programs don't need it";
    match t {
        TracefsFacts::Mounted => check(
            id,
            Status::Ok,
            "mounted",
            format!("mounted at {}", kernel::TRACEFS),
            why,
            "",
        ),
        TracefsFacts::MountedNow => check(
            id,
            Status::Ok,
            "mountable",
            format!(
                "was not mounted; doctor mounted it at {} (record does the same)",
                kernel::TRACEFS
            ),
            why,
            "",
        ),
        TracefsFacts::NotMounted => check(
            id,
            Status::Info,
            "not_checked",
            format!(
                "not mounted at {}; mounting it needs root (record, run as root, mounts it)",
                kernel::TRACEFS
            ),
            why,
            "run `sudo trainbpf doctor`, or `sudo mount -t tracefs tracefs /sys/kernel/tracing`",
        ),
        TracefsFacts::Unavailable(e) => check(
            id,
            Status::Warn,
            "unavailable",
            format!("not mounted and not mountable: {e}"),
            why,
            "a kernel with CONFIG_TRACING; in a container, bind-mount the host's /sys/kernel/tracing",
        ),
    }
}

pub fn check_btf(btf: &Result<(), String>) -> Check {
    let id = "btf";
    let why = "trainbpf reads kernel structs at offsets it looks up in the kernel's BTF at start (Rust emits no CO-RE relocations), and tp_btf/fentry need it";
    match btf {
        Ok(()) => check(
            id,
            Status::Ok,
            "available",
            format!(
                "{} present; every struct offset record needs resolved",
                kernel::VMLINUX_BTF
            ),
            why,
            "",
        ),
        Err(e) => check(
            id,
            Status::Fail,
            "absent",
            e.clone(),
            why,
            "a kernel built with CONFIG_DEBUG_INFO_BTF=y (standard in distribution kernels since about 5.4)",
        ),
    }
}

/// Whether the kill context is covered by the other probe, which makes the
/// missing one a note rather than a warning.
fn other_works(p: Option<&Probe>) -> Status {
    if matches!(p, Some(Ok(()))) {
        Status::Info
    } else {
        Status::Warn
    }
}

const CONTEXT_WHY: &str = "a probe on oom_kill_process gives the kernel's own view of the kill: badness points, totalpages, the OOM constraint and memcg, and the task whose allocation triggered it; record tries fentry, then kprobe";

pub fn check_kprobes(pmu: bool, f: Option<&Features>) -> Check {
    let id = "kprobes";
    let fix =
        "a kernel with CONFIG_KPROBES=y (most distribution kernels); not needed where fentry works";
    if !pmu {
        return check(
            id,
            other_works(f.map(|f| &f.fentry)),
            "absent",
            "absent: CONFIG_KPROBES is not set (/sys/bus/event_source/devices/kprobe missing)",
            CONTEXT_WHY,
            fix,
        );
    }
    let Some(f) = f else {
        return check(
            id,
            Status::Info,
            "present",
            "kprobe PMU present; attaching to oom_kill_process needs root: not tried",
            CONTEXT_WHY,
            "run `sudo trainbpf doctor`",
        );
    };
    check(
        id,
        match &f.kprobe {
            Ok(()) => Status::Ok,
            Err(_) => other_works(Some(&f.fentry)),
        },
        probe_state(&f.kprobe),
        probe_finding(&f.kprobe, "available: kprobe/oom_kill_process attaches"),
        CONTEXT_WHY,
        if f.kprobe.is_ok() { "" } else { fix },
    )
}

pub fn check_fentry(f: Option<&Features>) -> Check {
    let id = "fentry";
    let Some(f) = f else {
        return needs_root(id, "loading fentry/oom_kill_process", CONTEXT_WHY);
    };
    let status = match &f.fentry {
        Ok(()) => Status::Ok,
        Err(_) => other_works(Some(&f.kprobe)),
    };
    check(
        id,
        status,
        probe_state(&f.fentry),
        probe_finding(
            &f.fentry,
            "available: fentry/oom_kill_process loads and attaches",
        ),
        CONTEXT_WHY,
        match &f.fentry {
            Ok(()) => "",
            Err(Unavailable::Denied(_)) => {
                "the kernel refuses BPF trampolines here (a restricted or hardened kernel, an LSM policy); record falls back to kprobe, then to the victim tracepoint alone"
            }
            Err(_) => {
                "fentry needs 5.5+ with BTF and BPF trampolines (x86-64, arm64 since 6.0); record falls back to kprobe"
            }
        },
    )
}

pub fn check_tp_btf(f: Option<&Features>) -> Check {
    let id = "tp_btf";
    let why = "tp_btf/mark_victim hands record the victim's task_struct at the moment it is chosen (where the kernel's BTF says the tracepoint passes one: upstream 6.8+, and backports such as Debian's 6.1); record's process-lifecycle and memory probes are tp_btf too";
    let Some(f) = f else {
        return needs_root(id, "loading tp_btf/mark_victim", why);
    };
    let (status, fix) = match &f.tp_btf {
        Ok(()) => (Status::Ok, ""),
        // BTF says mark_victim passes no task_struct (upstream before 6.8,
        // unless backported): record falls back to the classic tracepoint; the
        // sched_process_* tp_btf probes still work.
        Err(Unavailable::Missing(_)) => (
            Status::Warn,
            "record uses the classic oom:mark_victim tracepoint instead; a kernel whose mark_victim passes the task_struct (upstream 6.8+, or a backport) gives it",
        ),
        Err(_) => (
            Status::Fail,
            "record's lifecycle probes (tp_btf/sched_process_*) have no fallback: it needs BTF-enabled raw tracepoints (5.5+) and permission to load them",
        ),
    };
    check(
        id,
        status,
        probe_state(&f.tp_btf),
        probe_finding(
            &f.tp_btf,
            "available: tp_btf/mark_victim (task_struct prototype) loads and attaches",
        ),
        why,
        fix,
    )
}

pub fn check_lockdown(l: &LockdownFacts) -> Check {
    let id = "lockdown";
    let why = "kernel lockdown's confidentiality mode forbids BPF reads of kernel memory, kprobes and tracefs, all of which record needs; integrity mode blocks only writes (bpf_probe_write_user), which trainbpf does not use";
    match l {
        LockdownFacts::Read { text, mounted_now } => {
            let mode = selected(text).unwrap_or("unknown");
            let note = if *mounted_now {
                " (doctor mounted securityfs at /sys/kernel/security to read it)"
            } else {
                ""
            };
            let (status, fix) = match mode {
                "none" | "integrity" => (Status::Ok, ""),
                "confidentiality" => (
                    Status::Fail,
                    "boot with lockdown=integrity or none (Secure Boot kernels may force confidentiality)",
                ),
                _ => (Status::Info, ""),
            };
            check(id, status, mode, format!("{mode}{note}"), why, fix)
        }
        LockdownFacts::NoLsm => check(
            id,
            Status::Ok,
            "none",
            "no lockdown LSM in this kernel (securityfs has no lockdown file)",
            why,
            "",
        ),
        LockdownFacts::NeedsRoot => check(
            id,
            Status::Info,
            "not_checked",
            "not checked: securityfs is not mounted and mounting it needs root",
            why,
            "run `sudo trainbpf doctor`, or read /sys/kernel/security/lockdown",
        ),
        LockdownFacts::Error(e) => check(id, Status::Info, "unknown", e.clone(), why, ""),
    }
}

pub fn check_ringbuf(f: Option<&Features>) -> Check {
    let id = "ringbuf";
    let why = "every event reaches record through one BPF ring buffer (5.8+); there is no perf-buffer fallback";
    let Some(f) = f else {
        return needs_root(id, "creating a BPF ring buffer", why);
    };
    check(
        id,
        if f.ringbuf.is_ok() {
            Status::Ok
        } else {
            Status::Fail
        },
        probe_state(&f.ringbuf),
        probe_finding(
            &f.ringbuf,
            "available: the object's ring buffer map was created",
        ),
        why,
        if f.ringbuf.is_ok() {
            ""
        } else {
            "a 5.8+ kernel"
        },
    )
}

/// What `record` will use, in the order `loader::load` tries (keep the two
/// in step): fentry then kprobe for the kill context, tp_btf then the
/// classic tracepoint for the victim.
pub fn check_record(
    btf: &Result<(), String>,
    lockdown: &LockdownFacts,
    f: Option<&Features>,
) -> Check {
    let id = "record";
    if let Err(e) = btf {
        return check(
            id,
            Status::Fail,
            "unavailable",
            format!("record can't run: {e}"),
            "record needs kernel BTF",
            "see the btf check",
        );
    }
    if let LockdownFacts::Read { text, .. } = lockdown
        && selected(text) == Some("confidentiality")
    {
        return check(
            id,
            Status::Fail,
            "unavailable",
            "record can't run under lockdown=confidentiality",
            "record reads kernel memory from BPF, which that mode forbids",
            "see the lockdown check",
        );
    }
    let Some(f) = f else {
        return needs_root(
            id,
            "finding what record can attach",
            "which probes record can use decides what the report can say about a kill",
        );
    };
    if let Err(e) = &f.ringbuf {
        return check(
            id,
            Status::Fail,
            "unavailable",
            format!("record can't run: no ring buffer ({})", e.reason()),
            "every event reaches record through the ring buffer",
            "see the ringbuf check",
        );
    }
    if let Err(e @ (Unavailable::Denied(_) | Unavailable::Failed(_))) = &f.tp_btf {
        return check(
            id,
            Status::Fail,
            "unavailable",
            format!(
                "record can't run: tp_btf programs don't load ({})",
                e.reason()
            ),
            "process lifecycle comes from tp_btf/sched_process_*, which have no fallback",
            "see the tp_btf check",
        );
    }
    let context = if f.fentry.is_ok() {
        Some("fentry:oom_kill_process")
    } else if f.kprobe.is_ok() {
        Some("kprobe:oom_kill_process")
    } else {
        None
    };
    let victim = if f.tp_btf.is_ok() {
        Some("tp_btf:mark_victim")
    } else if f.tracepoint.is_ok() {
        Some("tracepoint:oom:mark_victim")
    } else {
        None
    };
    let finding = match (victim, context) {
        (Some(v), Some(c)) => format!("OOM kill via {v} + {c}"),
        (Some(v), None) => format!("OOM kill via {v}; no oom_kill_process probe"),
        (None, Some(c)) => format!("OOM kill via {c}; no mark_victim probe"),
        (None, None) => {
            return check(
                id,
                Status::Fail,
                "unavailable",
                "record can't run: none of fentry, kprobe, tp_btf or the oom:mark_victim tracepoint is usable",
                "with no probe on the OOM path there is no kill to record",
                "see the fentry, kprobes, tp_btf and tracefs checks",
            );
        }
    };
    let mut lost = Vec::new();
    let mut fixes = Vec::new();
    if context.is_none() {
        lost.push(format!(
            "without fentry ({}) or kprobe ({}) on oom_kill_process, the kernel's badness points, totalpages, the OOM constraint and the task that triggered the kill are not recorded; only a reconstruction from tracked memory can rank the candidates",
            probe_state(&f.fentry),
            probe_state(&f.kprobe)
        ));
        fixes.push("a kernel with kprobes (CONFIG_KPROBES=y) or one that allows fentry gives the kernel's own figures");
    }
    if victim == Some("tracepoint:oom:mark_victim")
        && !f.mark_victim_fields.iter().any(|n| n == "anon_rss")
    {
        lost.push(
            "this kernel's oom:mark_victim carries only the pid (its format has no anon_rss): the victim's RSS and oom_score_adj at the kill come from the last tracked figures".to_string(),
        );
        fixes.push("a kernel whose oom:mark_victim carries the victim's figures (upstream 6.8+, or a backport) gives them at the kill");
    }
    let full = lost.is_empty();
    check(
        id,
        if full { Status::Ok } else { Status::Warn },
        if full { "full" } else { "partial" },
        finding,
        if full {
            "nothing is lost: the kernel's own figures and the victim's are both recorded"
                .to_string()
        } else {
            lost.join("; ")
        },
        fixes.join("; "),
    )
}

pub(super) fn gather_tracefs(root: bool, mounts: &[Mount]) -> TracefsFacts {
    if mounts
        .iter()
        .any(|m| m.fstype == "tracefs" && m.mount_point == kernel::TRACEFS)
    {
        return TracefsFacts::Mounted;
    }
    if !root {
        return TracefsFacts::NotMounted;
    }
    match kernel::ensure_tracefs() {
        Ok(()) => TracefsFacts::MountedNow,
        Err(e) => TracefsFacts::Unavailable(e),
    }
}

pub(super) fn gather_lockdown(root: bool, mounts: &[Mount]) -> LockdownFacts {
    const SECURITYFS: &str = "/sys/kernel/security";
    let mut mounted_now = false;
    if !mounts
        .iter()
        .any(|m| m.fstype == "securityfs" && m.mount_point == SECURITYFS)
    {
        if !root {
            return LockdownFacts::NeedsRoot;
        }
        if let Err(e) = nix::mount::mount(
            Some("securityfs"),
            SECURITYFS,
            Some("securityfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        ) {
            return LockdownFacts::Error(format!("mounting securityfs at {SECURITYFS}: {e}"));
        }
        mounted_now = true;
    }
    match fs::read_to_string(format!("{SECURITYFS}/lockdown")) {
        Ok(text) => LockdownFacts::Read { text, mounted_now },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => LockdownFacts::NoLsm,
        Err(e) => LockdownFacts::Error(format!("{SECURITYFS}/lockdown: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::testdata::*;

    #[test]
    fn old_kernel_uses_kprobe_context_and_the_pid_only_tracepoint() {
        let f = features_5_10();
        let r = check_record(&Ok(()), &LockdownFacts::NoLsm, Some(&f));
        assert_eq!(
            r.finding.split(';').next(),
            Some("OOM kill via tracepoint:oom:mark_victim + fentry:oom_kill_process")
        );
        assert_eq!(r.state, "partial");
        assert!(r.why.contains("only the pid"), "{}", r.why);
        let t = check_tp_btf(Some(&f));
        assert_eq!((t.state.as_str(), t.status), ("absent", Status::Warn));
        // fentry works there, so a missing kprobe is only a note.
        let k = check_kprobes(false, Some(&f));
        assert_eq!(k.status, Status::Info);
    }

    #[test]
    fn kprobe_alone_gives_the_full_picture() {
        let f = Features {
            fentry: denied(),
            kprobe: Ok(()),
            ..features_6_18()
        };
        let r = check_record(&Ok(()), &LockdownFacts::NoLsm, Some(&f));
        assert_eq!((r.state.as_str(), r.status), ("full", Status::Ok));
        assert!(
            r.finding
                .starts_with("OOM kill via tp_btf:mark_victim + kprobe:oom_kill_process")
        );
        assert_eq!(check_fentry(Some(&f)).status, Status::Info);
    }

    #[test]
    fn record_fails_without_btf_ringbuf_or_tp_btf_and_under_confidentiality() {
        let f = features_6_18();
        assert_eq!(
            check_record(&Err("no BTF".into()), &LockdownFacts::NoLsm, Some(&f)).status,
            Status::Fail
        );
        let conf = LockdownFacts::Read {
            text: "none integrity [confidentiality]".into(),
            mounted_now: false,
        };
        assert_eq!(check_lockdown(&conf).status, Status::Fail);
        assert_eq!(check_record(&Ok(()), &conf, Some(&f)).status, Status::Fail);
        let no_ring = Features {
            ringbuf: absent("the kernel has no BPF ring buffer (5.8+)"),
            ..features_6_18()
        };
        assert_eq!(
            check_record(&Ok(()), &LockdownFacts::NoLsm, Some(&no_ring)).status,
            Status::Fail
        );
        assert_eq!(check_ringbuf(Some(&no_ring)).status, Status::Fail);
        let no_tp_btf = Features {
            tp_btf: denied(),
            ..features_6_18()
        };
        assert_eq!(
            check_record(&Ok(()), &LockdownFacts::NoLsm, Some(&no_tp_btf)).status,
            Status::Fail
        );
        assert_eq!(check_tp_btf(Some(&no_tp_btf)).status, Status::Fail);
    }
}
