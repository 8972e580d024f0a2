//! `trainbpf doctor`: the checks an engineer chasing OOM kills makes by hand,
//! and which eBPF features this kernel gives `record`.
//!
//! Two halves. [`gather`] reads the machine: procfs, sysfs, the cgroup
//! filesystem, `nvidia-smi`, and (as root) a trial load of the real eBPF
//! object through [`loader::probe_features`]. [`checks`] turns those
//! [`Facts`] into [`Check`]s without touching the machine, so every verdict
//! is unit-tested on fixtures. Doctor diagnoses; it never fails the run.
//!
//! As root it may leave tracefs and securityfs mounted: `record` mounts
//! tracefs itself, and unmounting under a running tracer would break it.

mod protect;

use std::{
    collections::BTreeMap,
    fs,
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde::Serialize;
use trainbpf_common::Config;

use crate::{
    kernel::{self, KernelBtf},
    loader::{self, Features, Probe, Unavailable},
};

/// What record runs and loads as root, and what it refuses.
mod helpers;
pub use helpers::HelperFacts;

/// How a check came out. Only `fail` means `record` cannot work (or the
/// machine is set up to lose data); doctor still exits 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Info,
    Warn,
    Fail,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Info => "info",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One finding, as `doctor --json` prints it (docs/doctor.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable identifier, e.g. `fentry`.
    pub id: &'static str,
    pub status: Status,
    /// One stable word for scripts and tests, e.g. `absent`, `denied`,
    /// `none`; `not_checked` where the check needs root.
    pub state: String,
    pub finding: String,
    pub why: String,
    /// What to do; empty when there is nothing to do.
    pub fix: String,
}

fn check(
    id: &'static str,
    status: Status,
    state: &str,
    finding: impl Into<String>,
    why: impl Into<String>,
    fix: impl Into<String>,
) -> Check {
    Check {
        id,
        status,
        state: state.to_string(),
        finding: finding.into(),
        why: why.into(),
        fix: fix.into(),
    }
}

// ---------------------------------------------------------------------------
// Facts: what gather() read. Plain data, so tests can write them by hand.

/// Everything the checks look at.
#[derive(Clone, Debug)]
pub struct Facts {
    /// `/proc/sys/kernel/osrelease`.
    pub kernel: String,
    /// Effective uid 0: the eBPF probes, mounting tracefs or securityfs.
    pub root: bool,
    /// `/proc/meminfo`; empty if unreadable.
    pub meminfo: Meminfo,
    /// `vm.overcommit_memory`, `vm.overcommit_ratio`, `vm.overcommit_kbytes`.
    pub overcommit: (Option<u32>, Option<u64>, Option<u64>),
    pub cgroup: Option<CgroupFacts>,
    /// This process's oom_score_adj, which jobs started from the same shell
    /// inherit.
    pub self_oom_score_adj: Option<i32>,
    /// Processes at -1000 (never killed) or 1000 (killed first).
    pub extreme_adj: Vec<ProcAdj>,
    /// Whether the recorder could set its own oom_score_adj to -1000.
    pub oom_protect: protect::OomProtect,
    /// `/dev/shm`: `(size, used)` in bytes, or why it could not be read.
    pub shm: Result<(u64, u64), String>,
    /// `/proc/pressure/memory`, or why it could not be read.
    pub psi: Result<String, String>,
    /// `/sys/kernel/mm/transparent_hugepage/{enabled,defrag}`.
    pub thp: (Option<String>, Option<String>),
    pub nvidia: NvidiaFacts,
    pub tracefs: TracefsFacts,
    /// Kernel BTF opened and every offset `record` needs resolved.
    pub btf: Result<(), String>,
    /// `/sys/bus/event_source/devices/kprobe` exists.
    pub kprobe_pmu: bool,
    pub lockdown: LockdownFacts,
    /// The trial load; `None` when not root.
    pub features: Option<Features>,
    pub helpers: HelperFacts,
}

/// `/proc/meminfo` as name → number (kB for sizes, a count for
/// `HugePages_*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meminfo(pub BTreeMap<String, u64>);

impl Meminfo {
    pub fn parse(text: &str) -> Meminfo {
        Meminfo(crate::pressure::meminfo(text))
    }

    /// A `kB` entry in bytes.
    pub fn bytes(&self, name: &str) -> Option<u64> {
        self.0.get(name).map(|kb| kb * 1024)
    }

    pub fn count(&self, name: &str) -> Option<u64> {
        self.0.get(name).copied()
    }
}

/// One process with an extreme oom_score_adj.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcAdj {
    pub pid: u32,
    pub comm: String,
    pub adj: i32,
    pub rss_bytes: u64,
}

/// The memory cgroup this process is in, and its ancestors up to the
/// hierarchy's root: a parent's limit binds the children too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupFacts {
    /// 1 or 2.
    pub version: u8,
    /// Own cgroup first.
    pub levels: Vec<CgroupLevel>,
    /// OOM kills so far in the own cgroup (`oom_kill` of memory.events in v2,
    /// of memory.oom_control in v1 since 4.13).
    pub oom_kills: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupLevel {
    /// Cgroup path as /proc/self/cgroup spells it, e.g. `/kubepods/pod1`.
    pub path: String,
    /// `None`: no limit (`max`, or v1's huge sentinel).
    pub limit: Option<u64>,
    pub usage: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvidiaFacts {
    /// `/proc/driver/nvidia/version`: present only with the kernel driver.
    pub proc_version: Option<String>,
    /// `nvidia-smi` found in a system directory (never through PATH: doctor
    /// may run as root).
    pub smi: Option<PathBuf>,
    /// `nvidia-smi --query-gpu=driver_version --format=csv,noheader`.
    pub smi_driver: Option<Result<String, String>>,
    /// Plain `nvidia-smi`, whose header names the CUDA version.
    pub smi_header: Option<Result<String, String>>,
}

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

// ---------------------------------------------------------------------------
// Parsers for the machine's files (pure).

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The mounted directory's path inside its filesystem.
    pub root: String,
    pub mount_point: String,
    pub fstype: String,
    pub super_opts: String,
}

/// Parses /proc/self/mountinfo: `id parent maj:min root mountpoint opts
/// [optional...] - fstype source superopts`.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.len() < 3 {
            continue;
        }
        out.push(Mount {
            root: unescape(l[3]),
            mount_point: unescape(l[4]),
            fstype: r[0].to_string(),
            super_opts: r[2].to_string(),
        });
    }
    out
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4);
        if b[i] == b'\\'
            && let Some(o) = oct
            && o.iter().all(|c| (b'0'..=b'7').contains(c))
            && let Ok(v) = u8::try_from(o.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0')))
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where this process's memory cgroup lives: `(version, cgroup path,
/// directory, hierarchy's mount point)`. A v1 memory hierarchy wins when
/// present: the controller is then not available to cgroup2.
pub fn memory_cgroup_dir(
    proc_cgroup: &str,
    mounts: &[Mount],
) -> Option<(u8, String, PathBuf, PathBuf)> {
    let mut v2_path = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if ctrls.is_empty() {
            v2_path = Some(path);
        } else if ctrls.split(',').any(|c| c == "memory")
            && let Some(m) = mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == "memory"))
        {
            return Some((
                1,
                path.to_string(),
                join_cgroup(m, path),
                PathBuf::from(&m.mount_point),
            ));
        }
    }
    let path = v2_path?;
    let m = mounts.iter().find(|m| m.fstype == "cgroup2")?;
    Some((
        2,
        path.to_string(),
        join_cgroup(m, path),
        PathBuf::from(&m.mount_point),
    ))
}

