//! The report for people: per kill, a short story with the figures that
//! back it, then the tables. Also the one-screen verdict `record` prints
//! when the job ends.

use std::fmt::Write as _;

use crate::model::{Cause, Constraint, Grower, Kill, Report};
use crate::render::{death_phrase, exit_phrase, rfc3339_ms};
use crate::units::{
    PROTECT_NS, human_kb, human_rate, human_secs, human_span, secs_whole, signed_kb,
};
// Every name, argument, path and cgroup below came from a process: through
// `esc` before it is formatted (see crate::term).
use crate::term::{escape as esc, escape_join};

/// GPU and pinned memory, CUDA OOMs, Xid.
mod gpu;
/// Suspected leaks and the time to the limit.
mod leaks;
pub use leaks::report as leaks_report;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextOptions {
    /// ANSI colour; the caller decides (terminal, `NO_COLOR`, `--color`).
    pub color: bool,
    /// Prose is wrapped to this many columns.
    pub width: usize,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions {
            color: false,
            width: 100,
        }
    }
}

/// Growers and memory users shown when there is no kill to explain.
const TOP_USERS: usize = 5;
/// Growers named in the verdict.
const VERDICT_GROWERS: usize = 3;
/// Kills spelled out in the verdict; the rest are counted.
const VERDICT_KILLS: usize = 3;
/// Plain exits listed among the deaths; the rest are counted.
const MAX_PLAIN_EXITS: usize = 10;
/// Narrower than this and wrapping does more harm than good.
const MIN_WIDTH: usize = 40;

struct Paint(bool);

