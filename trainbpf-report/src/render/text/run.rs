//! The sections about the whole run: what the job's processes added, the
//! attribution sum check, and the footer's job outcome, lost events and
//! compaction.

use std::fmt::Write as _;

use super::style::Paint;
use super::who::{name_cell, rank_label};
use crate::model::{Cause, Report};
use crate::render::readable::short_lived_line;
use crate::render::{death_phrase, exit_phrase};
use crate::term::escape as esc;
use crate::units::{PROTECT_NS, human_kb, human_span, signed_kb};

/// Plain exits listed among the deaths; the rest are counted.
const MAX_PLAIN_EXITS: usize = 10;

/// The job's processes by what they added, with USS/PSS and role groups.
pub(super) fn job_memory_section(out: &mut String, r: &Report, p: &Paint) {
    if r.processes
        .iter()
        .all(|x| x.honest_kb.is_none() && x.uss_kb.is_none())
    {
        return;
    }
    let _ = writeln!(
        out,
        "{}",
        p.bold(
            "What the job's processes added (allocated minus freed in their own context, at most; page cache apart):"
        )
    );
    let _ = writeln!(
        out,
        "  {:>7}  {:<16}  {:>11}  {:>11}  {:>10}  {:>10}  {:>11}",
        "PID", "COMM", "ADDED", "PEAK RSS", "USS", "PSS", "PAGE CACHE"
    );
    let mut procs: Vec<_> = r
        .processes
        .iter()
        .filter(|x| !r.short_lived.contains(x.pid, x.start_ns))
        .collect();
    procs.sort_by_key(|x| std::cmp::Reverse(x.honest_peak_kb.unwrap_or(0)));
    let dash = || "-".to_string();
    for x in procs.iter().take(12) {
        let _ = writeln!(
            out,
            "  {:>7}  {:<16}  {:>11}  {:>11}  {:>10}  {:>10}  {:>11}",
            x.pid,
            name_cell(r, x.pid, x.start_ns, &x.comm),
            x.honest_peak_kb.map_or_else(dash, signed_kb),
            human_kb(x.peak_rss_kb),
            x.uss_kb.map_or_else(dash, human_kb),
            x.pss_kb.map_or_else(dash, human_kb),
            x.page_cache_kb.map_or_else(dash, signed_kb)
        );
    }
    if procs.len() > 12 {
        let _ = writeln!(out, "  … and {} more", procs.len() - 12);
    }
    if let Some(line) = short_lived_line(&r.short_lived) {
        let _ = writeln!(out, "  {}", esc(&line));
    }
    // A group of shim helpers (`bash …/pyenv-hooks which`) is trivia too.
    for g in r
        .groups
        .iter()
        .filter(|g| !g.pids.iter().all(|&p| r.short_lived.has_pid(p)))
    {
        let _ = writeln!(
            out,
            "  {} {}: {} added, {} peak RSS together",
            g.pids.len(),
            esc(&g.role),
            signed_kb(g.honest_kb),
            human_kb(g.grew_kb)
        );
    }
    out.push('\n');
}

/// "The job's processes added +5 GiB; its cgroup's usage moved +5.59 GiB,
/// +5 GiB without page cache: 100% attributed; +0 KiB to no process
/// (kernel +10 MiB). Page cache, set apart: 100 MiB at the start, +3 GiB
/// brought in by the job's processes, -2.41 GiB by others or reclaim."
/// Without the cgroup's statistics, the usage alone is compared.
pub(crate) fn sum_check_line(s: &crate::model::SumCheck) -> String {
    let mut line = format!(
        "The job's processes added {}; its cgroup's usage moved {}",
        signed_kb(s.attributed_kb),
        signed_kb(s.cgroup_delta_kb)
    );
    let (ratio, unattributed) = match (s.without_cache_kb(), s.unattributed_without_cache_kb()) {
        (Some(w), Some(u)) => {
            let _ = write!(line, ", {} without page cache", signed_kb(w));
            (s.ratio_without_cache(), u)
        }
        _ => (s.ratio(), s.unattributed_kb),
    };
    if let Some(r) = ratio {
        let _ = write!(line, ": {:.0}% attributed", r * 100.0);
    }
    let _ = write!(line, "; {} to no process", signed_kb(unattributed));
    let cache = match s.page_cache {
        Some(_) => None,
        None => s.file_delta_kb.map(|v| ("page cache", v)),
    };
    let parts: Vec<String> = [cache, s.kernel_delta_kb.map(|v| ("kernel", v))]
        .iter()
        .flatten()
        .map(|(n, v)| format!("{n} {}", signed_kb(*v)))
        .collect();
    if !parts.is_empty() {
        let _ = write!(line, " ({})", parts.join(", "));
    }
    line.push('.');
    if let Some(c) = s.page_cache {
        let _ = write!(
            line,
            " Page cache, set apart: {} at the start, {} brought in by the job's processes, {} by others or reclaim.",
            human_kb(c.at_start_kb.max(0) as u64),
            signed_kb(c.job_kb),
            signed_kb(c.other_kb())
        );
    }
    line
}

