//! Terminal charts: sparklines of memory before each kill and over the
//! whole run. Block characters (▁…█) read in any UTF-8 terminal and stay
//! readable when the report is piped into a file; colour only marks which
//! line is the victim and which the top grower, so nothing is lost without
//! it.

use std::fmt::Write as _;

use super::text::style::Paint;
use crate::model::{KillWindow, Pick, ProcLine, Report};
use crate::units::{human_duration, human_kb};

const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
/// Name column (comm is at most 15 bytes) and pid column.
const NAME: usize = 16;
const PID: usize = 7;
/// Room kept right of the sparkline for the figures.
const FIGURES: usize = 30;
const MIN_COLS: usize = 12;
const MAX_COLS: usize = 120;
/// Process lines in the run summary, victims and top growers first.
const RUN_LINES: usize = 10;

/// One value per column as a block character scaled to `hi`; a column
/// without a value (before a process was seen, after it ended) is blank.
pub(crate) fn sparkline(values: &[Option<u64>], hi: u64) -> String {
    values
        .iter()
        .map(|v| match v {
            None => ' ',
            Some(_) if hi == 0 => BLOCKS[0],
            Some(v) => {
                let level = (*v as u128 * 8).div_ceil(hi as u128).clamp(1, 8) as usize;
                BLOCKS[level - 1]
            }
        })
        .collect()
}

/// `points` squeezed into `n` columns, each the `pick` of its points.
pub(crate) fn squeeze(points: &[Option<u64>], n: usize, pick: Pick) -> Vec<Option<u64>> {
    if n == 0 || points.is_empty() {
        return Vec::new();
    }
    (0..n)
        .map(|c| {
            let a = c * points.len() / n;
            let b = ((c + 1) * points.len() / n).max(a + 1).min(points.len());
            points[a..b]
                .iter()
                .flatten()
                .copied()
                .reduce(|x, y| match pick {
                    Pick::Min => x.min(y),
                    Pick::Max => x.max(y),
                    Pick::Last => y,
                })
        })
        .collect()
}

/// Columns the sparklines get at this terminal width.
fn cols(width: usize) -> usize {
    width
        .saturating_sub(4 + NAME + 1 + PID + 2 + FIGURES)
        .clamp(MIN_COLS, MAX_COLS)
}

fn label(name: &str, pid: Option<u32>) -> String {
    let name: String = crate::term::escape(name).chars().take(NAME).collect();
    let pid = pid.map(|p| p.to_string()).unwrap_or_default();
    format!("{name:<NAME$} {pid:>PID$}")
}

/// A label for a line that is not one process.
fn wide_label(s: &str) -> String {
    let s: String = s.chars().take(NAME + 1 + PID).collect();
    format!("{s:<w$}", w = NAME + 1 + PID)
}