/// The directory of cgroup `path` under mount `m`, whose root may itself be
/// a cgroup (a container sees its own cgroup as `/`).
fn join_cgroup(m: &Mount, path: &str) -> PathBuf {
    let rel = path
        .strip_prefix(m.root.trim_end_matches('/'))
        .unwrap_or(path)
        .trim_start_matches('/');
    Path::new(&m.mount_point).join(rel)
}

/// A limit file: `max` (v2) or a number; v1 writes "unlimited" as
/// PAGE_COUNTER_MAX pages in bytes (9223372036854771712 with 4 KiB pages).
pub fn parse_limit(text: &str) -> Option<Option<u64>> {
    let t = text.trim();
    if t == "max" {
        return Some(None);
    }
    let v: u64 = t.parse().ok()?;
    Some(if v >= 1 << 60 { None } else { Some(v) })
}

/// The value of `key` in a `key value` per line file (memory.events,
/// memory.oom_control).
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// The bracketed word of a sysfs choice file: `always [madvise] never`.
pub fn selected(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(&text[start..end])
}

/// A driver version from `/proc/driver/nvidia/version`, e.g. `NVRM version:
/// NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 ...` (or `Open
/// Kernel Module for x86_64`): the first word shaped like a version.
pub fn nvidia_proc_version(text: &str) -> Option<&str> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace().find(|w| {
        w.contains('.')
            && w.split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
    })
}

/// `CUDA Version: 12.4` from nvidia-smi's header.
pub fn cuda_version(smi: &str) -> Option<&str> {
    let i = smi.find("CUDA Version:")? + "CUDA Version:".len();
    smi[i..].split_whitespace().next().filter(|v| *v != "N/A")
}

/// `some avg10=0.00 avg60=...` → the avg10 and avg60 of the `some` and
/// `full` lines.
pub fn parse_psi(text: &str) -> Option<[(f64, f64); 2]> {
    use crate::pressure::{psi_avg, psi_records};
    let (some, full) = psi_records(text)?;
    Some([some, full].map(|r| (psi_avg(r.avg10), psi_avg(r.avg60))))
}

/// 1536 → "1.5 KiB".
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else if v >= 100.0 || v.fract() < 0.05 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn pct(part: u64, whole: u64) -> u64 {
    (part as f64 * 100.0 / whole.max(1) as f64).round() as u64
}

// ---------------------------------------------------------------------------
// The checks (pure).

pub fn check_overcommit(
    mode: Option<u32>,
    ratio: Option<u64>,
    kbytes: Option<u64>,
    mi: &Meminfo,
) -> Check {
    let id = "overcommit";
    let Some(mode) = mode else {
        return check(
            id,
            Status::Info,
            "unknown",
            "/proc/sys/vm/overcommit_memory unreadable",
            "the overcommit mode decides whether running out of memory shows up as a failed allocation or as an OOM kill",
            "",
        );
    };
    let commit = match (mi.bytes("Committed_AS"), mi.bytes("CommitLimit")) {
        (Some(c), Some(l)) => format!(
            "; Committed_AS {} of CommitLimit {} ({}%)",
            fmt_bytes(c),
            fmt_bytes(l),
            pct(c, l)
        ),
        _ => String::new(),
    };
    // overcommit_kbytes, when set, replaces the ratio in CommitLimit.
    let sizing = match (kbytes, ratio) {
        (Some(k), _) if k > 0 => format!("overcommit_kbytes {k}"),
        (_, Some(r)) => format!("ratio {r}%"),
        _ => "ratio unknown".into(),
    };
    match mode {
        0 => check(
            id,
            Status::Ok,
            "heuristic",
            format!(
                "heuristic (vm.overcommit_memory=0){commit}; CommitLimit is not enforced in this mode"
            ),
            "the kernel promises memory freely and refuses only absurd requests, so a shortage ends in an OOM kill rather than a failed malloc; Committed_AS above RAM means that promise can't be kept",
            "",
        ),
        1 => check(
            id,
            Status::Info,
            "always",
            format!("always overcommit (vm.overcommit_memory=1){commit}"),
            "every allocation succeeds, however large: running out always ends in an OOM kill, never in an error the program could handle",
            "sysctl vm.overcommit_memory=0 restores the default heuristic",
        ),
        2 => {
            let (c, l) = (mi.bytes("Committed_AS"), mi.bytes("CommitLimit"));
            let ram = mi.bytes("MemTotal");
            let near = matches!((c, l), (Some(c), Some(l)) if c * 10 >= l * 9);
            let small = matches!((l, ram), (Some(l), Some(r)) if l * 10 < r * 9);
            check(
                id,
                if near || small {
                    Status::Warn
                } else {
                    Status::Info
                },
                "never",
                format!("strict accounting (vm.overcommit_memory=2, {sizing}){commit}"),
                "allocations beyond CommitLimit fail with ENOMEM (\"Cannot allocate memory\", a failed fork of DataLoader workers, a CUDA host-allocation error) before the OOM killer ever runs; a job can die of that with no OOM kill to record",
                if small {
                    "CommitLimit is well below RAM: raise vm.overcommit_ratio (or overcommit_kbytes), add swap, or use vm.overcommit_memory=0"
                } else {
                    "keep Committed_AS well below CommitLimit, or use vm.overcommit_memory=0"
                },
            )
        }
        m => check(
            id,
            Status::Info,
            "unknown",
            format!("unknown mode {m}"),
            "",
            "",
        ),
    }
}

pub fn check_swap(mi: &Meminfo) -> Check {
    let id = "swap";
    let (Some(total), Some(free)) = (mi.bytes("SwapTotal"), mi.bytes("SwapFree")) else {
        return check(
            id,
            Status::Info,
            "unknown",
            "SwapTotal missing from /proc/meminfo",
            "",
            "",
        );
    };
    if total == 0 {
        return check(
            id,
            Status::Info,
            "none",
            "none (SwapTotal 0)",
            "with no swap, anonymous memory can't be paged out: when RAM or a cgroup limit runs out the OOM killer acts at once, with little slowdown before it (the usual set-up for GPU training hosts)",
            "nothing to do if that is intended; for a buffer, add a swap file or zram (cgroup v2: memory.swap.max per job)",
        );
    }
    let used = total.saturating_sub(free);
    let heavy = used * 2 > total;
    check(
        id,
        if heavy { Status::Warn } else { Status::Ok },
        "present",
        format!(
            "{} of {} used ({}%)",
            fmt_bytes(used),
            fmt_bytes(total),
            pct(used, total)
        ),
        "swap delays the OOM killer: a job that outgrows RAM first slows down (swap-in stalls), and the kill comes later or not at all",
        if heavy {
            "more than half of swap is in use: memory is overcommitted now; find the growth before the kill does"
        } else {
            ""
        },
    )
}

