//! Fixtures the checks' tests share: this machine's facts and two
//! kernels' features.

use super::*;
use crate::loader::{Probe, Unavailable};

/// This machine's /proc/meminfo, trimmed: 24 GiB, no swap.
pub(super) const MEMINFO: &str = "MemTotal:       24683656 kB\n\
MemFree:        23000000 kB\n\
SwapTotal:             0 kB\n\
SwapFree:              0 kB\n\
Shmem:              8924 kB\n\
CommitLimit:    12341828 kB\n\
Committed_AS:      60712 kB\n\
HugePages_Total:       0\n\
HugePages_Free:        0\n\
Hugepagesize:       2048 kB\n";

pub(crate) const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
50 22 0:12 / /sys/kernel/tracing rw,relatime - tracefs tracefs rw\n\
60 22 0:40 / /mnt/with\\040space rw - tmpfs tmpfs rw\n";

pub(crate) const PROC_CGROUP_V1: &str =
    "9:name=systemd:/\n4:memory:/process_api/ee59\n1:cpu:/\n0::/\n";

pub(super) fn denied() -> Probe {
    Err(Unavailable::Denied(
        "the BPF_PROG_LOAD syscall returned Operation not permitted (os error 1)".into(),
    ))
}

pub(super) fn absent(why: &str) -> Probe {
    Err(Unavailable::Missing(why.into()))
}

/// What probe_features finds on the 6.18 Firecracker kernel
/// (../shared/PLATFORM.md): no kprobes, fentry EPERM, tp_btf works.
pub(super) fn features_6_18() -> Features {
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
pub(super) fn features_5_10() -> Features {
    Features {
        fentry: Ok(()),
        kprobe: Ok(()),
        tp_btf: absent("this kernel's mark_victim passes a pid"),
        tracepoint: Ok(()),
        ringbuf: Ok(()),
        mark_victim_fields: vec!["common_type".into(), "pid".into()],
    }
}

pub(super) fn facts_6_18() -> Facts {
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

pub(super) fn by_id<'a>(checks: &'a [Check], id: &str) -> &'a Check {
    checks
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no check {id}"))
}