/// The chart under a kill's story: the top growers and the victim over the
/// window, then the cgroup's usage against its limit and the machine's
/// available memory.
pub(crate) fn kill_chart(out: &mut String, w: &KillWindow, width: usize, color: bool) {
    let p = Paint(color);
    let n = cols(width);
    let lines: Vec<(&crate::model::WindowLine, Vec<Option<u64>>)> = w
        .lines
        .iter()
        .map(|l| (l, squeeze(&l.points, n, Pick::Max)))
        .filter(|(_, v)| v.iter().any(Option::is_some))
        .collect();
    if lines.is_empty() {
        return;
    }
    let hi = lines
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .copied()
        .max()
        .unwrap_or(0);
    let span = w.kill_ns - w.start_ns;
    let step_s = (span as f64 / n as f64) / 1e9;
    let _ = writeln!(
        out,
        "  {}",
        p.wrap(
            "1",
            &format!(
                "Resident memory (RSS) in the {} before the kill (one column ≈ {}, bars up to {}):",
                human_duration(span),
                if step_s >= 1.0 {
                    format!("{step_s:.0} s")
                } else {
                    format!("{:.0} ms", step_s * 1000.0)
                },
                human_kb(hi)
            )
        )
    );
    for (l, v) in &lines {
        let last = v.iter().rev().flatten().next().copied().unwrap_or(0);
        let mut tags = Vec::new();
        if l.is_victim {
            tags.push("victim");
        }
        if l.is_top_grower {
            tags.push("top grower");
        }
        if !l.in_job {
            tags.push("outside the job");
        }
        let row = format!(
            "    {}  {}  {}{}",
            label(&l.name, Some(l.pid)),
            sparkline(v, hi),
            human_kb(last),
            if tags.is_empty() {
                String::new()
            } else {
                format!("  ← {}", tags.join(", "))
            }
        );
        let row = if l.is_victim {
            p.wrap("1;31", &row)
        } else if l.is_top_grower {
            p.wrap("33", &row)
        } else {
            row
        };
        let _ = writeln!(out, "{row}");
    }
    let usage = squeeze(&w.cgroup_usage, n, Pick::Max);
    if usage.iter().any(Option::is_some) {
        let top = usage.iter().flatten().copied().max().unwrap_or(0);
        let hi = w.cgroup_limit_kb.unwrap_or(top).max(top);
        let last = usage.iter().rev().flatten().next().copied().unwrap_or(0);
        let limit = match w.cgroup_limit_kb {
            Some(l) => format!(" of {} limit", human_kb(l)),
            None => " (no limit)".into(),
        };
        let _ = writeln!(
            out,
            "    {}  {}  {}{limit}",
            p.wrap("2", &wide_label("cgroup usage")),
            sparkline(&usage, hi),
            human_kb(last)
        );
    }
    let avail = squeeze(&w.mem_available, n, Pick::Min);
    if avail.iter().any(Option::is_some) {
        let top = avail.iter().flatten().copied().max().unwrap_or(0);
        let hi = w.mem_total_kb.unwrap_or(top).max(top);
        let last = avail.iter().rev().flatten().next().copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "    {}  {}  {} of {}",
            p.wrap("2", &wide_label("available (machine)")),
            sparkline(&avail, hi),
            human_kb(last),
            human_kb(hi)
        );
    }
    let left = format!("-{}", human_duration(span));
    let right = "kill";
    let gap = n.saturating_sub(left.chars().count() + right.len()).max(1);
    let _ = writeln!(
        out,
        "    {}  {}",
        wide_label(""),
        p.wrap("2", &format!("{left}{}{right}", " ".repeat(gap)))
    );
    out.push('\n');
}

/// The whole run: its length, each charted process's memory and peak, the
/// cgroup and the machine, where the kills fell, and the processes that came
/// and went.
pub(crate) fn run_summary(out: &mut String, r: &Report, width: usize, color: bool) {
    let p = Paint(color);
    let (Some(from), Some(last)) = (r.first_ns, r.last_ns) else {
        return;
    };
    let to = last + 1;
    let n = cols(width);
    let job_procs = r.processes.len();
    let _ = writeln!(
        out,
        "{}",
        p.wrap(
            "1",
            &format!(
                "Whole run: {} recorded, {} events, {} OOM kill{}, {} job process{}, lost events: {}",
                human_duration(r.duration_ns()),
                r.events,
                r.kills.len(),
                if r.kills.len() == 1 { "" } else { "s" },
                job_procs,
                if job_procs == 1 { "" } else { "es" },
                r.lost_events()
            )
        )
    );

    let lines = run_lines(r);
    if !lines.is_empty() {
        process_rows(out, r, &lines, from, to, n, &p);
        machine_rows(out, r, from, to, n, &p);
    }
    came_and_went(out, r, width);
    out.push('\n');
}