/// What `record --max-size` did to older history, so that a coarse stretch
/// of the charts is not read as the job's own behaviour.
pub(super) fn compaction_line(r: &Report) -> Option<String> {
    let c = r.compaction.as_ref()?;
    let tiers: Vec<String> = c
        .tiers
        .iter()
        .map(|[older, bucket]| {
            format!(
                "{} past {}",
                human_span(bucket * 1_000_000_000),
                human_span(older * 1_000_000_000)
            )
        })
        .collect();
    Some(format!(
        "history compacted {} time{} to stay under {}: memory samples before +{:.1} s are one per process per {} (with each bucket's peaks; the {} before each kill {}); {} samples folded; kills, deaths, process lifecycle, OOM and GPU events are all kept",
        c.count,
        if c.count == 1 { "" } else { "s" },
        human_kb(c.max_size / 1024),
        r.since_start_s(c.full_from_ns).max(0.0),
        tiers.join(", then "),
        human_span(PROTECT_NS),
        match c.kill_window_bucket_s {
            0 => "kept whole".to_string(),
            s => format!("at {} resolution", human_span(s * 1_000_000_000)),
        },
        c.samples_folded
    ))
}

/// "python3 (pid 700) exited with code 1".
pub(super) fn job_outcome(r: &Report) -> String {
    let Some(j) = &r.job else {
        return "no start record (was the recording cut short?)".into();
    };
    if j.rootless() {
        return format!("{}, attached: recorded until detached", esc(&r.title()));
    }
    // "pid 42 (python3)" for an attach, "python3 (pid 42)" for a run.
    let name = match j.attached {
        Some(_) => esc(&r.title()).into_owned(),
        None => format!(
            "{} (pid {})",
            esc(j.argv.first().map(String::as_str).unwrap_or("?")),
            j.pid
        ),
    };
    match j.exit {
        Some(s) => format!("{name} {}", exit_phrase(s)),
        None => format!("{name} had not exited when the recording ended"),
    }
}

