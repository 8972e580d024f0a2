//! The page's building blocks: HTML escaping, the colours, and the SVG
//! charts' frame (axes, ticks, grid, legend).

use std::fmt::Write as _;

use crate::units::{human_kb, short_duration};

/// Colours for process lines; red is kept for kills.
pub(super) const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
    "#7f7f7f", "#393b79",
];
pub(super) const KILL_RED: &str = "#d62728";
pub(super) const W: f64 = 1100.0;

/// HTML-escapes text for element content and quoted attribute values.
pub(crate) fn esc(s: &str) -> String {
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

/// Points, colour, dashed, name: one line of a chart.
pub(super) type Plot<'a> = (&'a [(u64, u64)], &'a str, bool, &'a str);

/// A chart's frame: maps time (ns) and memory (kB) into the SVG.
pub(super) struct Frame {
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
    pub(super) fn new(h: f64, t0: u64, t1: u64, ymax: u64) -> Frame {
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
    pub(super) fn x(&self, t: u64) -> f64 {
        let f = (t.clamp(self.t0, self.t1) - self.t0) as f64 / (self.t1 - self.t0) as f64;
        self.left + f * (W - self.left - self.right)
    }
    pub(super) fn y(&self, kb: u64) -> f64 {
        let f = kb.min(self.ymax) as f64 / self.ymax as f64;
        self.h - self.bottom - f * (self.h - self.top - self.bottom)
    }

    /// Axes, grid lines and tick labels. `rel` labels time relative to the
    /// end (a kill's window) rather than from the start.
    pub(super) fn axes(&self, o: &mut String, rel: bool) {
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
    pub(super) fn step_line(
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
    pub(super) fn kill_mark(
        &self,
        o: &mut String,
        t: u64,
        label: &str,
        href: Option<&str>,
        row: usize,
    ) {
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
    pub(super) fn shade(&self, o: &mut String, t0: u64, t1: u64, href: &str, title: &str) {
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
pub(super) fn nice_ticks(max: u64) -> Vec<u64> {
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
pub(super) fn time_step(span: u64) -> u64 {
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

pub(super) fn legend(o: &mut String, items: &[(String, &str, bool)]) {
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

/// A kill marked on a chart.
pub(super) struct Mark {
    pub(super) t: u64,
    pub(super) label: String,
    pub(super) href: Option<String>,
}

/// The job cgroup's usage against its limit, then the machine's available
/// memory against its total: two charts, each on its own scale, since a
/// 200 MiB cgroup drawn on a 64 GiB machine's scale is a flat line.
pub(super) fn pressure_charts(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn ticks() {
        assert_eq!(nice_ticks(300 * 1024), [0, 100, 200, 300].map(|m| m * 1024));
        assert_eq!(nice_ticks(24 << 20), [0, 5, 10, 15, 20].map(|g| g << 20));
        assert_eq!(time_step(60_000_000_000), 10_000_000_000);
    }
}
