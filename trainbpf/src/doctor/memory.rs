//! The host's memory checks: overcommit, swap, /dev/shm, pressure (PSI)
//! and huge pages, all read from procfs and sysfs.

use std::collections::BTreeMap;

use super::{Check, Status, check, fmt_bytes, pct, selected};

/// `/proc/meminfo` as name → number (kB for sizes, a count for
/// `HugePages_*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meminfo(pub BTreeMap<String, u64>);

impl Meminfo {
    pub fn parse(text: &str) -> Meminfo {
        Meminfo(crate::record::samplers::pressure::meminfo(text))
    }

    /// A `kB` entry in bytes.
    pub fn bytes(&self, name: &str) -> Option<u64> {
        self.0.get(name).map(|kb| kb * 1024)
    }

    pub fn count(&self, name: &str) -> Option<u64> {
        self.0.get(name).copied()
    }
}

/// `some avg10=0.00 avg60=...` → the avg10 and avg60 of the `some` and
/// `full` lines.
pub fn parse_psi(text: &str) -> Option<[(f64, f64); 2]> {
    use crate::record::samplers::pressure::{psi_avg, psi_records};
    let (some, full) = psi_records(text)?;
    Some([some, full].map(|r| (psi_avg(r.avg10), psi_avg(r.avg60))))
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::testdata::*;

    #[test]
    fn meminfo_parses_sizes_and_counts() {
        let m = Meminfo::parse(MEMINFO);
        assert_eq!(m.bytes("MemTotal"), Some(24683656 * 1024));
        assert_eq!(m.bytes("SwapTotal"), Some(0));
        assert_eq!(m.count("HugePages_Total"), Some(0));
        assert_eq!(m.bytes("Nope"), None);
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
}