pub fn check_cgroup(cg: Option<&CgroupFacts>, mem_total: Option<u64>) -> Check {
    let id = "cgroup_limit";
    let Some(cg) = cg else {
        return check(
            id,
            Status::Info,
            "unknown",
            "no memory cgroup found for this process (/proc/self/cgroup, /proc/self/mountinfo)",
            "a container's memory limit makes the kernel kill inside the container (a memcg OOM) long before the machine runs out",
            "",
        );
    };
    let own = cg.levels.first();
    let own_path = own.map_or("/", |l| l.path.as_str());
    // The tightest limit on the way up is the one that binds.
    let binding = cg
        .levels
        .iter()
        .filter_map(|l| Some((l, l.limit?)))
        .min_by_key(|(_, lim)| *lim);
    let usage = own.and_then(|l| l.usage);
    let kills = match cg.oom_kills {
        Some(n) if n > 0 => format!("; {n} OOM kill(s) in this cgroup so far"),
        _ => String::new(),
    };
    let why = "a memory cgroup limit (a container's --memory, a pod's limits.memory, systemd's MemoryMax) makes the kernel kill inside the cgroup (a memcg OOM) while the machine still has free memory";
    let usage_s = usage
        .map(|u| format!(", usage {}", fmt_bytes(u)))
        .unwrap_or_default();
    match binding {
        None => check(
            id,
            if kills.is_empty() {
                Status::Ok
            } else {
                Status::Warn
            },
            "unlimited",
            format!(
                "cgroup v{} {own_path}: no memory limit{usage_s}{kills}; an OOM kill here is a global one",
                cg.version
            ),
            why,
            "",
        ),
        Some((lvl, lim)) if mem_total.is_some_and(|t| lim >= t) => check(
            id,
            if kills.is_empty() {
                Status::Ok
            } else {
                Status::Warn
            },
            "unlimited",
            format!(
                "cgroup v{} {own_path}: limit {} at {} is not below RAM ({}){usage_s}{kills}",
                cg.version,
                fmt_bytes(lim),
                lvl.path,
                fmt_bytes(mem_total.unwrap_or(0))
            ),
            why,
            "",
        ),
        Some((lvl, lim)) => {
            let near = usage.is_some_and(|u| u * 10 >= lim * 9);
            let at = if lvl.path == own_path {
                String::new()
            } else {
                format!(" set at ancestor {}", lvl.path)
            };
            check(
                id,
                if near || !kills.is_empty() {
                    Status::Warn
                } else {
                    Status::Info
                },
                "limited",
                format!(
                    "cgroup v{} {own_path}: limit {}{at}{}{kills}",
                    cg.version,
                    fmt_bytes(lim),
                    usage
                        .map(|u| format!(", usage {} ({}%)", fmt_bytes(u), pct(u, lim)))
                        .unwrap_or_default()
                ),
                why,
                "size the job below the limit, including page cache and /dev/shm, which count against it; or raise the limit; `trainbpf record --memory-limit` reproduces one",
            )
        }
    }
}

pub fn check_oom_score_adj(self_adj: Option<i32>, extreme: &[ProcAdj]) -> Check {
    let id = "oom_score_adj";
    let list = |adj: i32| -> (usize, String) {
        let mut v: Vec<&ProcAdj> = extreme.iter().filter(|p| p.adj == adj).collect();
        v.sort_by_key(|p| std::cmp::Reverse(p.rss_bytes));
        let top: Vec<String> = v
            .iter()
            .take(3)
            .map(|p| format!("{} {} ({})", p.pid, p.comm, fmt_bytes(p.rss_bytes)))
            .collect();
        let more = if v.len() > 3 { ", …" } else { "" };
        (v.len(), format!("{}{more}", top.join(", ")))
    };
    let (n_never, never) = list(-1000);
    let (n_first, first) = list(1000);
    let mut finding = match self_adj {
        Some(a) => format!("this shell's processes: {a}"),
        None => "own oom_score_adj unreadable".into(),
    };
    if n_never > 0 {
        finding.push_str(&format!("; {n_never} never killed (-1000): {never}"));
    }
    if n_first > 0 {
        finding.push_str(&format!("; {n_first} killed first (1000): {first}"));
    }
    if n_never == 0 && n_first == 0 {
        finding.push_str("; no process at -1000 or 1000");
    }
    let (status, state, fix) = match self_adj {
        Some(-1000) => (
            Status::Warn,
            "protected",
            "a job started from here inherits -1000 and is never chosen: the kernel kills other processes instead, or panics; reset with `echo 0 > /proc/self/oom_score_adj` in the launching shell",
        ),
        Some(a) if a != 0 => (
            Status::Info,
            "adjusted",
            "jobs started from here inherit this value; set it in the launcher if that is not wanted",
        ),
        _ => (Status::Ok, "default", ""),
    };
    check(
        id,
        status,
        state,
        finding,
        "the kernel kills the process with the highest badness (RSS + swap + page tables, shifted by oom_score_adj × RAM/1000): -1000 is never chosen, 1000 first, so a large protected process makes a smaller job the victim",
        fix,
    )
}

pub fn check_shm(shm: &Result<(u64, u64), String>, mem_total: Option<u64>) -> Check {
    let id = "shm";
    let why = "PyTorch DataLoader workers pass batches through /dev/shm; too small gives \"Bus error\" or \"No space left on device\" in workers, and what sits there is RAM (Shmem) charged to the cgroup that wrote it, and not freed when a process dies";
    let (size, used) = match shm {
        Ok(v) => *v,
        Err(e) => {
            return check(
                id,
                Status::Warn,
                "missing",
                format!("/dev/shm unusable: {e}"),
                why,
                "mount a tmpfs at /dev/shm (containers: --shm-size, or an emptyDir with medium: Memory)",
            );
        }
    };
    let small = size < 1 << 30;
    let full = used * 2 > size;
    let of_ram = mem_total
        .map(|t| format!(" ({}% of RAM)", pct(size, t)))
        .unwrap_or_default();
    check(
        id,
        if small || full {
            Status::Warn
        } else {
            Status::Ok
        },
        if small { "small" } else { "ok" },
        format!(
            "size {}{of_ram}, used {} ({}%)",
            fmt_bytes(size),
            fmt_bytes(used),
            pct(used, size)
        ),
        why,
        if small {
            "under 1 GiB (Docker's default is 64 MiB): raise it (--shm-size=8g, or `mount -o remount,size=8G /dev/shm`)"
        } else if full {
            "over half full: look for leftover files (torch_* segments of killed workers) with `ls -la /dev/shm`"
        } else {
            ""
        },
    )
}

pub fn check_psi(psi: &Result<String, String>) -> Check {
    let id = "psi";
    let why = "pressure stall information says how much time tasks spent waiting for memory: the slowdown before an OOM kill";
    match psi.as_ref().map(|t| parse_psi(t)) {
        Ok(Some([(s10, s60), (f10, f60)])) => {
            let stalled = s60 >= 10.0 || f60 >= 5.0;
            check(
                id,
                if stalled { Status::Warn } else { Status::Ok },
                "available",
                format!(
                    "/proc/pressure/memory: some {s10:.2}% / {s60:.2}%, full {f10:.2}% / {f60:.2}% (avg10 / avg60)"
                ),
                why,
                if stalled {
                    "tasks are stalling on memory now"
                } else {
                    ""
                },
            )
        }
        Ok(None) => check(
            id,
            Status::Info,
            "unknown",
            "/proc/pressure/memory unparsable",
            why,
            "",
        ),
        Err(e) => check(
            id,
            Status::Info,
            "absent",
            format!("unavailable: {e}"),
            why,
            "boot with psi=1 (CONFIG_PSI=y kernels with CONFIG_PSI_DEFAULT_DISABLED need it)",
        ),
    }
}

