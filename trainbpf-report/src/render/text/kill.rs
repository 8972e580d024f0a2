//! One OOM kill's section: the story, the victim's fields, who grew in
//! the window before it, the killer's ranking and the pressure.

use std::fmt::Write as _;

use super::gpu;
use super::run::sum_check_line;
use super::style::{Paint, wrap, yes_no};
use super::who::{name_cell, rank_label};
use crate::model::{Constraint, Grower, Kill, Report};
use crate::render::rfc3339_ms;
use crate::term::escape as esc;
use crate::units::{human_kb, human_rate, human_secs, secs_whole, signed_kb};

pub(super) fn kill_section(
    out: &mut String,
    r: &Report,
    k: &Kill,
    i: usize,
    n: usize,
    width: usize,
    p: &Paint,
) {
    let when = match k.realtime_ns {
        Some(t) => format!("{} (+{:.1} s)", rfc3339_ms(t), r.since_start_s(k.ts_ns)),
        None => format!("+{:.1} s", r.since_start_s(k.ts_ns)),
    };
    let mut head = if n > 1 {
        format!("OOM kill {} of {n} at {when}", i + 1)
    } else {
        format!("OOM kill at {when}")
    };
    if r.source.merged() {
        head.push_str(&format!(" on {}", esc(&r.header.hostname)));
    }
    let _ = writeln!(out, "{}", p.red(&head));
    super::diagnoses::kill_head(out, r, i, width, p);
    for line in wrap(&story(r, k), width - 2) {
        let _ = writeln!(out, "  {line}");
    }
    out.push('\n');
    if let Some(w) = r.series.window(k) {
        crate::render::chart::kill_chart(out, w, width, p.0);
    }

    fields(out, r, k, p);
    growers_part(out, r, k, p);
    super::stacks::kill_lines(out, r, k);
    if let Some(s) = &k.sum_check {
        let _ = writeln!(out, "  {}", sum_check_line(s));
    }
    out.push('\n');
    if let Some(rk) = &k.ranking {
        ranking_section(out, r, k, rk, p);
    }
    if let Some(pr) = &k.pressure {
        pressure_section(out, pr);
    }
    gpu::kill_lines(out, r, i, width);
}

/// The victim, its job tree, the constraint, the memcg, the trigger and
/// the probes that saw the kill.
fn fields(out: &mut String, r: &Report, k: &Kill, p: &Paint) {
    let v = &k.victim;
    let who = match rank_label(r, v.pid, v.start_ns, &v.comm) {
        Some(rank) => format!("{rank} {}", p.bold(&esc(&v.comm))),
        None => format!("pid {} {}", v.pid, p.bold(&esc(&v.comm))),
    };
    let field = |out: &mut String, name: &str, value: String| {
        let _ = writeln!(out, "  {} {value}", p.dim(&format!("{name:<11}")));
    };
    field(
        out,
        "victim",
        format!(
            "{who}, anon {}, file {}, shmem {}, swap {}, oom_score_adj {}, uid {}",
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
            .map(|t| match rank_label(r, t.pid, t.start_ns, &t.comm) {
                Some(rank) => rank,
                None => format!("{}({})", esc(&t.comm), t.pid),
            })
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
        match rank_label(r, t.tgid, t.start_ns, &t.comm) {
            // "rank 1 (pid 14450, thread 14453) was allocating"
            Some(rank) => format!("{}{thread}) was allocating", rank.trim_end_matches(')')),
            None => format!("pid {} ({}{thread}) was allocating", t.tgid, esc(&t.comm)),
        },
    );
    let seen = k
        .sources
        .iter()
        .map(|s| match s.record {
            crate::model::OomRecordKind::Kill => format!("oom_kill_process ({})", s.probe),
            crate::model::OomRecordKind::Victim => format!("mark_victim ({})", s.probe),
        })
        .collect::<Vec<_>>()
        .join(", ");
    field(out, "seen by", seen);
    if let (Some(pts), Some(tp)) = (k.kernel_points, k.totalpages) {
        field(out, "badness", format!("{pts} points of {tp} pages"));
    }
    out.push('\n');
}

/// Who grew in the window before the kill, and the role groups.
fn growers_part(out: &mut String, r: &Report, k: &Kill, p: &Paint) {
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
                name_cell(r, g.pid, g.start_ns, &g.comm),
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
}

/// The OOM killer's ranking, reconstructed, with the kernel's own figure
/// beside it where a probe saw it.
fn ranking_section(out: &mut String, r: &Report, k: &Kill, rk: &crate::model::Ranking, p: &Paint) {
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
            name_cell(r, c.pid, c.start_ns, &c.comm),
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
pub(crate) fn story(r: &Report, k: &Kill) -> String {
    let v = &k.victim;
    let killer = killer(k);
    let who = rank_label(r, v.pid, v.start_ns, &v.comm)
        .unwrap_or_else(|| format!("pid {} ({})", v.pid, esc(&v.comm)));
    let killed = format!("killed {who}, anon-rss {}", human_kb(v.rss.anon_kb));
    let Some(top) = k.growers.first() else {
        return format!(
            "No process's memory grew in the {} before the kill; {killer} {killed}.",
            secs_whole(k.window_ns)
        );
    };
    let mut s = format!("{}; {killer} then {killed}.", grew_clause(r, top));
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

fn grew_clause(r: &Report, g: &Grower) -> String {
    let who = match rank_label(r, g.pid, g.start_ns, &g.comm) {
        // "rank 1 (pid 14450, in the job)"
        Some(rank) => rank.trim_end_matches(')').to_string(),
        None => format!("{} (pid {}", esc(&g.comm), g.pid),
    };
    let place = if g.in_job {
        "in the job"
    } else {
        "outside the job"
    };
    // The figure the ranking and the table's ADDED use; RSS only labelled.
    if let Some(h) = g.honest_kb {
        let added = if h < 0 {
            signed_kb(h)
        } else {
            human_kb(h as u64)
        };
        return format!(
            "{who}, {place}) added {added} in {} (RSS +{})",
            human_secs(g.window_ns),
            human_kb(g.grew_kb)
        );
    }
    let mut s = format!(
        "{who}, {place}) grew {} RSS in {}",
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
