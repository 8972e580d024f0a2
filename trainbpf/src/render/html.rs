//! The report as one self-contained HTML page (`report --html PATH`).
//!
//! Everything is inline: the SVG charts are generated here, the style sheet
//! is a few lines, and there is no script and no external resource, so the
//! page opens offline, from an attachment or a CI artifact, and cannot be
//! made to fetch anything. Every string from the recording (process names,
//! paths, the command line, kernel log lines) is untrusted and goes through
//! [`esc`].
//!
//! Layout: the verdict per kill; memory per process over the whole run with
//! each kill marked and its window shaded (the shaded window links to the
//! kill's own section); the machine's available memory and the job cgroup's
//! usage against its limit over the run; then per kill its story, a zoomed
//! chart of the window before it and the growers; last the processes' peaks
//! and those that came and went.

use std::fmt::Write as _;

use crate::model::{Kill, KillWindow, Pick, ProcLine, Report};
use crate::render::chart::run_lines;
use crate::render::{rfc3339_ms, text};
use crate::units::{human_duration, human_kb, human_rate, human_secs, short_duration};

/// Colours for process lines; red is kept for kills.
const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
    "#7f7f7f", "#393b79",
];
const KILL_RED: &str = "#d62728";
const W: f64 = 1100.0;

/// HTML-escapes text for element content and quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            // Control characters have no business in a name; keep the page
            // well-formed whatever a process called itself.
            c if c.is_control() && c != '\n' && c != '\t' => o.push('\u{fffd}'),
            c => o.push(c),
        }
    }
    o
}

pub fn render(r: &Report) -> String {
    let mut o = String::with_capacity(256 << 10);
    let command = r.job.as_ref().map(|j| j.argv.join(" "));
    // A command line can be a whole script (`python3 -c "…"`): the heading
    // gets its first line, the full text sits below it, folded.
    let title = match &command {
        Some(c) => {
            let first = c.lines().next().unwrap_or("");
            let mut t: String = first.chars().take(120).collect();
            if t.len() < c.trim_end().len() {
                t.push_str(" …");
            }
            format!("trainbpf report: {t}")
        }
        None => "trainbpf report".into(),
    };
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        esc(&title)
    );
    let _ = writeln!(o, "<header><h1>{}</h1>", esc(&title));
    if let Some(c) = command.filter(|c| title.ends_with('…') && !c.is_empty()) {
        let _ = writeln!(
            o,
            "<details><summary>full command</summary><pre>{}</pre></details>",
            esc(&c)
        );
    }
    let mut about = format!(
        "kernel {}, {} recorded",
        if r.header.kernel.is_empty() {
            "unknown"
        } else {
            &r.header.kernel
        },
        human_duration(r.duration_ns())
    );
    if let Some(t) = r.first_ns.and_then(|t| r.realtime_ns(t)) {
        let _ = write!(about, " from {}", rfc3339_ms(t));
    }
    let _ = write!(
        about,
        ", {} events, lost events: {}",
        r.events,
        r.lost_events()
    );
    let _ = writeln!(o, "<p class=\"meta\">{}</p></header>", esc(&about));

    verdicts(&mut o, r);
    run_section(&mut o, r);
    let n = r.kills.len();
    for (i, k) in r.kills.iter().enumerate() {
        kill_section(&mut o, r, k, i, n);
    }
    processes_section(&mut o, r);
    let _ = writeln!(
        o,
        "<footer>Written by trainbpf {} from the recording alone; this page loads nothing from the network.</footer>\n</body>\n</html>",
        esc(&r.header.trainbpf_version)
    );
    o
}