pub fn check_thp(enabled: Option<&str>, defrag: Option<&str>, mi: &Meminfo) -> Check {
    let id = "thp";
    let en = enabled.and_then(selected).unwrap_or("unknown");
    let df = defrag.and_then(selected).unwrap_or("unknown");
    let huge_total = mi.count("HugePages_Total").unwrap_or(0);
    let huge_size = mi.bytes("Hugepagesize").unwrap_or(2 << 20);
    let reserved = huge_total * huge_size;
    let mut finding = format!("transparent_hugepage enabled={en}, defrag={df}");
    if huge_total > 0 {
        finding.push_str(&format!(
            "; {huge_total} hugetlb pages of {} reserved ({}), {} free",
            fmt_bytes(huge_size),
            fmt_bytes(reserved),
            mi.count("HugePages_Free").unwrap_or(0)
        ));
    } else {
        finding.push_str("; no hugetlb pages reserved");
    }
    let big_reserve = mi.bytes("MemTotal").is_some_and(|t| reserved * 4 > t);
    let mut fixes = Vec::new();
    if df == "always" {
        fixes.push("defrag=always makes faults compact memory synchronously: long stalls under pressure; madvise or defer is safer");
    }
    if en == "always" {
        fixes.push("enabled=always can grow RSS in 2 MiB steps for sparse allocations; madvise limits it to code that asks");
    }
    if big_reserve {
        fixes.push("over a quarter of RAM is reserved for hugetlb pages, which ordinary allocations can't use: shrink vm.nr_hugepages unless something uses them");
    }
    check(
        id,
        if df == "always" || big_reserve {
            Status::Warn
        } else {
            Status::Ok
        },
        en,
        finding,
        "transparent huge pages change RSS and fault cost; hugetlb pages are taken out of RAM up front, so they shrink what the job can use without showing in its RSS",
        fixes.join("; "),
    )
}

pub fn check_nvidia(n: &NvidiaFacts) -> Check {
    let id = "nvidia";
    let why = "GPU jobs die of host OOM as often as of GPU OOM (pinned memory, DataLoader copies); the driver version decides what trainbpf can see of the GPU (driver 575.51.02+ has the nvidia:nvidia_dev_xid tracepoint)";
    let kmod = n.proc_version.as_deref().and_then(nvidia_proc_version);
    let smi_driver = match &n.smi_driver {
        Some(Ok(s)) => s.lines().next().map(str::trim).filter(|s| !s.is_empty()),
        _ => None,
    };
    let gpus = match &n.smi_driver {
        Some(Ok(s)) => s.lines().filter(|l| !l.trim().is_empty()).count(),
        _ => 0,
    };
    let cuda = match &n.smi_header {
        Some(Ok(h)) => cuda_version(h),
        _ => None,
    };
    match (kmod, &n.smi) {
        (None, None) => check(
            id,
            Status::Info,
            "absent",
            "no NVIDIA driver (/proc/driver/nvidia/version missing, no nvidia-smi in the system directories)",
            why,
            "",
        ),
        (None, Some(smi)) => check(
            id,
            Status::Warn,
            "no_driver",
            format!(
                "{} is installed but the kernel driver is not loaded (/proc/driver/nvidia/version missing){}",
                smi.display(),
                match &n.smi_driver {
                    Some(Err(e)) => format!("; nvidia-smi: {e}"),
                    _ => String::new(),
                }
            ),
            why,
            "load the driver (modprobe nvidia) or, in a container, run with the GPU runtime (--gpus all)",
        ),
        (Some(k), None) => check(
            id,
            Status::Warn,
            "no_smi",
            format!("kernel driver {k} loaded; nvidia-smi not in the system directories"),
            why,
            "install the driver's utilities (nvidia-utils) to query GPUs and the supported CUDA version",
        ),
        (Some(k), Some(_)) => {
            let mismatch = smi_driver.is_some_and(|s| s != k);
            let mut finding = format!("kernel driver {k}");
            match (smi_driver, &n.smi_driver) {
                (Some(s), _) => {
                    finding.push_str(&format!("; nvidia-smi: driver {s}, {gpus} GPU(s)"))
                }
                (None, Some(Err(e))) => finding.push_str(&format!("; nvidia-smi failed: {e}")),
                _ => finding.push_str("; nvidia-smi gave no driver version"),
            }
            finding.push_str(&match cuda {
                Some(c) => format!("; supports CUDA up to {c}"),
                None => "; CUDA version unknown".into(),
            });
            let failed = smi_driver.is_none();
            check(
                id,
                if mismatch || failed {
                    Status::Warn
                } else {
                    Status::Ok
                },
                if mismatch { "mismatch" } else { "present" },
                finding,
                why,
                if mismatch {
                    "the loaded kernel module and the user-space driver differ (an upgrade without reboot): reboot or reload the module"
                } else if failed {
                    "nvidia-smi could not talk to the driver: check `nvidia-smi` by hand and dmesg for NVRM errors"
                } else {
                    ""
                },
            )
        }
    }
}

