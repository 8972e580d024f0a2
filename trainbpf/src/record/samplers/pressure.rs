//! Memory pressure, sampled by the recorder once a second: what the machine
//! and the job's cgroup looked like on the way to a kill.
//!
//! Sources: /proc/meminfo (MemAvailable, swap, Shmem — what /dev/shm and
//! DataLoader batches use —, Committed_AS against CommitLimit),
//! vm.overcommit_memory, the job cgroup's usage, limit and event counters,
//! and PSI (/proc/pressure/memory, Linux 4.20+, when booted with it on).
//! Reclaim and compaction stall totals come from the kernel programs.

use std::{collections::BTreeMap, fs, path::Path};

use procfs_core::{PressureRecord, parse_pressure_record};

/// Defined with the recording's events; re-exported for the collector's
/// other modules (`record.rs`, `live/status.rs`).
use trainbpf_report::decode::samples::{CgroupPressure, Pressure, Psi};

/// /proc/meminfo as name → number (kB for sizes, a count for
/// `HugePages_*`): the one parser of it, which `doctor` uses too. Lines
/// that do not parse are left out; `procfs_core::Meminfo` is not used
/// because it refuses the whole file when one of its many required fields
/// is missing.
pub fn meminfo(text: &str) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        if let Some(Ok(v)) = rest.split_whitespace().next().map(str::parse) {
            m.insert(name.trim().to_string(), v);
        }
    }
    m
}

/// The figures a pressure sample keeps from /proc/meminfo.
pub fn parse_meminfo(text: &str, p: &mut Pressure) {
    let m = meminfo(text);
    let kb = |name: &str| m.get(name).copied().unwrap_or(0);
    p.mem_total_kb = kb("MemTotal");
    p.mem_available_kb = kb("MemAvailable");
    p.swap_total_kb = kb("SwapTotal");
    p.swap_free_kb = kb("SwapFree");
    p.shmem_kb = kb("Shmem");
    p.committed_as_kb = kb("Committed_AS");
    p.commit_limit_kb = kb("CommitLimit");
}

/// /proc/pressure/memory's `some` and `full` lines: the one parser of it,
/// which `doctor` uses too. `None` when either is missing or unparsable.
pub fn psi_records(text: &str) -> Option<(PressureRecord, PressureRecord)> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        let slot = match line.split_whitespace().next() {
            Some("some") => &mut some,
            Some("full") => &mut full,
            _ => continue,
        };
        *slot = Some(parse_pressure_record(line).ok()?);
    }
    Some((some?, full?))
}

/// A PSI average as the kernel printed it: it prints two decimals, which
/// `procfs_core` reads into an `f32`; rounding back to two decimals gives
/// the very `f64` that parsing the printed text would.
pub fn psi_avg(v: f32) -> f64 {
    (f64::from(v) * 100.0).round() / 100.0
}

/// /proc/pressure/memory as a pressure sample keeps it.
pub fn parse_psi(text: &str) -> Option<Psi> {
    let (some, full) = psi_records(text)?;
    Some(Psi {
        some_avg10: psi_avg(some.avg10),
        full_avg10: psi_avg(full.avg10),
        some_total_us: some.total,
        full_total_us: full.total,
    })
}

/// `key value` lines (memory.events, memory.oom_control).
fn keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// A limit file's value; `max` or a near-2^63 number means no limit.
fn limit_kb(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    let b: u64 = t.parse().ok()?;
    (b < 1 << 60).then_some(b / 1024)
}

pub fn cgroup_pressure(dir: &Path, v2: bool) -> Option<CgroupPressure> {
    let read = |f: &str| fs::read_to_string(dir.join(f)).ok();
    if v2 {
        let events = read("memory.events").unwrap_or_default();
        let stat = read("memory.stat").unwrap_or_default();
        Some(CgroupPressure {
            file_kb: keyed(&stat, "file") / 1024,
            kernel_kb: keyed(&stat, "kernel") / 1024,
            shmem_kb: keyed(&stat, "shmem") / 1024,
            usage_kb: read("memory.current")?.trim().parse::<u64>().ok()? / 1024,
            limit_kb: limit_kb(&read("memory.max")?),
            max_events: keyed(&events, "max"),
            oom_events: keyed(&events, "oom"),
            oom_kill_events: keyed(&events, "oom_kill"),
        })
    } else {
        let oc = read("memory.oom_control").unwrap_or_default();
        let stat = read("memory.stat").unwrap_or_default();
        Some(CgroupPressure {
            file_kb: keyed(&stat, "cache") / 1024,
            shmem_kb: keyed(&stat, "shmem") / 1024,
            kernel_kb: read("memory.kmem.usage_in_bytes")
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0)
                / 1024,
            usage_kb: read("memory.usage_in_bytes")?.trim().parse::<u64>().ok()? / 1024,
            limit_kb: limit_kb(&read("memory.limit_in_bytes")?),
            max_events: read("memory.failcnt")
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0),
            oom_events: keyed(&oc, "under_oom"),
            oom_kill_events: keyed(&oc, "oom_kill"),
        })
    }
}