const STYLE: &str = "
body{font:15px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1140px;padding:16px 20px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px;word-break:break-all}h2{font-size:18px;margin:28px 0 6px}h3{font-size:15px;margin:14px 0 4px}
.meta{color:#666;margin:0}.verdict{border-left:4px solid #d62728;padding:6px 12px;background:#fdf3f3;margin:8px 0}
.verdict.ok{border-color:#2ca02c;background:#f3fbf3}.story{font-size:16px;background:#fafafa;border:1px solid #eee;padding:8px 12px}
svg{width:100%;height:auto;display:block;background:#fff}svg text{font:12px system-ui,sans-serif;fill:#444}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;margin:4px 0 10px;padding:0;list-style:none;font-size:13px}
.legend li{white-space:nowrap}.sw{display:inline-block;width:14px;height:4px;margin-right:5px;vertical-align:middle}
table{border-collapse:collapse;font-size:13px;margin:6px 0}th,td{padding:3px 10px;text-align:right;border-bottom:1px solid #eee}
th{background:#f4f4f4}td.l,th.l{text-align:left}tr.victim td{color:#b00;font-weight:600}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:6px 0}dt{color:#666}dd{margin:0}
footer{color:#888;font-size:12px;margin-top:30px}a{color:#1f5fa8}pre{white-space:pre-wrap;word-break:break-all;font-size:12px;background:#fafafa;padding:6px}
";

/// One line per kill: the victim and the top grower, the page's headline.
fn verdicts(o: &mut String, r: &Report) {
    if r.kills.is_empty() {
        let _ = writeln!(o, "<p class=\"verdict ok\">No OOM kill recorded.</p>");
        return;
    }
    for (i, k) in r.kills.iter().enumerate() {
        let top = match k.growers.first() {
            Some(g) => format!(
                "; top grower <b class=\"grower\">{}</b> (pid {}) grew {}",
                esc(&g.comm),
                g.pid,
                esc(&human_kb(g.grew_kb))
            ),
            None => "; no process grew in the window".into(),
        };
        let _ = writeln!(
            o,
            "<p class=\"verdict\"><a href=\"#kill-{n}\">OOM kill {n}</a> at +{}: victim <b class=\"victim\">{}</b> (pid {}){top}.</p>",
            esc(&human_secs(
                k.ts_ns.saturating_sub(r.first_ns.unwrap_or(k.ts_ns))
            )),
            esc(&k.victim.comm),
            k.victim.pid,
            n = i + 1,
        );
    }
}

/// A chart's frame: maps time (ns) and memory (kB) into the SVG.
struct Frame {
    h: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    t0: u64,
    t1: u64,
    ymax: u64,
}

impl Frame {
    fn new(h: f64, t0: u64, t1: u64, ymax: u64) -> Frame {
        Frame {
            h,
            left: 78.0,
            right: 16.0,
            top: 14.0,
            bottom: 28.0,
            t0,
            t1: t1.max(t0 + 1),
            ymax: ymax.max(1),
        }
    }
    fn x(&self, t: u64) -> f64 {
        let f = (t.clamp(self.t0, self.t1) - self.t0) as f64 / (self.t1 - self.t0) as f64;
        self.left + f * (W - self.left - self.right)
    }
    fn y(&self, kb: u64) -> f64 {
        let f = kb.min(self.ymax) as f64 / self.ymax as f64;
        self.h - self.bottom - f * (self.h - self.top - self.bottom)
    }

    /// Axes, grid lines and tick labels. `rel` labels time relative to the
    /// end (a kill's window) rather than from the start.
    fn axes(&self, o: &mut String, rel: bool) {
        let _ = write!(o, "<svg viewBox=\"0 0 {W} {}\" role=\"img\">", self.h);
        for kb in nice_ticks(self.ymax) {
            let y = self.y(kb);
            let _ = write!(
                o,
                "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                self.left,
                W - self.right,
                self.left - 6.0,
                y + 4.0,
                if kb == 0 {
                    "0".to_string()
                } else {
                    esc(&human_kb(kb))
                }
            );
        }
        let span = self.t1 - self.t0;
        let step = time_step(span);
        let mut t = 0;
        while t <= span {
            // A window's ticks count back from the kill: -10 s, -5 s, kill.
            let at = if rel { self.t1 - t } else { self.t0 + t };
            let x = self.x(at);
            let label = match (rel, t) {
                (true, 0) => "kill".to_string(),
                (true, _) => format!("-{}", short_duration(t)),
                (false, _) => short_duration(t),
            };
            let _ = write!(
                o,
                "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#f2f2f2\"/>\
                 <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                self.top,
                self.h - self.bottom,
                self.h - 8.0,
                esc(&label)
            );
            t += step;
        }
        let _ = write!(
            o,
            "<line x1=\"{l:.1}\" x2=\"{l:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#999\"/>\
             <line x1=\"{l:.1}\" x2=\"{:.1}\" y1=\"{b:.1}\" y2=\"{b:.1}\" stroke=\"#999\"/>",
            self.top,
            self.h - self.bottom,
            W - self.right,
            l = self.left,
            b = self.h - self.bottom
        );
    }

    /// A step line through `(t, kb)` points, in time order.
    fn step_line(
        &self,
        o: &mut String,
        pts: &[(u64, u64)],
        color: &str,
        width: f64,
        dash: bool,
        title: &str,
    ) {
        if pts.is_empty() {
            return;
        }
        let mut d = String::with_capacity(pts.len() * 24);
        let mut prev: Option<f64> = None;
        for &(t, kb) in pts {
            let (x, y) = (self.x(t), self.y(kb));
            match prev {
                None => {
                    let _ = write!(d, "M{x:.1},{y:.1}");
                }
                Some(py) => {
                    let _ = write!(d, "L{x:.1},{py:.1}L{x:.1},{y:.1}");
                }
            }
            prev = Some(y);
        }
        let _ = write!(
            o,
            "<path d=\"{d}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\"{} stroke-linejoin=\"round\"><title>{}</title></path>",
            if dash {
                " stroke-dasharray=\"6 4\""
            } else {
                ""
            },
            esc(title)
        );
    }

    /// A kill: a red line at its time, labelled. Labels of kills close in
    /// time would overlap: `row` staggers them.
    fn kill_mark(&self, o: &mut String, t: u64, label: &str, href: Option<&str>, row: usize) {
        let x = self.x(t);
        let body = format!(
            "<g class=\"kill-marker\"><line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"{KILL_RED}\" stroke-width=\"2\" stroke-dasharray=\"4 3\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"{}\" style=\"fill:{KILL_RED};font-weight:600\">✕ {}</text><title>{}</title></g>",
            self.top,
            self.h - self.bottom,
            if x > W - 260.0 { x - 4.0 } else { x + 4.0 },
            self.top + 12.0 + (row % 3) as f64 * 14.0,
            if x > W - 260.0 { "end" } else { "start" },
            esc(label),
            esc(label)
        );
        match href {
            Some(h) => {
                let _ = write!(o, "<a href=\"{}\">{body}</a>", esc(h));
            }
            None => o.push_str(&body),
        }
    }

    /// A shaded span, linked: the window before a kill, in the overview.
    fn shade(&self, o: &mut String, t0: u64, t1: u64, href: &str, title: &str) {
        let (x0, x1) = (self.x(t0), self.x(t1));
        let _ = write!(
            o,
            "<a href=\"{}\"><rect class=\"kill-window\" x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{KILL_RED}\" fill-opacity=\"0.08\"><title>{}</title></rect></a>",
            esc(href),
            self.top,
            (x1 - x0).max(3.0),
            self.h - self.top - self.bottom,
            esc(title)
        );
    }
}

/// Grid values up to `max` (kB) at a round step, so that the labels read
/// `100 MiB`, `5 GiB`: decimal steps of MiB below a quarter GiB, of GiB
/// above.
fn nice_ticks(max: u64) -> Vec<u64> {
    const MIB: u64 = 1024;
    const GIB: u64 = 1024 * 1024;
    let target = max / 5;
    let mut steps: Vec<u64> = [64, 128, 256, 512].to_vec();
    steps.extend([1, 2, 5, 10, 20, 50, 100, 200].map(|m| m * MIB));
    steps.extend([GIB / 4, GIB / 2]);
    let mut g = GIB;
    while g < u64::MAX / 10 {
        steps.extend([g, 2 * g, 5 * g]);
        g *= 10;
    }
    let step = steps
        .into_iter()
        .find(|&s| s >= target)
        .unwrap_or(max.max(1));
    (0..=max / step).map(|i| i * step).collect()
}

/// A tick spacing giving 5 to 12 ticks over `span` ns.
fn time_step(span: u64) -> u64 {
    const S: u64 = 1_000_000_000;
    let steps = [
        S / 10,
        S / 5,
        S / 2,
        S,
        2 * S,
        5 * S,
        10 * S,
        15 * S,
        30 * S,
        60 * S,
        120 * S,
        300 * S,
        600 * S,
        900 * S,
        1800 * S,
        3600 * S,
        2 * 3600 * S,
        3 * 3600 * S,
        6 * 3600 * S,
        12 * 3600 * S,
        24 * 3600 * S,
    ];
    steps
        .into_iter()
        .find(|&s| span / s <= 11)
        .unwrap_or(span / 10)
        .max(1)
}

fn legend(o: &mut String, items: &[(String, &str, bool)]) {
    o.push_str("<ul class=\"legend\">");
    for (name, color, dash) in items {
        let _ = write!(
            o,
            "<li><span class=\"sw\" style=\"background:{color}{}\"></span>{}</li>",
            if *dash { ";opacity:.6" } else { "" },
            esc(name)
        );
    }
    o.push_str("</ul>\n");
}

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
        p.comm,
        p.pid,
        if p.in_job { "" } else { ", outside the job" }
    )
}

fn run_section(o: &mut String, r: &Report) {
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
    for (i, p) in lines.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
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
                "OOM kill {}: {} (pid {})",
                i + 1,
                k.victim.comm,
                k.victim.pid
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

/// Points, colour, dashed, name: one line of a chart.
type Plot<'a> = (&'a [(u64, u64)], &'a str, bool, &'a str);

/// A kill marked on a chart.
struct Mark {
    t: u64,
    label: String,
    href: Option<String>,
}

/// The job cgroup's usage against its limit, then the machine's available
/// memory against its total: two charts, each on its own scale, since a
/// 200 MiB cgroup drawn on a 64 GiB machine's scale is a flat line.
fn pressure_charts(
    o: &mut String,
    (t0, t1, rel): (u64, u64, bool),
    usage: &[(u64, u64)],
    limit: &[(u64, u64)],
    avail: &[(u64, u64)],
    mem_total_kb: Option<u64>,
    marks: &[Mark],
) {
    let draw = |o: &mut String, lines: &[Plot<'_>], ymax: u64| {
        let f = Frame::new(190.0, t0, t1, ymax + ymax / 20);
        f.axes(o, rel);
        let mut items = Vec::new();
        for (pts, color, dash, name) in lines {
            if !pts.is_empty() {
                f.step_line(o, pts, color, if *dash { 1.2 } else { 1.8 }, *dash, name);
                items.push((name.to_string(), *color, *dash));
            }
        }
        for (i, m) in marks.iter().enumerate() {
            f.kill_mark(o, m.t, &m.label, m.href.as_deref(), i);
        }
        o.push_str("</svg>\n");
        legend(o, &items);
    };
    let top = |pts: &[(u64, u64)]| pts.iter().map(|x| x.1).max().unwrap_or(0);
    if !usage.is_empty() {
        o.push_str("<h3>The job cgroup's usage against its limit</h3>\n");
        draw(
            o,
            &[
                (usage, "#1f77b4", false, "job cgroup usage"),
                (limit, "#000", true, "job cgroup limit"),
            ],
            top(usage).max(top(limit)),
        );
    }
    if !avail.is_empty() {
        o.push_str("<h3>The machine's available memory</h3>\n");
        draw(
            o,
            &[(avail, "#2ca02c", false, "MemAvailable (machine)")],
            mem_total_kb.unwrap_or(0).max(top(avail)),
        );
    }
}

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

fn kill_section(o: &mut String, r: &Report, k: &Kill, i: usize, n: usize) {
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
    let _ = writeln!(o, "<p class=\"story\">{}</p>", esc(&text::story(k)));
    o.push_str("<dl>");
    let mut field = |name: &str, value: String| {
        let _ = write!(o, "<dt>{}</dt><dd>{}</dd>", esc(name), value);
    };
    field(
        "victim",
        format!(
            "<b class=\"victim\">{}</b> (pid {}), anon {}, file {}, shmem {}, swap {}, oom_score_adj {}",
            esc(&v.comm),
            v.pid,
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
                "<b class=\"grower\">{}</b> (pid {}), +{} in {}{}",
                esc(&g.comm),
                g.pid,
                esc(&human_kb(g.grew_kb)),
                esc(&human_secs(g.window_ns)),
                g.rate_kb_per_s
                    .map(|x| format!(" ({})", esc(&human_rate(x))))
                    .unwrap_or_default()
            ),
        );
    }
    field(
        "trigger",
        format!(
            "{} (pid {}) was allocating",
            esc(&k.trigger.comm),
            k.trigger.tgid
        ),
    );
    if !v.tree.is_empty() {
        field(
            "job tree",
            esc(&v
                .tree
                .iter()
                .map(|t| format!("{}({})", t.comm, t.pid))
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
        window_charts(o, k, w, i);
    }

    if !k.growers.is_empty() {
        let _ = writeln!(
            o,
            "<h3>Memory growth in the {} before the kill</h3>\n<table><tr><th>pid</th><th class=\"l\">process</th><th>grew</th><th>over</th><th>rate</th><th>RSS at kill</th><th class=\"l\">in job</th></tr>",
            esc(&human_duration(k.window_ns))
        );
        for g in &k.growers {
            let _ = writeln!(
                o,
                "<tr{}><td>{}</td><td class=\"l\">{}{}</td><td>+{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
                if g.is_victim { " class=\"victim\"" } else { "" },
                g.pid,
                esc(&g.comm),
                if g.is_victim { " (victim)" } else { "" },
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
    o.push_str("</section>\n");
}

/// The window before a kill, up close: processes, then cgroup and machine.
fn window_charts(o: &mut String, k: &Kill, w: &KillWindow, i: usize) {
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
    for (j, (l, pts)) in lines.iter().enumerate() {
        let color = if l.is_victim {
            KILL_RED
        } else {
            PALETTE[j % PALETTE.len()]
        };
        let mut name = format!("{} (pid {})", l.comm, l.pid);
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
            "OOM kill {}: {} (pid {})",
            i + 1,
            k.victim.comm,
            k.victim.pid
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

fn processes_section(o: &mut String, r: &Report) {
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
    for p in s.job_first() {
        let _ = writeln!(
            o,
            "<tr{}><td>{}</td><td class=\"l\">{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
            if p.oom_killed {
                " class=\"victim\""
            } else {
                ""
            },
            p.pid,
            esc(&p.comm),
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
    if !s.came_and_went.is_empty() {
        o.push_str("<h3>Processes that came and went</h3>\n<table><tr><th class=\"l\">name</th><th>count</th><th>shortest life</th><th>longest life</th><th>largest peak</th></tr>\n");
        for c in &s.came_and_went {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixture::sample_report;

    #[test]
    fn escapes_untrusted_names() {
        assert_eq!(
            esc("<script>alert('x')</script>&\"\u{7}"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;\u{fffd}"
        );
        let mut r = sample_report();
        r.kills[0].victim.comm = "<img src=x onerror=alert(1)>".into();
        let h = render(&r);
        assert!(!h.contains("<img"), "{h}");
        assert!(h.contains("&lt;img src=x onerror=alert(1)&gt;"));
    }

    #[test]
    fn self_contained_and_names_victim_and_grower() {
        let h = render(&sample_report());
        assert!(h.starts_with("<!DOCTYPE html>"));
        assert!(!h.contains("<script"), "no script needed");
        assert!(!h.contains("http") && !h.contains("src="), "nothing remote");
        assert!(h.contains("data-victim=\"pt_data_worker\""));
        assert!(h.contains("id=\"kill-1\""));
        assert!(h.contains("pt_data_worker"));
    }

    #[test]
    fn ticks() {
        assert_eq!(nice_ticks(300 * 1024), [0, 100, 200, 300].map(|m| m * 1024));
        assert_eq!(nice_ticks(24 << 20), [0, 5, 10, 15, 20].map(|g| g << 20));
        assert_eq!(time_step(60_000_000_000), 10_000_000_000);
    }
}