/// Where a check needs the trial load and we are not root.
fn needs_root(id: &'static str, what: &str, why: &str) -> Check {
    check(
        id,
        Status::Info,
        "not_checked",
        format!("not checked: {what} needs root"),
        why,
        "run `sudo trainbpf doctor`",
    )
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
    let why = "tp_btf/mark_victim hands record the victim's task_struct (6.8+) at the moment it is chosen; record's process-lifecycle and memory probes are tp_btf too";
    let Some(f) = f else {
        return needs_root(id, "loading tp_btf/mark_victim", why);
    };
    let (status, fix) = match &f.tp_btf {
        Ok(()) => (Status::Ok, ""),
        // Before 6.8: record falls back to the classic tracepoint; the
        // sched_process_* tp_btf probes still work.
        Err(Unavailable::Missing(_)) => (
            Status::Warn,
            "record uses the classic oom:mark_victim tracepoint instead; a 6.8+ kernel gives the victim's task_struct",
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
            "oom:mark_victim carries only the pid before 6.8: the victim's RSS and oom_score_adj at the kill come from the last tracked figures".to_string(),
        );
        fixes.push("a 6.8+ kernel gives the victim's figures at the kill");
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

/// Every check, in the order they print.
pub fn checks(f: &Facts) -> Vec<Check> {
    let mem_total = f.meminfo.bytes("MemTotal");
    let features = f.features.as_ref();
    vec![
        check_overcommit(f.overcommit.0, f.overcommit.1, f.overcommit.2, &f.meminfo),
        check_swap(&f.meminfo),
        check_cgroup(f.cgroup.as_ref(), mem_total),
        check_oom_score_adj(f.self_oom_score_adj, &f.extreme_adj),
        protect::check_oom_protect(f.root, &f.oom_protect),
        check_shm(&f.shm, mem_total),
        check_psi(&f.psi),
        check_thp(f.thp.0.as_deref(), f.thp.1.as_deref(), &f.meminfo),
        check_nvidia(&f.nvidia),
        helpers::check_helpers(&f.helpers, f.nvidia.smi.as_deref()),
        check_tracefs(&f.tracefs),
        check_btf(&f.btf),
        check_kprobes(f.kprobe_pmu, features),
        check_fentry(features),
        check_tp_btf(features),
        check_lockdown(&f.lockdown),
        check_ringbuf(features),
        check_record(&f.btf, &f.lockdown, features),
    ]
}

// ---------------------------------------------------------------------------
// Output.

/// `doctor --json`: `{"kernel", "root", "checks": [...]}`, keys in this
/// order (a struct keeps it; `json!` would sort them).
pub fn render_json(f: &Facts, checks: &[Check]) -> String {
    #[derive(Serialize)]
    struct Out<'a> {
        kernel: &'a str,
        root: bool,
        checks: &'a [Check],
    }
    let out = Out {
        kernel: &f.kernel,
        root: f.root,
        checks,
    };
    // Serializing plain strings, bools and enums cannot fail.
    let mut s = serde_json::to_string_pretty(&out).unwrap_or_default();
    s.push('\n');
    s
}

/// One line per check (status, id, finding), then why and fix indented.
pub fn render_text(f: &Facts, checks: &[Check]) -> String {
    // Findings quote process names (oom_score_adj) and helpers' output:
    // escaped for the terminal (JSON escapes by its own rules).
    use crate::term::escape as esc;
    let mut s = format!(
        "trainbpf doctor: Linux {}{}\n\n",
        esc(&f.kernel),
        if f.root { ", as root" } else { ", not root" }
    );
    for c in checks {
        s.push_str(&format!(
            "{:<5} {:<13} {}\n",
            c.status.word(),
            c.id,
            esc(&c.finding)
        ));
        if !c.why.is_empty() {
            s.push_str(&format!("{:20}why: {}\n", "", esc(&c.why)));
        }
        if !c.fix.is_empty() {
            s.push_str(&format!("{:20}fix: {}\n", "", esc(&c.fix)));
        }
    }
    let count = |st: Status| checks.iter().filter(|c| c.status == st).count();
    s.push_str(&format!(
        "\n{} ok, {} info, {} warn, {} fail\n",
        count(Status::Ok),
        count(Status::Info),
        count(Status::Warn),
        count(Status::Fail)
    ));
    let unchecked: Vec<&str> = checks
        .iter()
        .filter(|c| c.state == "not_checked")
        .map(|c| c.id)
        .collect();
    if !unchecked.is_empty() {
        s.push_str(&format!(
            "not checked without root: {}; run `sudo trainbpf doctor`\n",
            unchecked.join(", ")
        ));
    }
    s
}

/// `trainbpf doctor [--json]`.
pub fn run(json: bool) -> String {
    let facts = gather();
    let checks = checks(&facts);
    if json {
        render_json(&facts, &checks)
    } else {
        render_text(&facts, &checks)
    }
}

// ---------------------------------------------------------------------------
// Gathering: the only part that reads the machine.

fn read(path: &str) -> Option<String> {
    fs::read_to_string(path).ok()
}

fn read_num<T: std::str::FromStr>(path: &str) -> Option<T> {
    read(path)?.trim().parse().ok()
}

/// Reads the machine. As root this also mounts tracefs and securityfs if
/// they are missing, and trial-loads the eBPF object.
pub fn gather() -> Facts {
    let root = nix::unistd::geteuid().is_root();
    let mounts = parse_mountinfo(&read("/proc/self/mountinfo").unwrap_or_default());
    let meminfo = Meminfo::parse(&read("/proc/meminfo").unwrap_or_default());
    // tracefs first: the trial load below would mount it and hide the
    // machine's own state.
    let tracefs = gather_tracefs(root, &mounts);
    let btf = KernelBtf::open()
        .and_then(|k| {
            let mut c = Config::UNSET;
            k.fill(&mut c)
        })
        .map_err(|e| e.to_string());
    Facts {
        kernel: read("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        root,
        overcommit: (
            read_num("/proc/sys/vm/overcommit_memory"),
            read_num("/proc/sys/vm/overcommit_ratio"),
            read_num("/proc/sys/vm/overcommit_kbytes"),
        ),
        cgroup: gather_cgroup(&mounts),
        self_oom_score_adj: read_num("/proc/self/oom_score_adj"),
        extreme_adj: gather_extreme_adj(),
        oom_protect: protect::gather(),
        shm: nix::sys::statvfs::statvfs("/dev/shm")
            .map(|v| {
                let f = v.fragment_size();
                (v.blocks() * f, (v.blocks() - v.blocks_free()) * f)
            })
            .map_err(|e| e.to_string()),
        // With PSI compiled in but off, the files exist and reading fails
        // with EOPNOTSUPP.
        psi: fs::read_to_string("/proc/pressure/memory").map_err(|e| e.to_string()),
        thp: (
            read("/sys/kernel/mm/transparent_hugepage/enabled"),
            read("/sys/kernel/mm/transparent_hugepage/defrag"),
        ),
        nvidia: gather_nvidia(),
        tracefs,
        btf,
        kprobe_pmu: kernel::kprobes_available(),
        lockdown: gather_lockdown(root, &mounts),
        features: root.then(loader::probe_features),
        meminfo,
        helpers: helpers::gather(),
    }
}

fn gather_tracefs(root: bool, mounts: &[Mount]) -> TracefsFacts {
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

fn gather_lockdown(root: bool, mounts: &[Mount]) -> LockdownFacts {
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

fn gather_cgroup(mounts: &[Mount]) -> Option<CgroupFacts> {
    let (version, path, mut dir, top) = memory_cgroup_dir(&read("/proc/self/cgroup")?, mounts)?;
    let (limit_file, usage_file) = if version == 1 {
        ("memory.limit_in_bytes", "memory.usage_in_bytes")
    } else {
        ("memory.max", "memory.current")
    };
    let oom_kills = if version == 1 {
        fs::read_to_string(dir.join("memory.oom_control"))
            .ok()
            .and_then(|t| keyed(&t, "oom_kill"))
    } else {
        fs::read_to_string(dir.join("memory.events"))
            .ok()
            .and_then(|t| keyed(&t, "oom_kill"))
    };
    let mut levels = Vec::new();
    let mut cg_path = path;
    loop {
        let read_in = |f: &str| fs::read_to_string(dir.join(f)).ok();
        // The v2 root has no memory.max: it is never limited.
        let limit = read_in(limit_file).and_then(|t| parse_limit(&t)).flatten();
        let usage = read_in(usage_file).and_then(|t| t.trim().parse().ok());
        levels.push(CgroupLevel {
            path: cg_path.clone(),
            limit,
            usage,
        });
        if dir == top || !dir.pop() || !dir.starts_with(&top) {
            break;
        }
        cg_path = match cg_path.rfind('/') {
            Some(0) | None => "/".to_string(),
            Some(i) => cg_path[..i].to_string(),
        };
    }
    Some(CgroupFacts {
        version,
        levels,
        oom_kills,
    })
}

fn gather_extreme_adj() -> Vec<ProcAdj> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // Processes come and go while we read: skip the ones that went.
        let Some(adj) = read_num::<i32>(&format!("/proc/{pid}/oom_score_adj")) else {
            continue;
        };
        if adj != -1000 && adj != 1000 {
            continue;
        }
        // statm's second field: resident pages. Kernel threads have none
        // and can't be OOM-killed, so they are left out.
        let rss = read(&format!("/proc/{pid}/statm"))
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            * page;
        if rss == 0 {
            continue;
        }
        let comm = read(&format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim()
            .to_string();
        out.push(ProcAdj {
            pid,
            comm,
            adj,
            rss_bytes: rss,
        });
    }
    out
}

fn gather_nvidia() -> NvidiaFacts {
    // Not through PATH: as root that would run whatever the user's PATH
    // names first.
    let smi = crate::trust::program("nvidia-smi");
    // nvidia-smi can hang for a long time on a GPU in a bad state: bound it.
    let timeout = Duration::from_secs(10);
    let smi_driver = smi.as_ref().map(|p| {
        run_bounded(
            p,
            &["--query-gpu=driver_version", "--format=csv,noheader"],
            timeout,
        )
    });
    let smi_header = smi.as_ref().map(|p| run_bounded(p, &[], timeout));
    NvidiaFacts {
        proc_version: read("/proc/driver/nvidia/version"),
        smi,
        smi_driver,
        smi_header,
    }
}

/// Runs a command and returns its stdout, or why not (exit status with the
/// first stderr line, or a timeout, after which the child is killed).
fn run_bounded(prog: &Path, args: &[&str], timeout: Duration) -> Result<String, String> {
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    // Drain stdout on a thread so a full pipe can't stall the child.
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = stdout.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {}s", timeout.as_secs()));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let out = reader.join().unwrap_or_default();
    if status.success() {
        Ok(out)
    } else {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        // nvidia-smi prints its errors ("NVIDIA-SMI has failed ...") on stdout.
        let msg = [err.as_str(), out.as_str()]
            .iter()
            .find_map(|t| t.lines().map(str::trim).find(|l| !l.is_empty()))
            .unwrap_or("")
            .to_string();
        Err(format!("{status}: {msg}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's /proc/meminfo, trimmed: 24 GiB, no swap.
    const MEMINFO: &str = "MemTotal:       24683656 kB\n\
MemFree:        23000000 kB\n\
SwapTotal:             0 kB\n\
SwapFree:              0 kB\n\
Shmem:              8924 kB\n\
CommitLimit:    12341828 kB\n\
Committed_AS:      60712 kB\n\
HugePages_Total:       0\n\
HugePages_Free:        0\n\
Hugepagesize:       2048 kB\n";

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
50 22 0:12 / /sys/kernel/tracing rw,relatime - tracefs tracefs rw\n\
60 22 0:40 / /mnt/with\\040space rw - tmpfs tmpfs rw\n";

    const PROC_CGROUP_V1: &str = "9:name=systemd:/\n4:memory:/process_api/ee59\n1:cpu:/\n0::/\n";

    fn denied() -> Probe {
        Err(Unavailable::Denied(
            "the BPF_PROG_LOAD syscall returned Operation not permitted (os error 1)".into(),
        ))
    }

    fn absent(why: &str) -> Probe {
        Err(Unavailable::Missing(why.into()))
    }

    /// What probe_features finds on the 6.18 Firecracker kernel
    /// (../shared/PLATFORM.md): no kprobes, fentry EPERM, tp_btf works.
    fn features_6_18() -> Features {
        Features {
            fentry: denied(),
            kprobe: absent("CONFIG_KPROBES unset"),
            tp_btf: Ok(()),
            tracepoint: Ok(()),
            ringbuf: Ok(()),
            mark_victim_fields: ["pid", "comm", "total_vm", "anon_rss", "oom_score_adj"]
                .map(String::from)
                .to_vec(),
        }
    }

    /// Debian's 5.10 under qemu: kprobe and fentry attach, mark_victim
    /// passes an int pid and its tracepoint record has only `pid`.
    fn features_5_10() -> Features {
        Features {
            fentry: Ok(()),
            kprobe: Ok(()),
            tp_btf: absent("this kernel's mark_victim passes a pid"),
            tracepoint: Ok(()),
            ringbuf: Ok(()),
            mark_victim_fields: vec!["common_type".into(), "pid".into()],
        }
    }

    fn facts_6_18() -> Facts {
        Facts {
            kernel: "6.18.44".into(),
            root: true,
            meminfo: Meminfo::parse(MEMINFO),
            overcommit: (Some(0), Some(50), Some(0)),
            cgroup: None,
            self_oom_score_adj: Some(0),
            extreme_adj: vec![],
            oom_protect: protect::OomProtect {
                trial: Ok(()),
                cap_sys_resource: Some(true),
                user_namespace: false,
            },
            shm: Ok((24 << 30, 0)),
            psi: Err("Operation not supported (os error 95)".into()),
            thp: (
                Some("always [madvise] never\n".into()),
                Some("always defer defer+madvise [madvise] never\n".into()),
            ),
            nvidia: NvidiaFacts::default(),
            tracefs: TracefsFacts::MountedNow,
            btf: Ok(()),
            kprobe_pmu: false,
            lockdown: LockdownFacts::Read {
                text: "none [integrity] confidentiality\n".into(),
                mounted_now: true,
            },
            features: Some(features_6_18()),
            helpers: HelperFacts::default(),
        }
    }

    fn by_id<'a>(checks: &'a [Check], id: &str) -> &'a Check {
        checks
            .iter()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("no check {id}"))
    }

    #[test]
    fn meminfo_parses_sizes_and_counts() {
        let m = Meminfo::parse(MEMINFO);
        assert_eq!(m.bytes("MemTotal"), Some(24683656 * 1024));
        assert_eq!(m.bytes("SwapTotal"), Some(0));
        assert_eq!(m.count("HugePages_Total"), Some(0));
        assert_eq!(m.bytes("Nope"), None);
    }

    #[test]
    fn every_check_has_a_stable_id_in_order() {
        let ids: Vec<&str> = checks(&facts_6_18()).iter().map(|c| c.id).collect();
        assert_eq!(
            ids,
            [
                "overcommit",
                "swap",
                "cgroup_limit",
                "oom_score_adj",
                "oom_protect",
                "shm",
                "psi",
                "thp",
                "nvidia",
                "helpers",
                "tracefs",
                "btf",
                "kprobes",
                "fentry",
                "tp_btf",
                "lockdown",
                "ringbuf",
                "record"
            ]
        );
    }

    /// The acceptance on this machine, on its facts.
    #[test]
    fn this_machine_kprobes_absent_fentry_denied_tp_btf_available_no_swap() {
        let c = checks(&facts_6_18());
        assert_eq!(by_id(&c, "kprobes").state, "absent");
        assert_eq!(
            by_id(&c, "kprobes").status,
            Status::Warn,
            "fentry does not cover it"
        );
        assert_eq!(by_id(&c, "fentry").state, "denied");
        assert!(
            by_id(&c, "fentry")
                .finding
                .contains("Operation not permitted")
        );
        assert_eq!(by_id(&c, "tp_btf").state, "available");
        assert_eq!(by_id(&c, "tp_btf").status, Status::Ok);
        assert_eq!(by_id(&c, "swap").state, "none");
        assert_eq!(by_id(&c, "lockdown").state, "integrity");
        assert_eq!(by_id(&c, "lockdown").status, Status::Ok);
        assert_eq!(by_id(&c, "psi").state, "absent");
        assert_eq!(by_id(&c, "nvidia").state, "absent");
        let r = by_id(&c, "record");
        assert_eq!(r.state, "partial");
        assert!(
            r.finding
                .starts_with("OOM kill via tp_btf:mark_victim; no oom_kill_process probe"),
            "{}",
            r.finding
        );
        assert!(
            r.why.contains("totalpages") && r.why.contains("fentry (denied)"),
            "{}",
            r.why
        );
    }

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

    #[test]
    fn without_root_the_probes_say_they_need_it() {
        let f = Facts {
            root: false,
            features: None,
            tracefs: TracefsFacts::NotMounted,
            lockdown: LockdownFacts::NeedsRoot,
            ..facts_6_18()
        };
        let c = checks(&f);
        for id in [
            "fentry",
            "tp_btf",
            "ringbuf",
            "record",
            "tracefs",
            "lockdown",
            "oom_protect",
        ] {
            let k = by_id(&c, id);
            assert_eq!(
                (k.state.as_str(), k.status),
                ("not_checked", Status::Info),
                "{id}"
            );
            assert!(k.fix.contains("sudo"), "{id}: {}", k.fix);
        }
        // The rest still run.
        assert_eq!(by_id(&c, "swap").state, "none");
        assert_eq!(by_id(&c, "kprobes").state, "absent");
        let text = render_text(&f, &c);
        assert!(
            text.contains(
                "not checked without root: oom_protect, tracefs, fentry, tp_btf, lockdown, ringbuf, record"
            ),
            "{text}"
        );
    }

    #[test]
    fn overcommit_modes() {
        let m = Meminfo::parse(MEMINFO);
        let c = check_overcommit(Some(0), Some(50), Some(0), &m);
        assert_eq!((c.state.as_str(), c.status), ("heuristic", Status::Ok));
        assert!(
            c.finding
                .contains("Committed_AS 59.3 MiB of CommitLimit 11.8 GiB"),
            "{}",
            c.finding
        );
        assert_eq!(
            check_overcommit(Some(1), Some(50), Some(0), &m).state,
            "always"
        );
        // Strict with ratio 50 and no swap: half of RAM can be committed.
        let c = check_overcommit(Some(2), Some(50), Some(0), &m);
        assert_eq!((c.state.as_str(), c.status), ("never", Status::Warn));
        assert!(c.finding.contains("ratio 50%"), "{}", c.finding);
        assert!(c.fix.contains("well below RAM"));
        // overcommit_kbytes replaces the ratio.
        let c = check_overcommit(Some(2), Some(50), Some(1 << 20), &m);
        assert!(
            c.finding.contains("overcommit_kbytes 1048576"),
            "{}",
            c.finding
        );
        // Strict but generous, and far from the limit: a note.
        let roomy =
            Meminfo::parse("MemTotal: 1000 kB\nCommitLimit: 1200 kB\nCommitted_AS: 100 kB\n");
        assert_eq!(
            check_overcommit(Some(2), Some(120), Some(0), &roomy).status,
            Status::Info
        );
        let near =
            Meminfo::parse("MemTotal: 1000 kB\nCommitLimit: 1200 kB\nCommitted_AS: 1190 kB\n");
        assert_eq!(
            check_overcommit(Some(2), Some(120), Some(0), &near).status,
            Status::Warn
        );
        assert_eq!(check_overcommit(None, None, None, &m).state, "unknown");
    }

    #[test]
    fn swap_none_some_and_heavy() {
        let c = check_swap(&Meminfo::parse(MEMINFO));
        assert_eq!((c.state.as_str(), c.status), ("none", Status::Info));
        let c = check_swap(&Meminfo::parse(
            "SwapTotal: 4194304 kB\nSwapFree: 4194304 kB\n",
        ));
        assert_eq!((c.state.as_str(), c.status), ("present", Status::Ok));
        assert_eq!(c.finding, "0 B of 4 GiB used (0%)");
        let c = check_swap(&Meminfo::parse(
            "SwapTotal: 4194304 kB\nSwapFree: 1048576 kB\n",
        ));
        assert_eq!(c.status, Status::Warn);
        assert_eq!(c.finding, "3 GiB of 4 GiB used (75%)");
    }

    #[test]
    fn mountinfo_and_cgroup_paths() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 5);
        assert_eq!(m[4].mount_point, "/mnt/with space");
        assert_eq!(m[1].super_opts, "rw,memory");
        // v1 memory hierarchy wins over the cgroup2 line.
        let (v, path, dir, top) = memory_cgroup_dir(PROC_CGROUP_V1, &m).unwrap();
        assert_eq!((v, path.as_str()), (1, "/process_api/ee59"));
        assert_eq!(dir, Path::new("/sys/fs/cgroup/memory/process_api/ee59"));
        assert_eq!(top, Path::new("/sys/fs/cgroup/memory"));
        // Pure cgroup2, and a container whose mount root is its own cgroup.
        let v2 =
            parse_mountinfo("30 1 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
        let (v, _, dir, _) = memory_cgroup_dir("0::/kubepods/pod1/c1\n", &v2).unwrap();
        assert_eq!((v, dir), (2, PathBuf::from("/sys/fs/cgroup/c1")));
        assert!(memory_cgroup_dir("0::/\n", &[]).is_none());
    }

    #[test]
    fn limits_max_and_the_v1_sentinel_mean_unlimited() {
        assert_eq!(parse_limit("max\n"), Some(None));
        assert_eq!(parse_limit("9223372036854771712\n"), Some(None));
        assert_eq!(parse_limit("314572800\n"), Some(Some(300 << 20)));
        assert_eq!(parse_limit("garbage"), None);
        assert_eq!(
            keyed("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\n", "oom_kill"),
            Some(2)
        );
        assert_eq!(
            keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n", "oom_kill"),
            Some(5)
        );
    }

    fn level(path: &str, limit: Option<u64>, usage: Option<u64>) -> CgroupLevel {
        CgroupLevel {
            path: path.into(),
            limit,
            usage,
        }
    }

    #[test]
    fn cgroup_limit_checks() {
        let ram = Some(24u64 << 30);
        let cg = |levels, kills| CgroupFacts {
            version: 2,
            levels,
            oom_kills: kills,
        };
        let c = check_cgroup(
            Some(&cg(
                vec![level("/a", None, Some(1 << 20)), level("/", None, None)],
                Some(0),
            )),
            ram,
        );
        assert_eq!((c.state.as_str(), c.status), ("unlimited", Status::Ok));
        // A parent's limit binds the child.
        let c = check_cgroup(
            Some(&cg(
                vec![
                    level("/pod/c", None, Some(100 << 20)),
                    level("/pod", Some(300 << 20), None),
                ],
                None,
            )),
            ram,
        );
        assert_eq!((c.state.as_str(), c.status), ("limited", Status::Info));
        assert!(
            c.finding
                .contains("limit 300 MiB set at ancestor /pod, usage 100 MiB (33%)"),
            "{}",
            c.finding
        );
        // Near the limit, or kills already: warn.
        let c = check_cgroup(
            Some(&cg(
                vec![level("/j", Some(300 << 20), Some(290 << 20))],
                None,
            )),
            ram,
        );
        assert_eq!(c.status, Status::Warn);
        assert_eq!(
            c.finding,
            "cgroup v2 /j: limit 300 MiB, usage 290 MiB (97%)"
        );
        let c = check_cgroup(Some(&cg(vec![level("/j", None, None)], Some(3))), ram);
        assert_eq!(c.status, Status::Warn);
        assert!(c.finding.contains("3 OOM kill(s)"));
        // A limit above RAM does not bind.
        let c = check_cgroup(
            Some(&cg(vec![level("/j", Some(64 << 30), None)], None)),
            ram,
        );
        assert_eq!(c.state, "unlimited");
        assert_eq!(check_cgroup(None, ram).state, "unknown");
    }

    #[test]
    fn oom_score_adj_lists_the_extremes_biggest_first() {
        let p = |pid, comm: &str, adj, mib: u64| ProcAdj {
            pid,
            comm: comm.into(),
            adj,
            rss_bytes: mib << 20,
        };
        let procs = [
            p(10, "sshd", -1000, 5),
            p(11, "postgres", -1000, 900),
            p(12, "dockerd", -1000, 80),
            p(13, "udevd", -1000, 3),
            p(20, "chrome", 1000, 300),
        ];
        let c = check_oom_score_adj(Some(0), &procs);
        assert_eq!((c.state.as_str(), c.status), ("default", Status::Ok));
        assert!(
            c.finding.contains("4 never killed (-1000): 11 postgres (900 MiB), 12 dockerd (80 MiB), 10 sshd (5 MiB), …"),
            "{}",
            c.finding
        );
        assert!(
            c.finding
                .contains("1 killed first (1000): 20 chrome (300 MiB)")
        );
        let c = check_oom_score_adj(Some(-1000), &[]);
        assert_eq!((c.state.as_str(), c.status), ("protected", Status::Warn));
        assert_eq!(check_oom_score_adj(Some(500), &[]).state, "adjusted");
    }

    #[test]
    fn shm_sizes() {
        let c = check_shm(&Ok((64 << 20, 0)), Some(24 << 30));
        assert_eq!((c.state.as_str(), c.status), ("small", Status::Warn));
        assert!(c.fix.contains("--shm-size"));
        let c = check_shm(&Ok((12 << 30, 7 << 30)), Some(24 << 30));
        assert_eq!((c.state.as_str(), c.status), ("ok", Status::Warn));
        assert_eq!(c.finding, "size 12 GiB (50% of RAM), used 7 GiB (58%)");
        assert_eq!(check_shm(&Err("ENOENT".into()), None).state, "missing");
    }

    #[test]
    fn psi_parsing() {
        let text = "some avg10=1.50 avg60=12.00 avg300=0.00 total=18887\nfull avg10=0.00 avg60=0.10 avg300=0.00 total=11685\n";
        assert_eq!(parse_psi(text), Some([(1.5, 12.0), (0.0, 0.1)]));
        let c = check_psi(&Ok(text.into()));
        assert_eq!((c.state.as_str(), c.status), ("available", Status::Warn));
        let c = check_psi(&Err("Operation not supported (os error 95)".into()));
        assert_eq!((c.state.as_str(), c.status), ("absent", Status::Info));
        assert!(c.fix.contains("psi=1"));
    }

    #[test]
    fn thp_and_hugetlb() {
        assert_eq!(selected("always [madvise] never"), Some("madvise"));
        assert_eq!(selected("never"), None);
        let m = Meminfo::parse(MEMINFO);
        let c = check_thp(
            Some("[always] madvise never"),
            Some("[always] defer madvise never"),
            &m,
        );
        assert_eq!((c.state.as_str(), c.status), ("always", Status::Warn));
        assert!(c.fix.contains("defrag=always"));
        // 8 GiB of 2 MiB pages reserved out of 24 GiB.
        let big = Meminfo::parse(
            &format!("{MEMINFO}HugePages_Total: 4096\n").replace("HugePages_Total:       0\n", ""),
        );
        let c = check_thp(Some("always [madvise] never"), Some("[madvise]"), &big);
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.finding
                .contains("4096 hugetlb pages of 2 MiB reserved (8 GiB)"),
            "{}",
            c.finding
        );
    }

    const PROC_NVIDIA: &str = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
    const PROC_NVIDIA_OPEN: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Mar 20 09:59:12 UTC 2025\n";
    const SMI_HEADER: &str = "Mon Nov 30 06:00:00 2026\n+-----------------------------------------------------------------------------------------+\n| NVIDIA-SMI 550.54.14              Driver Version: 550.54.14      CUDA Version: 12.4     |\n";

    #[test]
    fn nvidia_versions() {
        assert_eq!(nvidia_proc_version(PROC_NVIDIA), Some("550.54.14"));
        assert_eq!(nvidia_proc_version(PROC_NVIDIA_OPEN), Some("570.133.20"));
        assert_eq!(
            nvidia_proc_version(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  555.58  Release Build  (portage@localhost)"
            ),
            Some("555.58")
        );
        assert_eq!(cuda_version(SMI_HEADER), Some("12.4"));
        assert_eq!(cuda_version("CUDA Version: N/A |"), None);
    }

    #[test]
    fn nvidia_checks() {
        let c = check_nvidia(&NvidiaFacts::default());
        assert_eq!((c.state.as_str(), c.status), ("absent", Status::Info));
        assert!(c.finding.starts_with("no NVIDIA driver"));
        let full = NvidiaFacts {
            proc_version: Some(PROC_NVIDIA.into()),
            smi: Some("/usr/bin/nvidia-smi".into()),
            smi_driver: Some(Ok("550.54.14\n550.54.14\n".into())),
            smi_header: Some(Ok(SMI_HEADER.into())),
        };
        let c = check_nvidia(&full);
        assert_eq!((c.state.as_str(), c.status), ("present", Status::Ok));
        assert_eq!(
            c.finding,
            "kernel driver 550.54.14; nvidia-smi: driver 550.54.14, 2 GPU(s); supports CUDA up to 12.4"
        );
        let upgraded = NvidiaFacts {
            smi_driver: Some(Ok("555.42.02\n".into())),
            ..full.clone()
        };
        assert_eq!(check_nvidia(&upgraded).state, "mismatch");
        let broken = NvidiaFacts {
            smi_driver: Some(Err("exit status: 9: NVIDIA-SMI has failed".into())),
            smi_header: None,
            ..full.clone()
        };
        let c = check_nvidia(&broken);
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.finding.contains("nvidia-smi failed: exit status: 9"),
            "{}",
            c.finding
        );
        let no_kmod = NvidiaFacts {
            proc_version: None,
            ..full
        };
        assert_eq!(check_nvidia(&no_kmod).state, "no_driver");
    }

    #[test]
    fn byte_formatting() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(fmt_bytes(64 << 20), "64 MiB");
        assert_eq!(fmt_bytes(12341828 * 1024), "11.8 GiB");
    }

    #[test]
    fn text_has_one_line_per_check_and_json_the_documented_keys() {
        let f = facts_6_18();
        let c = checks(&f);
        let text = render_text(&f, &c);
        for k in &c {
            let line = format!("{:<5} {:<13} {}", k.status.word(), k.id, k.finding);
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        let v: serde_json::Value = serde_json::from_str(&render_json(&f, &c)).unwrap();
        let arr = v["checks"].as_array().unwrap();
        assert_eq!(arr.len(), c.len());
        for k in arr {
            for key in ["id", "status", "finding", "why", "fix"] {
                assert!(k[key].is_string(), "{key} in {k}");
            }
            assert!(["ok", "warn", "fail", "info"].contains(&k["status"].as_str().unwrap()));
        }
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("a\\040b\\011c"), "a b\tc");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
        assert_eq!(unescape("\\999"), "\\999");
    }
}