impl Paint {
    fn wrap(&self, code: &str, s: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn bold(&self, s: &str) -> String {
        self.wrap("1", s)
    }
    fn red(&self, s: &str) -> String {
        self.wrap("1;31", s)
    }
    fn yellow(&self, s: &str) -> String {
        self.wrap("33", s)
    }
    fn dim(&self, s: &str) -> String {
        self.wrap("2", s)
    }
}

pub fn render(r: &Report, o: &TextOptions) -> String {
    let p = Paint(o.color);
    let width = o.width.max(MIN_WIDTH);
    let mut out = String::new();

    let title = match &r.job {
        Some(j) => format!("trainbpf report: {}", escape_join(&j.argv)),
        None => "trainbpf report".to_string(),
    };
    let _ = writeln!(out, "{}", p.bold(&title));
    let mut about = format!(
        "kernel {}, {} recorded",
        or_unknown(&r.header.kernel),
        human_secs(r.duration_ns())
    );
    if let Some(t) = r.first_ns.and_then(|t| r.realtime_ns(t)) {
        let _ = write!(about, " from {}", rfc3339_ms(t));
    }
    let _ = writeln!(out, "{}", p.dim(&about));
    for f in &r.header.fallbacks {
        let _ = writeln!(
            out,
            "{}",
            p.dim(&format!("probe {} not used: {}", f.probe, f.reason))
        );
    }
    out.push('\n');

    if r.kills.is_empty() {
        let _ = writeln!(out, "{}", p.bold("no OOM kill recorded"));
        out.push('\n');
        if !r.top_memory.is_empty() {
            let _ = writeln!(out, "Top memory users (peak resident):");
            let _ = writeln!(
                out,
                "  {:>7}  {:<16}  {:>11}  JOB",
                "PID", "COMM", "PEAK RSS"
            );
            for u in r.top_memory.iter().take(TOP_USERS) {
                let _ = writeln!(
                    out,
                    "  {:>7}  {:<16}  {:>11}  {}",
                    u.pid,
                    esc(&u.comm),
                    human_kb(u.peak_rss_kb),
                    yes_no(u.in_job)
                );
            }
            out.push('\n');
        }
    }

    let n = r.kills.len();
    for (i, k) in r.kills.iter().enumerate() {
        kill_section(&mut out, r, k, i, n, width, &p);
    }

    leaks::section(&mut out, r, width, &p);
    job_memory_section(&mut out, r, &p);
    let shm: Vec<_> = r
        .shared_memory
        .iter()
        .filter(|o| o.resident_kb > 0)
        .take(8)
        .collect();
    if !shm.is_empty() {
        let _ = writeln!(
            out,
            "{}",
            p.bold("Shared memory, each object counted once:")
        );
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
    if let Some(s) = &r.attribution_at_peak {
        let _ = writeln!(out, "At the job cgroup's peak: {}\n", sum_check_line(s));
    }
    super::chart::run_summary(&mut out, r, width, o.color);

    gpu::section(&mut out, r, width, &p);
    if !r.deaths.is_empty() {
        let _ = writeln!(out, "{}", p.bold("Deaths in the job:"));
        // A long run re-spawns workers by the hundred: list every death
        // that was not a plain exit, and the root's, but only the first
        // plain exits.
        let root = r.job.as_ref().map(|j| j.pid);
        let mut plain = 0;
        for d in &r.deaths {
            if d.cause == Cause::Exit && Some(d.pid) != root {
                plain += 1;
                if plain > MAX_PLAIN_EXITS {
                    continue;
                }
            }
            let _ = writeln!(
                out,
                "  +{:>7.1} s  pid {} ({}): {}",
                r.since_start_s(d.ts_ns),
                d.pid,
                esc(&d.comm),
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
        out.push('\n');
    }
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
    if let Some(c) = &r.compaction {
        let _ = writeln!(out, "{}", compaction_line(r, c));
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
    finish(out, o.color)
}

/// The last guard before a terminal: anything that reached `out` without
/// [`esc`] (a string from a hand-made recording's header, a field added
/// later) is escaped here, keeping line breaks and, with colour on, the
/// renderer's own colour codes.
pub(crate) fn finish(out: String, color: bool) -> String {
    let clean = if color {
        crate::term::sanitize_colored(&out)
    } else {
        crate::term::sanitize(&out)
    };
    match clean {
        std::borrow::Cow::Borrowed(_) => out,
        std::borrow::Cow::Owned(s) => s,
    }
}

fn kill_section(
    out: &mut String,
    r: &Report,
    k: &Kill,
    i: usize,
    n: usize,
    width: usize,
    p: &Paint,
) {
    let v = &k.victim;
    let when = match k.realtime_ns {
        Some(t) => format!("{} (+{:.1} s)", rfc3339_ms(t), r.since_start_s(k.ts_ns)),
        None => format!("+{:.1} s", r.since_start_s(k.ts_ns)),
    };
    let head = if n > 1 {
        format!("OOM kill {} of {n} at {when}", i + 1)
    } else {
        format!("OOM kill at {when}")
    };
    let _ = writeln!(out, "{}", p.red(&head));
    for line in wrap(&story(k), width - 2) {
        let _ = writeln!(out, "  {line}");
    }
    out.push('\n');
    if let Some(w) = r.series.window(k) {
        super::chart::kill_chart(out, w, width, p.0);
    }

    let field = |out: &mut String, name: &str, value: String| {
        let _ = writeln!(out, "  {} {value}", p.dim(&format!("{name:<11}")));
    };
    field(
        out,
        "victim",
        format!(
            "pid {} {}, anon {}, file {}, shmem {}, swap {}, oom_score_adj {}, uid {}",
            v.pid,
            p.bold(&esc(&v.comm)),
            human_kb(v.rss.anon_kb),
            human_kb(v.rss.file_kb),
            human_kb(v.rss.shmem_kb),
            human_kb(v.rss.swap_kb),
            v.oom_score_adj,
            v.uid
        ),
    );
    let tree = if v.tree.is_empty() {
        "not in the job".to_string()
    } else {
        v.tree
            .iter()
            .map(|t| format!("{}({})", esc(&t.comm), t.pid))
            .collect::<Vec<_>>()
            .join(" → ")
    };
    field(out, "job tree", tree);
    let why = match k.constraint {
        Constraint::Memcg => "a memory cgroup hit its limit",
        Constraint::None => "the whole machine ran out of memory",
        Constraint::Cpuset => "the cpuset's memory nodes ran out",
        Constraint::MemoryPolicy => "the memory policy's nodes ran out",
        Constraint::Unknown => "no oom_kill_process probe and no kernel log line said",
    };
    field(
        out,
        "constraint",
        format!("{} ({why})", k.constraint.as_str()),
    );
    let mut m = k
        .memcg
        .as_deref()
        .map_or_else(|| "unknown".into(), |m| esc(m).into_owned());
    match (k.memcg_usage_kb, k.memcg_limit_kb) {
        (Some(u), Some(l)) => {
            let _ = write!(m, ", usage {} of limit {}", human_kb(u), human_kb(l));
        }
        (Some(u), None) => {
            let _ = write!(m, ", usage {}", human_kb(u));
        }
        (None, Some(l)) => {
            let _ = write!(m, ", limit {}", human_kb(l));
        }
        (None, None) => {}
    }
    if let Some(f) = k.memcg_failcnt.filter(|&f| f > 0) {
        let _ = write!(m, ", {f} failed charges");
    }
    if k.task_memcg.is_some() && k.task_memcg != k.memcg {
        let _ = write!(
            m,
            "; victim in {}",
            esc(k.task_memcg.as_deref().unwrap_or(""))
        );
    }
    field(out, "memcg", m);
    let t = &k.trigger;
    let thread = if t.pid != t.tgid && t.pid != 0 {
        format!(", thread {}", t.pid)
    } else {
        String::new()
    };
    field(
        out,
        "trigger",
        format!("pid {} ({}{thread}) was allocating", t.tgid, esc(&t.comm)),
    );
    let seen = k
        .sources
        .iter()
        .map(|s| match s.record {
            crate::decode::OomRecordKind::Kill => format!("oom_kill_process ({})", s.probe),
            crate::decode::OomRecordKind::Victim => format!("mark_victim ({})", s.probe),
        })
        .collect::<Vec<_>>()
        .join(", ");
    field(out, "seen by", seen);
    if let (Some(pts), Some(tp)) = (k.kernel_points, k.totalpages) {
        field(out, "badness", format!("{pts} points of {tp} pages"));
    }
    out.push('\n');

    if k.growers.is_empty() {
        let _ = writeln!(
            out,
            "  No process grew in the {} before the kill.",
            secs_whole(k.window_ns)
        );
    } else {
        let _ = writeln!(
            out,
            "  Memory growth in the {} before the kill:",
            secs_whole(k.window_ns)
        );
        let _ = writeln!(
            out,
            "  {:>7}  {:<16}  {:>11}  {:>11}  {:>8}  {:>12}  {:>11}  JOB",
            "PID", "COMM", "ADDED", "RSS GREW", "OVER", "RATE", "RSS AT KILL"
        );
        for g in &k.growers {
            let mut row = format!(
                "  {:>7}  {:<16}  {:>11}  {:>11}  {:>8}  {:>12}  {:>11}  {}",
                g.pid,
                esc(&g.comm),
                g.honest_kb.map_or("-".into(), signed_kb),
                format!("+{}", human_kb(g.grew_kb)),
                human_secs(g.window_ns),
                g.rate_kb_per_s.map_or("-".into(), human_rate),
                human_kb(g.rss_kb),
                yes_no(g.in_job)
            );
            if g.born_in_window {
                row.push_str("  (born in window)");
            }
            if g.is_victim {
                row.push_str("  ← victim");
                row = p.red(&row);
            }
            let _ = writeln!(out, "{row}");
        }
    }
    out.push('\n');
    if k.growers.iter().any(|g| g.honest_kb.is_some()) {
        let _ = writeln!(
            out,
            "  ADDED is memory allocated minus freed in the process's own context: a fork adds\n  nothing to the child, a copy-on-write break counts for the process that breaks it."
        );
    }
    for g in &k.groups {
        let _ = writeln!(
            out,
            "  {} {}: {} added ({} RSS growth) in {}",
            g.pids.len(),
            esc(&g.role),
            signed_kb(g.honest_kb),
            human_kb(g.grew_kb),
            human_secs(g.window_ns)
        );
    }
    if let Some(s) = &k.sum_check {
        let _ = writeln!(out, "  {}", sum_check_line(s));
    }
    out.push('\n');
    if let Some(rk) = &k.ranking {
        ranking_section(out, k, rk, p);
    }
    if let Some(pr) = &k.pressure {
        pressure_section(out, pr);
    }
    gpu::kill_lines(out, r, i, width);
}

/// The job's processes by what they added, with USS/PSS and role groups.
fn job_memory_section(out: &mut String, r: &Report, p: &Paint) {
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
    let mut procs: Vec<_> = r.processes.iter().collect();
    procs.sort_by_key(|x| std::cmp::Reverse(x.honest_peak_kb.unwrap_or(0)));
    let dash = || "-".to_string();
    for x in procs.iter().take(12) {
        let _ = writeln!(
            out,
            "  {:>7}  {:<16}  {:>11}  {:>11}  {:>10}  {:>10}  {:>11}",
            x.pid,
            esc(&x.comm),
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
    for g in &r.groups {
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

/// "The job's processes added 2.9 GiB; its cgroup's usage grew 3.0 GiB:
/// 97% attributed; 90 MiB to no process (page cache +60 MiB, kernel +10 MiB)."
pub(crate) fn sum_check_line(s: &crate::model::SumCheck) -> String {
    let mut line = format!(
        "The job's processes added {}; its cgroup's usage moved {}",
        signed_kb(s.attributed_kb),
        signed_kb(s.cgroup_delta_kb)
    );
    if let Some(r) = s.ratio() {
        let _ = write!(line, ": {:.0}% attributed", r * 100.0);
    }
    let _ = write!(line, "; {} to no process", signed_kb(s.unattributed_kb));
    let parts: Vec<String> = [
        ("page cache", s.file_delta_kb),
        ("kernel", s.kernel_delta_kb),
    ]
    .iter()
    .filter_map(|(n, v)| v.map(|v| format!("{n} {}", signed_kb(v))))
    .collect();
    if !parts.is_empty() {
        let _ = write!(line, " ({})", parts.join(", "));
    }
    line.push('.');
    line
}

/// The OOM killer's ranking, reconstructed, with the kernel's own figure
/// beside it where a probe saw it.
fn ranking_section(out: &mut String, k: &Kill, rk: &crate::model::Ranking, p: &Paint) {
    let mut head = format!(
        "  Why this victim (badness reconstructed from tracked memory; totalpages {} from {}",
        rk.totalpages,
        rk.totalpages_source.as_str()
    );
    match (k.kernel_points, rk.victim_points, rk.agrees_with_kernel) {
        (Some(kp), Some(vp), Some(agree)) => {
            let _ = write!(
                head,
                "; kernel's own points {kp}, reconstruction {vp}: {}",
                if agree { "they agree" } else { "they differ" }
            );
        }
        _ => head.push_str("; the kernel's own points were not available"),
    }
    head.push_str("):");
    let _ = writeln!(out, "{head}");
    let _ = writeln!(
        out,
        "  {:>7}  {:<16}  {:>10}  {:>11}  {:>9}  {:>9}  {:>5}  JOB",
        "PID", "COMM", "POINTS", "RSS", "SWAP", "PGTABLES", "ADJ"
    );
    for c in rk.candidates.iter().take(5) {
        let mut row = format!(
            "  {:>7}  {:<16}  {:>10}  {:>11}  {:>9}  {:>9}  {:>5}  {}",
            c.pid,
            esc(&c.comm),
            c.points,
            human_kb(c.rss_kb),
            human_kb(c.swap_kb),
            human_kb(c.pgtables_kb),
            c.oom_score_adj,
            yes_no(c.in_job)
        );
        if c.is_victim {
            row.push_str("  ← victim");
            row = p.red(&row);
        }
        let _ = writeln!(out, "{row}");
    }
    out.push('\n');
}

fn pressure_section(out: &mut String, pr: &crate::model::PressureBefore) {
    let mut s = format!(
        "Pressure: available memory {} → {} over {} (lowest {}) of {} total",
        human_kb(pr.available_start_kb),
        human_kb(pr.available_at_kill_kb),
        human_secs(pr.span_ns),
        human_kb(pr.available_min_kb),
        human_kb(pr.mem_total_kb)
    );
    if pr.swap_total_kb > 0 {
        let _ = write!(
            s,
            "; swap {} of {} used",
            human_kb(pr.swap_used_kb),
            human_kb(pr.swap_total_kb)
        );
    } else {
        s.push_str("; no swap");
    }
    let _ = write!(
        s,
        "; shmem {}; committed {} of limit {}",
        human_kb(pr.shmem_kb),
        human_kb(pr.committed_as_kb),
        human_kb(pr.commit_limit_kb)
    );
    if let (Some(u), Some(l)) = (pr.cgroup_usage_kb, pr.cgroup_limit_kb) {
        let _ = write!(s, "; job cgroup {} of {}", human_kb(u), human_kb(l));
        if let Some(h) = pr.cgroup_max_events.filter(|&h| h > 0) {
            let _ = write!(s, " ({h} limit hits)");
        }
    }
    let stall: u64 = pr.stall_ms.iter().sum();
    let _ = write!(
        s,
        "; reclaim/compaction stalls {} ms (direct {}, memcg {}, compaction {})",
        stall, pr.stall_ms[0], pr.stall_ms[1], pr.stall_ms[2]
    );
    if pr.reclaim_freed_kb > 0 {
        let _ = write!(
            s,
            "; the job's own reclaim freed {} (others' memory and cache, not charged to the job's processes)",
            human_kb(pr.reclaim_freed_kb)
        );
    }
    match (pr.psi_some_avg10, pr.psi_some_stall_ms) {
        (Some(a), Some(ms)) => {
            let _ = write!(s, "; PSI some avg10 {a:.2}%, {ms} ms stalled");
        }
        _ => s.push_str("; PSI unavailable"),
    }
    s.push('.');
    for line in wrap(&s, 98) {
        let _ = writeln!(out, "  {line}");
    }
    out.push('\n');
}

/// One or two sentences: who grew, and what the kernel did about it. The
/// HTML report tells the same story.
pub(crate) fn story(k: &Kill) -> String {
    let v = &k.victim;
    let killer = killer(k);
    let killed = format!(
        "killed pid {} ({}), anon-rss {}",
        v.pid,
        esc(&v.comm),
        human_kb(v.rss.anon_kb)
    );
    let Some(top) = k.growers.first() else {
        return format!(
            "No process's memory grew in the {} before the kill; {killer} {killed}.",
            secs_whole(k.window_ns)
        );
    };
    let mut s = format!("{}; {killer} then {killed}.", grew_clause(top));
    if let Some(pr) = &k.pressure {
        let stall: u64 = pr.stall_ms.iter().sum();
        let fell = pr.available_start_kb > pr.available_at_kill_kb + pr.mem_total_kb / 10;
        if fell {
            let _ = write!(
                s,
                " Available memory fell from {} to {} in {}",
                human_kb(pr.available_start_kb),
                human_kb(pr.available_at_kill_kb),
                human_secs(pr.span_ns)
            );
        }
        if stall >= 100 {
            let _ = write!(
                s,
                "{} reclaim and compaction stalled tasks for {:.1} s",
                if fell { ";" } else { " Before the kill," },
                stall as f64 / 1000.0
            );
        }
        if fell || stall >= 100 {
            s.push('.');
        }
    }
    if !top.is_victim {
        let own = k.growers.iter().find(|g| g.is_victim);
        let _ = write!(
            s,
            " The victim was not the top grower ({});",
            match own {
                Some(g) => format!("it grew {}", human_kb(g.grew_kb)),
                None => "it did not grow in the window".into(),
            }
        );
        if v.oom_score_adj > 0 {
            let _ = write!(
                s,
                " its oom_score_adj of {} made it the kernel's preferred victim.",
                v.oom_score_adj
            );
        } else {
            s.push_str(
                " the kernel kills the process with the highest badness (resident memory, \
                 swap and page tables, plus oom_score_adj), not the one that grew.",
            );
        }
    }
    s
}

fn grew_clause(g: &Grower) -> String {
    let mut s = format!(
        "{} (pid {}, {}) grew {} in {}",
        esc(&g.comm),
        g.pid,
        if g.in_job {
            "in the job"
        } else {
            "outside the job"
        },
        human_kb(g.grew_kb),
        human_secs(g.window_ns)
    );
    if let Some(rate) = g.rate_kb_per_s {
        let _ = write!(s, " ({})", human_rate(rate));
    }
    s
}

/// "the kernel's memcg OOM killer (limit 300 MiB in /trainbpf-77)".
fn killer(k: &Kill) -> String {
    let limit = k.memcg_limit_kb.map(human_kb);
    let memcg = k.memcg.as_deref().map(esc);
    let scope = match (k.constraint, &limit, &memcg) {
        (Constraint::Memcg, Some(l), Some(m)) => format!(" (limit {l} in {m})"),
        (Constraint::Memcg, Some(l), None) => format!(" (limit {l})"),
        (Constraint::Memcg | Constraint::Unknown, None, Some(m)) => format!(" (in {m})"),
        (Constraint::None, _, _) => " (the machine ran out of memory)".into(),
        (Constraint::Cpuset, _, _) => " (constrained by a cpuset)".into(),
        (Constraint::MemoryPolicy, _, _) => " (constrained by a memory policy)".into(),
        _ => String::new(),
    };
    let kind = match k.constraint {
        Constraint::Memcg => "memcg ",
        Constraint::None => "global ",
        _ => "",
    };
    format!("the kernel's {kind}OOM killer{scope}")
}

/// What `record --max-size` did to older history, so that a coarse stretch
/// of the charts is not read as the job's own behaviour.
fn compaction_line(r: &Report, c: &crate::decode::Compaction) -> String {
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
    format!(
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
    )
}

/// "python3 (pid 700) exited with code 1".
fn job_outcome(r: &Report) -> String {
    let Some(j) = &r.job else {
        return "no start record (was the recording cut short?)".into();
    };
    let name = esc(j.argv.first().map(String::as_str).unwrap_or("?"));
    match j.exit {
        Some(s) => format!("{name} (pid {}) {}", j.pid, exit_phrase(s)),
        None => format!(
            "{name} (pid {}) had not exited when the recording ended",
            j.pid
        ),
    }
}

fn lost_detail(r: &Report) -> String {
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

fn kind_label(i: usize) -> String {
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
        _ => format!("kind {i}"),
    }
}

/// The short verdict `record` prints on stderr when the job ends.
pub fn verdict(r: &Report) -> String {
    let mut out = String::new();
    for k in r.kills.iter().take(VERDICT_KILLS) {
        let v = &k.victim;
        let mut what = match k.constraint {
            Constraint::Memcg => "memcg OOM".to_string(),
            Constraint::None => "global OOM".to_string(),
            Constraint::Unknown => "OOM".to_string(),
            c => format!("OOM ({})", c.as_str()),
        };
        if let Some(m) = &k.memcg {
            let _ = write!(what, " in {}", esc(m));
        }
        if let Some(l) = k.memcg_limit_kb {
            let _ = write!(what, " (limit {})", human_kb(l));
        }
        let _ = writeln!(
            out,
            "trainbpf: {what} killed pid {} ({}), RSS {}{}",
            v.pid,
            esc(&v.comm),
            human_kb(v.rss.resident_kb()),
            if v.in_job { "" } else { ", outside the job" }
        );
        if !k.growers.is_empty() {
            let top = k
                .growers
                .iter()
                .take(VERDICT_GROWERS)
                .map(|g| format!("{}({}) +{}", esc(&g.comm), g.pid, human_kb(g.grew_kb)))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                out,
                "trainbpf: grew most in the {} before: {top}",
                secs_whole(k.window_ns)
            );
        }
    }
    if r.kills.len() > VERDICT_KILLS {
        let _ = writeln!(
            out,
            "trainbpf: … and {} more OOM kills",
            r.kills.len() - VERDICT_KILLS
        );
    }
    if r.kills.is_empty() {
        let _ = writeln!(out, "trainbpf: no OOM kill recorded");
    }
    let _ = writeln!(out, "trainbpf: job {}", job_outcome(r));
    // The root's cause, and any other process that did not simply exit.
    let root = r.job.as_ref().map(|j| j.pid);
    for d in r
        .deaths
        .iter()
        .filter(|d| Some(d.pid) == root || d.cause != Cause::Exit)
        .take(VERDICT_KILLS + 1)
    {
        let _ = writeln!(
            out,
            "trainbpf: pid {} ({}) {}",
            d.pid,
            esc(&d.comm),
            death_phrase(d)
        );
    }
    gpu::verdict(&mut out, r);
    leaks::verdict(&mut out, r);
    if r.lost_events() > 0 {
        let _ = writeln!(
            out,
            "trainbpf: lost events: {}{}",
            r.lost_events(),
            lost_detail(r)
        );
    }
    finish(out, false)
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() { "unknown" } else { s }
}

/// Greedy word wrap; a word longer than the line stays whole.
pub(crate) fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in s.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::ExitStatus;
    use crate::render::fixture::sample_report;

    fn plain(r: &Report) -> String {
        render(
            r,
            &TextOptions {
                color: false,
                width: 1000,
            },
        )
    }

    #[test]
    fn names_victim_and_top_grower_with_figures() {
        let t = plain(&sample_report());
        assert!(
            t.contains(
                "pt_data_worker (pid 812, in the job) grew 250.1 MiB in 12.0 s (20.8 MiB/s); \
                 the kernel's memcg OOM killer (limit 300 MiB in /trainbpf-77) then killed \
                 pid 812 (pt_data_worker), anon-rss 251 MiB."
            ),
            "{t}"
        );
        assert!(t.contains("python3(700) → pt_data_worker(812)"), "{t}");
        assert!(t.contains("memcg (a memory cgroup hit its limit)"), "{t}");
        assert!(
            t.contains("/trainbpf-77, usage 300 MiB of limit 300 MiB, 3 failed charges"),
            "{t}"
        );
        assert!(t.contains("growth in the 60 s before the kill"), "{t}");
        assert!(t.contains("killed by signal 9 (SIGKILL)"), "{t}");
        // Losses are always stated, and broken down when there are some.
        assert!(
            t.contains("lost events: 6 (memory 3, undecodable 3, kill/death/signal ring 0)"),
            "{t}"
        );
        assert!(!t.contains('\x1b'), "no colour unless asked");
        let c = render(
            &sample_report(),
            &TextOptions {
                color: true,
                width: 80,
            },
        );
        assert!(c.contains("\x1b[1;31m"));
    }

    #[test]
    fn a_victim_that_did_not_grow_is_explained() {
        let mut r = sample_report();
        let k = &mut r.kills[0];
        k.victim.pid = 813;
        k.victim.comm = "sacrifice".into();
        k.victim.oom_score_adj = 1000;
        k.growers.retain(|g| !g.is_victim);
        k.growers[0].grew_kb = 200 * 1024;
        let t = plain(&r);
        assert!(
            t.contains("python3 (pid 700, in the job) grew 200 MiB"),
            "{t}"
        );
        assert!(t.contains("then killed pid 813 (sacrifice)"), "{t}");
        assert!(t.contains("it did not grow in the window"), "{t}");
        assert!(t.contains("oom_score_adj of 1000"), "{t}");
    }

    #[test]
    fn no_kill_says_so_with_outcome_and_users() {
        let mut r = sample_report();
        r.kills.clear();
        r.lost = Default::default();
        r.undecodable = 0;
        r.job.as_mut().unwrap().exit = Some(ExitStatus::Code(1));
        r.top_memory.push(crate::model::MemoryUser {
            pid: 700,
            start_ns: 1,
            comm: "python3".into(),
            peak_rss_kb: 40_960,
            in_job: true,
        });
        r.stopped_early = Some(crate::recording::Stop {
            offset: 4096,
            reason: "frame checksum mismatch".into(),
        });
        let t = plain(&r);
        assert!(t.contains("no OOM kill recorded"), "{t}");
        assert!(t.contains("exited with code 1"), "{t}");
        assert!(t.contains("lost events: 0\n"), "{t}");
        assert!(t.contains("python3") && t.contains("40 MiB"), "{t}");
        assert!(
            t.contains("stopped early at byte 4096: frame checksum mismatch"),
            "{t}"
        );
    }

    #[test]
    fn skipped_damage_is_noted() {
        let mut r = sample_report();
        let skip = |offset| crate::recording::Skip {
            offset,
            bytes: 100,
            reason: "frame checksum mismatch".into(),
        };
        r.skipped = crate::recording::Skipped {
            ranges: vec![skip(500), skip(900), skip(1300), skip(1700)],
            count: 5,
            bytes: 500,
        };
        let t = plain(&r);
        assert!(
            t.contains("the recording has 5 damaged stretches (500 bytes), skipped: 100 bytes at byte 500 (frame checksum mismatch)"),
            "{t}"
        );
        assert!(
            t.contains(", and 2 more; what follows each was read"),
            "{t}"
        );
    }

    #[test]
    fn prose_wraps_to_width() {
        let t = render(
            &sample_report(),
            &TextOptions {
                color: false,
                width: 60,
            },
        );
        let story: Vec<_> = t
            .lines()
            .skip_while(|l| !l.starts_with("OOM kill"))
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        assert!(story.len() > 1, "{t}");
        assert!(story.iter().all(|l| l.chars().count() <= 60), "{story:#?}");
    }

    #[test]
    fn verdict_is_short_and_complete() {
        let v = verdict(&sample_report());
        assert!(
            v.contains("memcg OOM in /trainbpf-77 (limit 300 MiB) killed pid 812 (pt_data_worker), RSS 253 MiB"),
            "{v}"
        );
        assert!(
            v.contains("pt_data_worker(812) +250.1 MiB, python3(700) +2 MiB"),
            "{v}"
        );
        assert!(v.contains("killed by signal 9 (SIGKILL)"), "{v}");
        assert!(v.contains("lost events: 6"), "{v}");
        assert!(v.lines().count() <= 4, "{v}");

        let mut r = sample_report();
        r.kills.clear();
        r.lost = Default::default();
        r.undecodable = 0;
        let v = verdict(&r);
        assert!(v.contains("no OOM kill recorded"), "{v}");
        assert!(!v.contains("lost events"), "{v}");
    }
}
