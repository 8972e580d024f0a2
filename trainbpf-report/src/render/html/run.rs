//! The sections about the whole run: memory over the run, pressure, and
//! the processes' table.

use std::fmt::Write as _;

use super::draw::{Frame, Mark, esc, legend, pressure_charts};
use crate::model::{Pick, ProcLine, Report};
use crate::render::chart::run_lines;
use crate::render::readable::short_lived_line;
use crate::units::{human_duration, human_kb};

/// `(t, kb)` points of a process's line: bucket maxima, held until its end.
fn proc_points(r: &Report, p: &ProcLine) -> Vec<(u64, u64)> {
    let g = &r.series.grid;
    let mut v: Vec<(u64, u64)> = p.rss.points(g).map(|(t, b)| (t, b.max_kb)).collect();
    let end = p.died_ns.or(r.last_ns);
    if let (Some(end), Some(&(_, last))) = (end, v.last()) {
        v.push((end.max(v.last().map_or(0, |x| x.0)), last));
    }
    v
}

fn line_points(r: &Report, l: &crate::model::Line, pick: Pick) -> Vec<(u64, u64)> {
    let g = &r.series.grid;
    let mut v: Vec<(u64, u64)> = l.points(g).map(|(t, b)| (t, b.pick(pick))).collect();
    if let (Some(end), Some(&(_, last))) = (r.last_ns, v.last()) {
        v.push((end.max(v.last().map_or(0, |x| x.0)), last));
    }
    v
}

fn proc_name(p: &ProcLine) -> String {
    format!(
        "{} (pid {}){}",
        p.name,
        p.pid,
        if p.in_job { "" } else { ", outside the job" }
    )
}

pub(super) fn run_section(o: &mut String, r: &Report, colours: &super::colours::Colours) {
    let (Some(t0), Some(t1)) = (r.first_ns, r.last_ns) else {
        return;
    };
    let s = &r.series;
    let lines = run_lines(r);
    let _ = writeln!(
        o,
        "<section id=\"run\"><h2>Memory over the whole run ({})</h2>",
        esc(&human_duration(r.duration_ns()))
    );
    if lines.is_empty() && s.folded.count == 0 {
        o.push_str("<p>No memory samples were recorded.</p></section>\n");
        return;
    }
    o.push_str(
        "<p class=\"meta\">Resident memory of the job's processes, and of any process outside the job that a kill involved (the highest sample in each interval). \
         Red dashed lines mark OOM kills; click the shaded window before a kill to see it up close.</p>\n",
    );
    let ymax = lines
        .iter()
        .map(|p| p.peak_kb)
        .chain([s.folded.rss.max_kb()])
        .max()
        .unwrap_or(0);
    let f = Frame::new(360.0, t0, t1, ymax + ymax / 20);
    f.axes(o, false);
    for (i, k) in r.kills.iter().enumerate() {
        f.shade(
            o,
            k.ts_ns.saturating_sub(k.window_ns),
            k.ts_ns,
            &format!("#kill-{}", i + 1),
            &format!("window before OOM kill {}: click to zoom", i + 1),
        );
    }
    let mut items = Vec::new();
    if s.folded.count > 0 {
        let name = format!("the largest of {} more ended job processes", s.folded.count);
        f.step_line(
            o,
            &line_points(r, &s.folded.rss, Pick::Max),
            "#aaa",
            1.5,
            true,
            &name,
        );
        items.push((name, "#aaa", true));
    }
    let victims: Vec<(u32, u64)> = r
        .kills
        .iter()
        .map(|k| (k.victim.pid, k.victim.start_ns))
        .collect();
    for p in &lines {
        let color = colours.of(p.pid, p.start_ns);
        let victim = victims.contains(&(p.pid, p.start_ns));
        let mut name = proc_name(p);
        if victim {
            name.push_str(", OOM-killed");
        }
        f.step_line(
            o,
            &proc_points(r, p),
            color,
            if victim { 2.5 } else { 1.6 },
            false,
            &name,
        );
        items.push((name, color, false));
    }
    for (i, k) in r.kills.iter().enumerate() {
        f.kill_mark(
            o,
            k.ts_ns,
            &format!(
                "OOM kill {}: {}",
                i + 1,
                r.who(k.victim.pid, k.victim.start_ns, &k.victim.comm)
            ),
            Some(&format!("#kill-{}", i + 1)),
            i,
        );
    }
    o.push_str("</svg>\n");
    legend(o, &items);

    // The cgroup and the machine.
    let marks: Vec<Mark> = r
        .kills
        .iter()
        .enumerate()
        .map(|(i, k)| Mark {
            t: k.ts_ns,
            label: format!("OOM kill {}", i + 1),
            href: Some(format!("#kill-{}", i + 1)),
        })
        .collect();
    pressure_charts(
        o,
        (t0, t1, false),
        &line_points(r, &s.cgroup_usage, Pick::Max),
        &line_points(r, &s.cgroup_limit, Pick::Last),
        &line_points(r, &s.mem_available, Pick::Min),
        s.mem_total_kb,
        &marks,
    );
    o.push_str("</section>\n");
}

pub(super) fn processes_section(o: &mut String, r: &Report) {
    let s = &r.series;
    if s.procs.is_empty() && s.came_and_went.is_empty() {
        return;
    }
    let first = r.first_ns.unwrap_or(0);
    let rel = |t: u64| {
        if t >= first {
            format!("+{}", human_duration(t - first))
        } else {
            format!("-{}", human_duration(first - t))
        }
    };
    o.push_str("<section id=\"processes\"><h2>Peak memory per process</h2>\n<table><tr><th>pid</th><th class=\"l\">process</th><th>peak</th><th>at</th><th>born</th><th>ended</th><th class=\"l\">in job</th></tr>\n");
    for p in s
        .job_first()
        .into_iter()
        .filter(|p| !r.short_lived.contains(p.pid, p.start_ns))
    {
        let _ = writeln!(
            o,
            "<tr{}><td>{}</td><td class=\"l\">{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
            if p.oom_killed {
                " class=\"victim\""
            } else {
                ""
            },
            p.pid,
            esc(&p.name),
            if p.oom_killed { " (OOM-killed)" } else { "" },
            esc(&human_kb(p.peak_kb)),
            esc(&rel(p.peak_ns)),
            esc(&p.born_ns.map_or("-".into(), rel)),
            esc(&p.died_ns.map_or("-".into(), rel)),
            if p.in_job { "yes" } else { "no" }
        );
    }
    o.push_str("</table>\n");
    if s.folded.count > 0 {
        let _ = writeln!(
            o,
            "<p class=\"meta\">{} more job processes that ended are drawn above as one line, the largest of them at each time (largest peak {}).</p>",
            s.folded.count,
            esc(&human_kb(s.folded.peak_kb))
        );
    }
    if let Some(line) = short_lived_line(&r.short_lived) {
        let _ = writeln!(o, "<p class=\"meta\">{}.</p>", esc(&line));
    }
    if !s.came_and_went_long.is_empty() {
        o.push_str("<h3>Processes that came and went</h3>\n<table><tr><th class=\"l\">name</th><th>count</th><th>shortest life</th><th>longest life</th><th>largest peak</th></tr>\n");
        for c in &s.came_and_went_long {
            let _ = writeln!(
                o,
                "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&c.comm),
                c.count,
                esc(&human_duration(c.shortest_ns)),
                esc(&human_duration(c.longest_ns)),
                esc(&human_kb(c.peak_kb))
            );
        }
        o.push_str("</table>\n");
    }
    o.push_str("</section>\n");
}