/// Each charted process's memory over the run, and the ended ones folded.
fn process_rows(
    out: &mut String,
    r: &Report,
    lines: &[&ProcLine],
    from: u64,
    to: u64,
    n: usize,
    p: &Paint,
) {
    let s = &r.series;
    let span = to - from;
    let _ = writeln!(
        out,
        "  Resident memory (RSS) per process over the run (one column ≈ {}; ^ marks a kill):",
        human_duration(span / n as u64)
    );
    let rows: Vec<(&ProcLine, Vec<Option<u64>>)> = lines
        .iter()
        .map(|l| (*l, l.columns(&s.grid, from, to, n)))
        .collect();
    let folded =
        (s.folded.count > 0).then(|| s.folded.rss.columns(&s.grid, from, to, n, Pick::Max, None));
    let hi = rows
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .chain(folded.iter().flatten().flatten())
        .copied()
        .max()
        .unwrap_or(0);
    let victims: Vec<(u32, u64)> = r
        .kills
        .iter()
        .map(|k| (k.victim.pid, k.victim.start_ns))
        .collect();
    for (l, v) in &rows {
        let mut row = format!(
            "    {}  {}  peak {} at +{}",
            label(&l.name, Some(l.pid)),
            sparkline(v, hi),
            human_kb(l.peak_kb),
            human_duration(l.peak_ns.saturating_sub(from))
        );
        if !l.in_job {
            row.push_str(", outside the job");
        }
        let killed = l.oom_killed || victims.contains(&(l.pid, l.start_ns));
        if killed {
            row.push_str(", OOM-killed");
            row = p.wrap("1;31", &row);
        }
        let _ = writeln!(out, "{row}");
    }
    if let Some(v) = &folded {
        let _ = writeln!(
            out,
            "    {}  {}  the largest of {} more ended job processes (peak {})",
            wide_label("others, largest"),
            sparkline(v, hi),
            s.folded.count,
            human_kb(s.folded.peak_kb)
        );
    }
}

/// The cgroup's usage, the machine's available memory, where the kills
/// fell, and what was left uncharted.
fn machine_rows(out: &mut String, r: &Report, from: u64, to: u64, n: usize, p: &Paint) {
    let s = &r.series;
    let span = to - from;
    let usage = s
        .cgroup_usage
        .columns(&s.grid, from, to, n, Pick::Max, None);
    if usage.iter().any(Option::is_some) {
        let limit = s.cgroup_limit.max_kb();
        let top = s.cgroup_usage.max_kb();
        let _ = writeln!(
            out,
            "    {}  {}  peak {}{}",
            p.wrap("2", &wide_label("cgroup usage")),
            sparkline(&usage, limit.max(top)),
            human_kb(top),
            if limit > 0 {
                format!(" of {} limit", human_kb(limit))
            } else {
                String::new()
            }
        );
    }
    let avail = s
        .mem_available
        .columns(&s.grid, from, to, n, Pick::Min, None);
    if avail.iter().any(Option::is_some) {
        let total = s.mem_total_kb.unwrap_or(0).max(s.mem_available.max_kb());
        let low = avail.iter().flatten().copied().min().unwrap_or(0);
        let _ = writeln!(
            out,
            "    {}  {}  lowest {} of {}",
            p.wrap("2", &wide_label("available (machine)")),
            sparkline(&avail, total),
            human_kb(low),
            human_kb(total)
        );
    }
    if !r.kills.is_empty() {
        let mut marks = vec![' '; n];
        for k in &r.kills {
            let c = ((k.ts_ns.saturating_sub(from)) as u128 * n as u128 / span as u128)
                .min(n as u128 - 1) as usize;
            marks[c] = '^';
        }
        let _ = writeln!(
            out,
            "    {}  {}",
            wide_label("OOM kills"),
            p.wrap("1;31", &marks.into_iter().collect::<String>())
        );
    }
    if s.uncharted_outside > 0 {
        let _ = writeln!(
            out,
            "    {}",
            p.wrap(
                "2",
                &format!(
                    "(outside the job only the largest processes are charted; {} smaller ones were left out)",
                    s.uncharted_outside
                )
            )
        );
    }
    if s.uncharted_job > 0 {
        let _ = writeln!(
            out,
            "    {}",
            p.wrap(
                "1;33",
                &format!(
                    "({} job processes were not charted: more were alive at once than the charts keep)",
                    s.uncharted_job
                )
            )
        );
    }
}

