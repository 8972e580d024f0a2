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
//!
//! One module per group of checks, each with its facts, its parsers, its
//! verdicts and the part of [`gather`] that reads them: [`memory`]
//! (overcommit, swap, shm, PSI, huge pages), [`cgroup`], [`oom_score_adj`],
//! `protect`, [`nvidia`], `helpers` and [`ebpf`] (tracefs, BTF, the
//! probes, lockdown, the ring buffer, what `record` will use). This file is
//! the driver: the shared types, the order of the checks, and [`run`].

pub mod cgroup_limit;
pub mod ebpf;
/// What record runs and loads as root, and what it refuses.
mod helpers;
pub mod memory;
pub mod nvidia;
pub mod oom_score_adj;
mod output;
mod protect;
#[cfg(test)]
pub(crate) mod testdata;

use std::fs;

use serde::Serialize;
use trainbpf_common::Config;

use crate::util::mounts::{Mount, parse_mountinfo};
use crate::{
    loader::kernel::{self, KernelBtf},
    loader::{self, Features},
};
pub use cgroup_limit::{CgroupFacts, CgroupLevel};
pub use ebpf::{LockdownFacts, TracefsFacts};
pub use helpers::HelperFacts;
pub use memory::Meminfo;
pub use nvidia::NvidiaFacts;
pub use oom_score_adj::ProcAdj;

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

/// The bracketed word of a sysfs choice file: `always [madvise] never`.
pub fn selected(text: &str) -> Option<&str> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(&text[start..end])
}

/// 1536 → "1.5 KiB": sizes as every output writes them (`units`).
pub use trainbpf_report::units::human_bytes_brief as fmt_bytes;

fn pct(part: u64, whole: u64) -> u64 {
    (part as f64 * 100.0 / whole.max(1) as f64).round() as u64
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

/// Every check, in the order they print.
pub fn checks(f: &Facts) -> Vec<Check> {
    let mem_total = f.meminfo.bytes("MemTotal");
    let features = f.features.as_ref();
    vec![
        memory::check_overcommit(f.overcommit.0, f.overcommit.1, f.overcommit.2, &f.meminfo),
        memory::check_swap(&f.meminfo),
        cgroup_limit::check_cgroup(f.cgroup.as_ref(), mem_total),
        oom_score_adj::check_oom_score_adj(f.self_oom_score_adj, &f.extreme_adj),
        protect::check_oom_protect(f.root, &f.oom_protect),
        memory::check_shm(&f.shm, mem_total),
        memory::check_psi(&f.psi),
        memory::check_thp(f.thp.0.as_deref(), f.thp.1.as_deref(), &f.meminfo),
        nvidia::check_nvidia(&f.nvidia),
        helpers::check_helpers(&f.helpers, f.nvidia.smi.as_deref()),
        ebpf::check_tracefs(&f.tracefs),
        ebpf::check_btf(&f.btf),
        ebpf::check_kprobes(f.kprobe_pmu, features),
        ebpf::check_fentry(features),
        ebpf::check_tp_btf(features),
        ebpf::check_lockdown(&f.lockdown),
        ebpf::check_ringbuf(features),
        ebpf::check_record(&f.btf, &f.lockdown, features),
    ]
}

/// `trainbpf doctor [--json]`.
pub fn run(json: bool) -> String {
    let facts = gather();
    let checks = checks(&facts);
    if json {
        output::render_json(&facts, &checks)
    } else {
        output::render_text(&facts, &checks)
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

/// `vm.overcommit_memory`, `vm.overcommit_ratio`, `vm.overcommit_kbytes`:
/// read here for the overcommit check and by `record` for its header.
pub fn read_overcommit() -> (Option<u32>, Option<u64>, Option<u64>) {
    (
        read_num("/proc/sys/vm/overcommit_memory"),
        read_num("/proc/sys/vm/overcommit_ratio"),
        read_num("/proc/sys/vm/overcommit_kbytes"),
    )
}

/// Reads the machine. As root this also mounts tracefs and securityfs if
/// they are missing, and trial-loads the eBPF object.
pub fn gather() -> Facts {
    let root = nix::unistd::geteuid().is_root();
    let mounts = parse_mountinfo(&read("/proc/self/mountinfo").unwrap_or_default());
    let meminfo = Meminfo::parse(&read("/proc/meminfo").unwrap_or_default());
    // tracefs first: the trial load below would mount it and hide the
    // machine's own state.
    let tracefs = ebpf::gather_tracefs(root, &mounts);
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
        overcommit: read_overcommit(),
        cgroup: cgroup_limit::gather_cgroup(&mounts),
        self_oom_score_adj: read_num("/proc/self/oom_score_adj"),
        extreme_adj: oom_score_adj::gather_extreme_adj(),
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
        nvidia: nvidia::gather_nvidia(),
        tracefs,
        btf,
        kprobe_pmu: kernel::kprobes_available(),
        lockdown: ebpf::gather_lockdown(root, &mounts),
        features: root.then(loader::probe_features),
        meminfo,
        helpers: helpers::gather(),
    }
}

#[cfg(test)]
mod tests {
    use super::output::render_text;
    use super::*;
    use crate::doctor::testdata::*;

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
    fn byte_formatting() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1536), "1.5 KiB");
        assert_eq!(fmt_bytes(64 << 20), "64 MiB");
        assert_eq!(fmt_bytes(12341828 * 1024), "11.8 GiB");
    }
}
