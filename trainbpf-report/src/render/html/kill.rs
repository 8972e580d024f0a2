//! One OOM kill's section: the story, the figures and the window's charts.

use std::fmt::Write as _;

use super::draw::{Frame, KILL_RED, Mark, esc, legend, pressure_charts};
use crate::model::{Kill, KillWindow, Report};
use crate::render::{rfc3339_ms, text};
use crate::units::{human_duration, human_kb, human_rate, human_secs};

fn window_points(w: &KillWindow, pts: &[Option<u64>]) -> Vec<(u64, u64)> {
    pts.iter()
        .enumerate()
        .filter_map(|(i, v)| Some((w.start_ns + i as u64 * w.step_ns, (*v)?)))
        .chain(
            // Hold the last value to the kill.
            pts.iter().rev().flatten().next().map(|&v| (w.kill_ns, v)),
        )
        .collect()
}

pub(super) fn kill_section(
    o: &mut String,
    r: &Report,
    k: &Kill,
    (i, n): (usize, usize),
    colours: &super::colours::Colours,
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
    let _ = writeln!(
        o,
        "<section class=\"kill\" id=\"kill-{}\" data-victim=\"{}\" data-victim-pid=\"{}\" data-top-grower=\"{}\">\n<h2>{}</h2>",
        i + 1,
        esc(&v.comm),
        v.pid,
        esc(k.growers.first().map_or("", |g| g.comm.as_str())),
        esc(&head)
    );
    let _ = writeln!(o, "<p class=\"story\">{}</p>", esc(&text::story(r, k)));
    o.push_str("<dl>");
    let mut field = |name: &str, value: String| {
        let _ = write!(o, "<dt>{}</dt><dd>{}</dd>", esc(name), value);
    };
    field(
        "victim",
        format!(
            "<b class=\"victim\">{}</b>{}, anon {}, file {}, shmem {}, swap {}, oom_score_adj {}",
            esc(&r.who(v.pid, v.start_ns, &v.comm)),
            // A rank's process name, which its label replaced.
            if r.name(v.pid, v.start_ns, &v.comm) == v.comm {
                String::new()
            } else {
                format!(", {}", esc(&v.comm))
            },
            esc(&human_kb(v.rss.anon_kb)),
            esc(&human_kb(v.rss.file_kb)),
            esc(&human_kb(v.rss.shmem_kb)),
            esc(&human_kb(v.rss.swap_kb)),
            v.oom_score_adj
        ),
    );
    if let Some(g) = k.growers.first() {
        field(
            "top grower",
            format!(
                "<b class=\"grower\">{}</b>, {} in {}",
                esc(&r.who(g.pid, g.start_ns, &g.comm)),
                esc(&crate::render::grower_figure(g)),
                esc(&human_secs(g.window_ns)),
            ),
        );
    }
    field(
        "trigger",
        format!(
            "{} was allocating",
            esc(&r.who(k.trigger.tgid, k.trigger.start_ns, &k.trigger.comm))
        ),
    );
    if !v.tree.is_empty() {
        field(
            "job tree",
            esc(&v
                .tree
                .iter()
                .map(|t| r.who(t.pid, t.start_ns, &t.comm))
                .collect::<Vec<_>>()
                .join(" → ")),
        );
    }
    let mut memcg = format!("{} ", k.constraint.as_str());
    if let Some(m) = &k.memcg {
        let _ = write!(memcg, "in {m}");
    }
    if let (Some(u), Some(l)) = (k.memcg_usage_kb, k.memcg_limit_kb) {
        let _ = write!(memcg, ", usage {} of limit {}", human_kb(u), human_kb(l));
    } else if let Some(l) = k.memcg_limit_kb {
        let _ = write!(memcg, ", limit {}", human_kb(l));
    }
    field("constraint", esc(&memcg));
    o.push_str("</dl>\n");

    if let Some(w) = r.series.window(k) {
        window_charts(o, r, k, w, i, colours);
    }

    if !k.growers.is_empty() {
        let _ = writeln!(
            o,
            "<h3>Memory growth in the {} before the kill</h3>\n<table><tr><th>pid</th><th class=\"l\">process</th><th>added</th><th>RSS grew</th><th>over</th><th>RSS rate</th><th>RSS at kill</th><th class=\"l\">in job</th></tr>",
            esc(&human_duration(k.window_ns))
        );
        for g in &k.growers {
            let _ = writeln!(
                o,
                "<tr{}><td>{}</td><td class=\"l\">{}{}</td><td>{}</td><td>+{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
                if g.is_victim { " class=\"victim\"" } else { "" },
                g.pid,
                esc(&r.name(g.pid, g.start_ns, &g.comm)),
                if g.is_victim { " (victim)" } else { "" },
                esc(&g.honest_kb.map_or("-".into(), crate::units::signed_kb)),
                esc(&human_kb(g.grew_kb)),
                esc(&human_secs(g.window_ns)),
                esc(&g.rate_kb_per_s.map_or("-".into(), human_rate)),
                esc(&human_kb(g.rss_kb)),
                if g.in_job { "yes" } else { "no" }
            );
        }
        o.push_str("</table>\n");
    }
    if !k.kernel_log.is_empty() {
        o.push_str("<h3>Kernel log</h3><pre>");
        for l in &k.kernel_log {
            let _ = writeln!(o, "{}", esc(l));
        }
        o.push_str("</pre>\n");
    }
    super::flame::kill_flame(o, r, k, i);
    o.push_str("</section>\n");
}