pub(super) fn lost_detail(r: &Report) -> String {
    let mut parts: Vec<String> = r
        .lost
        .by_kind
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(i, n)| format!("{} {n}", kind_label(i)))
        .collect();

    let undecodable = r.lost.undecodable.saturating_add(r.undecodable);
    if undecodable > 0 {
        parts.push(format!("undecodable {undecodable}"));
    }
    if r.lost.dropped_disk_full > 0 {
        parts.push(format!(
            "memory samples dropped while the disk was full {}",
            r.lost.dropped_disk_full
        ));
    }
    if r.lost.proc_map_full > 0 {
        parts.push(format!("process map full {}", r.lost.proc_map_full));
    }
    if r.lost.job_map_full > 0 {
        parts.push(format!("job map full {}", r.lost.job_map_full));
    }
    if r.lost.stack_map_full > 0 {
        parts.push(format!("growth-stack map full {}", r.lost.stack_map_full));
    }
    // Kills, deaths and signals have a ring of their own: say whether it
    // held whenever the other lost records.
    let (main, precious) = r.lost.by_ring();
    if main > 0 || precious > 0 {
        parts.push(format!("kill/death/signal ring {precious}"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

pub(super) fn kind_label(i: usize) -> String {
    use trainbpf_common as c;
    match u16::try_from(i).unwrap_or(u16::MAX) {
        c::KIND_FORK => "fork".into(),
        c::KIND_EXEC => "exec".into(),
        c::KIND_EXIT => "exit".into(),
        c::KIND_MEM => "memory".into(),
        c::KIND_OOM_VICTIM => "oom victim".into(),
        c::KIND_OOM_KILL => "oom kill".into(),
        c::KIND_PRINTK => "kernel log".into(),
        c::KIND_SIGNAL => "signal".into(),
        c::KIND_OOM_ADJ => "oom_score_adj".into(),
        c::KIND_CUDA => "cuda".into(),
        c::KIND_XID => "xid".into(),
        c::KIND_NV_PAGES => "nv pages".into(),
        c::KIND_CUDA_MAP => "cuda map".into(),
        c::KIND_DEATH_STACK => "stack at death".into(),
        _ => format!("kind {i}"),
    }
}

/// Shared memory objects, each counted once.
pub(super) fn shared_memory_section(out: &mut String, r: &Report, p: &Paint) {
    let shm: Vec<_> = r
        .shared_memory
        .iter()
        .filter(|o| o.resident_kb > 0)
        .take(8)
        .collect();
    // The job's own /dev/shm, when it came close to full: what a bus
    // error in a worker needs beside it.
    let fs: Vec<_> = r
        .shm
        .filesystems
        .iter()
        .filter(|f| f.job && f.peak.size_kb > 0 && f.peak.used_kb * 2 >= f.peak.size_kb)
        .collect();
    if !shm.is_empty() || !fs.is_empty() {
        let _ = writeln!(
            out,
            "{}",
            p.bold("Shared memory, each object counted once:")
        );
        for f in fs {
            let _ = writeln!(
                out,
                "  the job's /dev/shm: {} used of {} at most ({}%), at {:.1} s",
                human_kb(f.peak.used_kb),
                human_kb(f.peak.size_kb),
                f.peak.used_kb * 100 / f.peak.size_kb,
                r.since_start_s(f.peak.ts_ns)
            );
        }
        for o in shm {
            let owner = o
                .owner_tgid
                .map_or("owner unknown".into(), |p| format!("first used by pid {p}"));
            let _ = writeln!(
                out,
                "  {}  {} resident of {}, {owner}, mapped by {} job processes",
                esc(&o.name),
                human_kb(o.resident_kb),
                human_kb(o.size_kb),
                o.mappers
            );
        }
        out.push('\n');
    }
}

/// How each job process died: all but the plain exits past
/// [`MAX_PLAIN_EXITS`].
pub(super) fn deaths_section(out: &mut String, r: &Report, p: &Paint) {
    if !r.deaths.is_empty() {
        let _ = writeln!(out, "{}", p.bold("Deaths in the job:"));
        // A long run re-spawns workers by the hundred: list every death
        // that was not a plain exit, and the root's, but only the first
        // plain exits.
        let root = r.job.as_ref().map(|j| j.pid);
        let mut plain = 0;
        for d in &r.deaths {
            if r.short_lived.contains(d.pid, d.start_ns) {
                continue;
            }
            if d.cause == Cause::Exit && Some(d.pid) != root {
                plain += 1;
                if plain > MAX_PLAIN_EXITS {
                    continue;
                }
            }
            // Several recordings merged: the host on each line.
            let host = if r.source.merged() {
                format!("{}  ", esc(&r.header.hostname))
            } else {
                String::new()
            };
            let who = rank_label(r, d.pid, d.start_ns, &d.comm)
                .unwrap_or_else(|| format!("pid {} ({})", d.pid, esc(&d.comm)));
            let _ = writeln!(
                out,
                "  +{:>7.1} s  {host}{who}: {}",
                r.since_start_s(d.ts_ns),
                death_phrase(d)
            );
        }
        if plain > MAX_PLAIN_EXITS {
            let _ = writeln!(
                out,
                "  … and {} more job processes that exited normally",
                plain - MAX_PLAIN_EXITS
            );
        }
        if let Some(line) = short_lived_line(&r.short_lived) {
            let _ = writeln!(out, "  and {}", esc(&line));
        }
        out.push('\n');
    }
}

/// The job's outcome, lost events, damage, compaction and an early stop.
pub(super) fn footer(out: &mut String, r: &Report, p: &Paint) {
    let _ = writeln!(out, "job: {}", job_outcome(r));
    let lost = r.lost_events();
    let lost_line = format!("lost events: {lost}{}", lost_detail(r));
    let _ = writeln!(
        out,
        "{}",
        if lost > 0 {
            p.yellow(&lost_line)
        } else {
            lost_line
        }
    );
    for (count, what) in [
        (
            r.lost.proc_map_full,
            "the kernel's process map was full: job processes went untracked",
        ),
        (
            r.lost.job_map_full,
            "the kernel's job map was full: job processes were not seen as the job's",
        ),
    ] {
        if count > 0 {
            let _ = writeln!(out, "{}", p.yellow(&format!("{what} ({count} times)")));
        }
    }
    for line in job_reads_lines(r) {
        let _ = writeln!(out, "{}", p.yellow(&line));
    }
    if r.lost.other_map_full > 0 {
        let _ = writeln!(
            out,
            "the kernel's process map had no room for {} processes outside the job",
            r.lost.other_map_full
        );
    }
    if r.skipped.count > 0 {
        let mut line = format!(
            "the recording has {} damaged stretch{} ({} bytes), skipped: ",
            r.skipped.count,
            if r.skipped.count == 1 { "" } else { "es" },
            r.skipped.bytes
        );
        let shown: Vec<String> = r
            .skipped
            .ranges
            .iter()
            .take(3)
            .map(|s| format!("{} bytes at byte {} ({})", s.bytes, s.offset, s.reason))
            .collect();
        line.push_str(&shown.join(", "));
        if r.skipped.count > shown.len() as u64 {
            line.push_str(&format!(
                ", and {} more",
                r.skipped.count - shown.len() as u64
            ));
        }
        line.push_str("; what follows each was read");
        let _ = writeln!(out, "{}", p.yellow(&line));
    }
    if let Some(line) = compaction_line(r) {
        let _ = writeln!(out, "{line}");
    }
    if let Some(s) = &r.stopped_early {
        let _ = writeln!(
            out,
            "{}",
            p.yellow(&format!(
                "recording stopped early at byte {}: {}; this report covers what came before",
                s.offset, s.reason
            ))
        );
    }
}

/// What reading the job's memory and files stalled on, skipped and cut
/// short (`procfs::guard`): a line of counts, and the first few notes.
pub(super) fn job_reads_lines(r: &Report) -> Vec<String> {
    let j = &r.job_reads;
    let parts: Vec<String> = [
        (j.stalled, "stalled past their deadline and abandoned"),
        (j.refused, "not made while earlier ones were blocked"),
        (j.fuse_skipped, "skipped: on a FUSE filesystem"),
        (j.queue_full, "dropped: too many waiting"),
        (j.py_cache_cleared, "CPython code caches cleared, full"),
        (
            j.py_budget_spent,
            "processes past their CPython read budget",
        ),
        (
            j.py_frames_cut,
            "Python frames left unnamed past a pass's bound",
        ),
        (
            j.names_cut,
            "executables or cgroups left unnamed, cache full",
        ),
        (
            j.unwind_refused,
            "files' unwind tables not read (frame pointers only)",
        ),
        (
            j.namer_failed,
            "requests the frames' namer failed (crashed, hung or refused)",
        ),
    ]
    .into_iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    if parts.is_empty() {
        return Vec::new();
    }
    let mut out = vec![format!(
        "reads of the job's memory and files: {}",
        parts.join(", ")
    )];
    out.extend(j.notes.iter().take(3).map(|n| format!("  {}", esc(n))));
    if j.notes.len() > 3 {
        out.push(format!(
            "  … and {} more (report --json: job_reads)",
            j.notes.len() - 3
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::sum_check_line;
    use crate::model::{CacheApart, SumCheck};

    const GIB: i64 = 1 << 20;

    fn check(page_cache: Option<CacheApart>) -> SumCheck {
        SumCheck {
            ts_ns: 1,
            cgroup_delta_kb: 5 * GIB + (600 << 10),
            attributed_kb: 5 * GIB,
            unattributed_kb: 600 << 10,
            file_delta_kb: Some(600 << 10),
            kernel_delta_kb: Some(10 << 10),
            page_cache,
        }
    }

    /// The page cache is its own line, not a shortfall
    /// of the job's.
    #[test]
    fn page_cache_is_set_apart_in_the_sum_check_line() {
        let line = sum_check_line(&check(Some(CacheApart {
            at_start_kb: 100 << 10,
            delta_kb: 600 << 10,
            job_kb: 3 * GIB,
        })));
        assert_eq!(
            line,
            "The job's processes added +5 GiB; its cgroup's usage moved +5.59 GiB, +5 GiB without page cache: \
             100% attributed; +0 KiB to no process (kernel +10 MiB). Page cache, set apart: 100 MiB at the \
             start, +3 GiB brought in by the job's processes, -2.41 GiB by others or reclaim."
        );
        // Without the cgroup's statistics, as before.
        assert_eq!(
            sum_check_line(&check(None)),
            "The job's processes added +5 GiB; its cgroup's usage moved +5.59 GiB: 90% attributed; \
             +600 MiB to no process (page cache +600 MiB, kernel +10 MiB)."
        );
    }
}