/// Job processes born and ended while recording, by name.
fn came_and_went(out: &mut String, r: &Report, width: usize) {
    let wrap = |out: &mut String, text: &str| {
        for line in super::text::style::wrap(text, width.saturating_sub(2).max(20)) {
            let _ = writeln!(out, "  {line}");
        }
    };
    let churn = &r.series.came_and_went_long;
    if !churn.is_empty() {
        wrap(out, &churn_line(churn));
    }
    // Folded into one line here, as everywhere in the text and HTML.
    if let Some(line) = super::readable::short_lived_line(&r.short_lived) {
        wrap(out, &format!("{}.", crate::term::escape(&line)));
    }
}

/// "Came and went: 2 job processes born and ended while recording: …".
fn churn_line(churn: &[crate::model::Churn]) -> String {
    let total: u64 = churn.iter().map(|c| c.count).sum();
    let groups = churn
        .iter()
        .take(6)
        .map(|c| {
            let (short, long) = (human_duration(c.shortest_ns), human_duration(c.longest_ns));
            let life = if short == long {
                format!("lived {long}")
            } else {
                format!("lived {short} to {long}")
            };
            format!(
                "{} ×{} ({life}, largest peak {})",
                crate::term::escape(&c.comm),
                c.count,
                human_kb(c.peak_kb)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let more = churn.len().saturating_sub(6);
    format!(
        "Came and went: {total} job process{} born and ended while recording: {groups}{}.",
        if total == 1 { "" } else { "es" },
        if more > 0 {
            format!("; and {more} more names")
        } else {
            String::new()
        }
    )
}

/// The processes the run summary charts (the HTML report too): each kill's
/// victim and top grower, then the job's largest peaks.
pub(crate) fn run_lines(r: &Report) -> Vec<&ProcLine> {
    fn add<'a>(p: &'a ProcLine, out: &mut Vec<&'a ProcLine>) {
        if out.len() < RUN_LINES && !out.iter().any(|q| q.key() == p.key()) {
            out.push(p);
        }
    }
    let s = &r.series;
    let find = |pid: u32, start: u64| s.procs.iter().find(|p| p.pid == pid && p.start_ns == start);
    let mut out: Vec<&ProcLine> = Vec::new();
    for k in &r.kills {
        if let Some(p) = find(k.victim.pid, k.victim.start_ns) {
            add(p, &mut out);
        }
        if let Some(g) = k.growers.first()
            && let Some(p) = find(g.pid, g.start_ns)
        {
            add(p, &mut out);
        }
    }
    // Outside the job, only what a kill involved: a compiler beside the job
    // would otherwise set the scale and flatten the job's own lines.
    for p in s.job_first() {
        if p.peak_kb > 0 && p.in_job && !r.short_lived.contains(p.pid, p.start_ns) {
            add(p, &mut out);
        }
    }
    out.sort_by(|a, b| b.peak_kb.cmp(&a.peak_kb).then(a.pid.cmp(&b.pid)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_scale_to_the_top() {
        assert_eq!(
            sparkline(&[None, Some(0), Some(1), Some(4), Some(8)], 8),
            " ▁▁▄█"
        );
        assert_eq!(sparkline(&[Some(5)], 0), "▁");
    }

    #[test]
    fn squeeze_keeps_peaks_and_lows() {
        let v = [Some(1), Some(9), Some(2), None, Some(3), Some(4)];
        assert_eq!(squeeze(&v, 3, Pick::Max), vec![Some(9), Some(2), Some(4)]);
        assert_eq!(squeeze(&v, 3, Pick::Min), vec![Some(1), Some(2), Some(3)]);
        assert_eq!(squeeze(&v, 12, Pick::Max).len(), 12);
    }
}