/// The window before a kill, up close: processes, then cgroup and machine.
fn window_charts(
    o: &mut String,
    r: &Report,
    k: &Kill,
    w: &KillWindow,
    i: usize,
    colours: &super::colours::Colours,
) {
    let lines: Vec<_> = w
        .lines
        .iter()
        .map(|l| (l, window_points(w, &l.points)))
        .filter(|(_, p)| !p.is_empty())
        .collect();
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "<h3>The {} before the kill, up close</h3>",
        esc(&human_duration(w.kill_ns - w.start_ns))
    );
    let ymax = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|x| x.1))
        .max()
        .unwrap_or(0);
    let f = Frame::new(300.0, w.start_ns, w.kill_ns, ymax + ymax / 20);
    f.axes(o, true);
    let mut items = Vec::new();
    for (l, pts) in &lines {
        // The victim is red here as everywhere on the page.
        let color = if l.is_victim {
            KILL_RED
        } else {
            colours.of(l.pid, l.start_ns)
        };
        let mut name = format!("{} (pid {})", l.name, l.pid);
        if l.is_victim {
            name.push_str(", victim");
        }
        if l.is_top_grower {
            name.push_str(", top grower");
        }
        if !l.in_job {
            name.push_str(", outside the job");
        }
        f.step_line(
            o,
            pts,
            color,
            if l.is_victim || l.is_top_grower {
                2.6
            } else {
                1.6
            },
            false,
            &name,
        );
        items.push((name, color, false));
    }
    f.kill_mark(
        o,
        w.kill_ns,
        &format!(
            "OOM kill {}: {}",
            i + 1,
            r.who(k.victim.pid, k.victim.start_ns, &k.victim.comm)
        ),
        None,
        0,
    );
    o.push_str("</svg>\n");
    legend(o, &items);

    let limit: Vec<(u64, u64)> = w
        .cgroup_limit_kb
        .map(|l| vec![(w.start_ns, l), (w.kill_ns, l)])
        .unwrap_or_default();
    pressure_charts(
        o,
        (w.start_ns, w.kill_ns, true),
        &window_points(w, &w.cgroup_usage),
        &limit,
        &window_points(w, &w.mem_available),
        w.mem_total_kb,
        &[Mark {
            t: w.kill_ns,
            label: format!("OOM kill {}", i + 1),
            href: None,
        }],
    );
}