/// One sample of the machine (and the job's cgroup, if any).
pub fn sample(cgroup: Option<(&Path, bool)>) -> Pressure {
    let mut p = Pressure::default();
    if let Ok(t) = fs::read_to_string("/proc/meminfo") {
        parse_meminfo(&t, &mut p);
    }
    p.overcommit_memory = fs::read_to_string("/proc/sys/vm/overcommit_memory")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    p.psi = fs::read_to_string("/proc/pressure/memory")
        .ok()
        .and_then(|t| parse_psi(&t));
    p.cgroup = cgroup.and_then(|(dir, v2)| cgroup_pressure(dir, v2));
    p
}

/// Whether `now` differs from `prev` enough to be worth a record: memory
/// moved by 1 MiB or more, or any counter moved.
pub fn moved(prev: &Pressure, now: &Pressure) -> bool {
    let far = |a: u64, b: u64| a.abs_diff(b) >= 1024;
    far(now.mem_available_kb, prev.mem_available_kb)
        || far(now.swap_free_kb, prev.swap_free_kb)
        || far(now.shmem_kb, prev.shmem_kb)
        || far(now.committed_as_kb, prev.committed_as_kb)
        || now
            .cgroup
            .as_ref()
            .map(|c| (c.usage_kb / 1024, c.max_events, c.oom_kill_events))
            != prev
                .cgroup
                .as_ref()
                .map(|c| (c.usage_kb / 1024, c.max_events, c.oom_kill_events))
        || now
            .psi
            .as_ref()
            .map(|p| (p.some_total_us / 10_000, p.full_total_us / 10_000))
            != prev
                .psi
                .as_ref()
                .map(|p| (p.some_total_us / 10_000, p.full_total_us / 10_000))
        || now.stall_count != prev.stall_count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields() {
        let mut p = Pressure::default();
        parse_meminfo(
            "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   9000000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\nShmem:  2048 kB\nCommitLimit: 12288000 kB\nCommitted_AS: 400000 kB\n",
            &mut p,
        );
        assert_eq!(p.mem_total_kb, 24_576_000);
        assert_eq!(p.mem_available_kb, 9_000_000);
        assert_eq!(p.shmem_kb, 2048);
        assert_eq!(
            (p.committed_as_kb, p.commit_limit_kb),
            (400_000, 12_288_000)
        );
    }

    #[test]
    fn psi_lines() {
        let psi = parse_psi(
            "some avg10=1.50 avg60=0.20 avg300=0.00 total=20121\nfull avg10=0.75 avg60=0.00 avg300=0.00 total=12749\n",
        )
        .unwrap();
        assert_eq!(psi.some_avg10, 1.5);
        assert_eq!(psi.full_total_us, 12_749);
        assert_eq!(parse_psi(""), None);
    }

    /// The kernel prints PSI averages with two decimals; read through
    /// `procfs_core`'s `f32`, each must still be the `f64` the text says,
    /// or recordings would change.
    #[test]
    fn psi_averages_read_as_printed() {
        for n in 0..=10_000u32 {
            let text = format!("{}.{:02}", n / 100, n % 100);
            let printed: f64 = text.parse().unwrap();
            assert_eq!(psi_avg(text.parse().unwrap()), printed, "{text}");
        }
        assert_eq!(
            parse_psi("some avg10=1.50 avg60=0.20 avg300=0.00 total=20121\n"),
            None
        );
    }

    #[test]
    fn limits_and_events() {
        assert_eq!(limit_kb("max\n"), None);
        assert_eq!(limit_kb("9223372036854771712\n"), None, "v1's 'no limit'");
        assert_eq!(limit_kb("314572800\n"), Some(307_200));
        assert_eq!(
            keyed("low 0\nhigh 0\nmax 42\noom 1\noom_kill 1\n", "max"),
            42
        );
        assert_eq!(
            keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"),
            3
        );
        // v2's memory.stat also has `shmem_thp`: the key is matched whole.
        assert_eq!(keyed("file 9000\nshmem_thp 7\nshmem 4096\n", "shmem"), 4096);
    }

    #[test]
    fn small_moves_are_not_recorded() {
        let a = Pressure {
            mem_available_kb: 1_000_000,
            ..Default::default()
        };
        let mut b = a.clone();
        b.mem_available_kb += 100;
        assert!(!moved(&a, &b));
        b.mem_available_kb += 2048;
        assert!(moved(&a, &b));
    }
}
