//! Flame graphs of growth stacks (`record --stacks`): per kill, its
//! growers' stacks recorded up to the kill; for the whole run, every
//! process's. Icicles: the outermost frame on top, the frame that touched
//! the memory at the bottom, each frame as wide as the bytes of new high
//! taken under it. Frames are merged by function, file and line along the
//! path. Each frame's tooltip is an SVG `<title>`, so the page needs no
//! script; every name in it came from a process and is escaped.

use std::{collections::BTreeMap, fmt::Write as _};

use super::draw::{W, esc};
use crate::model::{GrowthStack, Kill, Report, lead, stacks::Frame};
use crate::units::human_bytes;

/// Height of a row of frames.
const ROW: f64 = 17.0;
/// Rectangles one graph draws at most, the widest kept ...
const MAX_RECTS: usize = 2000;
/// ... and the page's graphs together, so that a run of many kills with
/// deep stacks stays a page a browser opens at once.
const PAGE_RECTS: usize = 6000;
const MIN_RECTS: usize = 200;
/// Frames narrower than this (in the SVG's 1100 units) are not drawn.
const MIN_W: f64 = 0.5;
/// A character's width in the 11px labels, a little generous: a label
/// that might not fit is cut, never overflows its frame.
const CHAR_W: f64 = 6.8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Root,
    Process,
    Python,
    Native,
    Kernel,
    /// A stack that could not be read, or the summed lighter ones.
    Missing,
}

impl Kind {
    fn of(f: &Frame) -> Kind {
        match f.kind.as_str() {
            "python" => Kind::Python,
            "kernel" => Kind::Kernel,
            _ => Kind::Native,
        }
    }

    /// A hue per kind; `h` varies the lightness a little so neighbours
    /// part, the same name always the same colour.
    fn color(self, h: u64) -> String {
        let l = |base: u64, span: u64| base + h % span;
        match self {
            Kind::Root => "#d9d9d9".into(),
            Kind::Process => format!("hsl(265,35%,{}%)", l(78, 8)),
            Kind::Python => format!("hsl(205,65%,{}%)", l(62, 14)),
            Kind::Native => format!("hsl({},85%,{}%)", 12 + h % 24, l(58, 12)),
            Kind::Kernel => format!("hsl(48,85%,{}%)", l(55, 12)),
            Kind::Missing => "#bdbdbd".into(),
        }
    }
}

/// The colours the legend explains.
const LEGEND: [(&str, Kind); 5] = [
    ("Python frame", Kind::Python),
    ("native frame", Kind::Native),
    ("kernel frame", Kind::Kernel),
    ("process", Kind::Process),
    ("stack not read, or lighter stacks summed", Kind::Missing),
];

/// What frames merge on along a path: function (or address), file, line.
type Key = (String, Option<String>, Option<u32>);

#[derive(Debug)]
struct Node {
    /// The label drawn: the function, or the address when unsymbolized.
    name: String,
    /// The tooltip's line under the name: file and line, or the module.
    place: String,
    kind: Kind,
    bytes: u64,
    children: BTreeMap<Key, usize>,
}

/// The merged stacks of one graph; node 0 is the root.
#[derive(Debug)]
pub(super) struct Tree {
    nodes: Vec<Node>,
}

impl Tree {
    pub(super) fn new(root: &str) -> Tree {
        Tree {
            nodes: vec![Node {
                name: root.into(),
                place: String::new(),
                kind: Kind::Root,
                bytes: 0,
                children: BTreeMap::new(),
            }],
        }
    }

    fn child(&mut self, parent: usize, key: Key, make: impl FnOnce() -> Node) -> usize {
        if let Some(&i) = self.nodes[parent].children.get(&key) {
            return i;
        }
        let i = self.nodes.len();
        self.nodes.push(make());
        self.nodes[parent].children.insert(key, i);
        i
    }

    /// One process's stacks under a node named `label`.
    pub(super) fn add_process(&mut self, label: &str, stacks: &[GrowthStack]) {
        let p = self.child(0, (label.into(), None, None), || Node {
            name: label.into(),
            place: String::new(),
            kind: Kind::Process,
            bytes: 0,
            children: BTreeMap::new(),
        });
        for s in stacks {
            let mut path = vec![0, p];
            let mut cur = p;
            for f in s.frames.iter().rev() {
                let name = f
                    .function
                    .clone()
                    .unwrap_or_else(|| format!("{:#x}", f.addr));
                let key = (name.clone(), f.file.clone(), f.line);
                cur = self.child(cur, key, || Node {
                    place: place(f),
                    name,
                    kind: Kind::of(f),
                    bytes: 0,
                    children: BTreeMap::new(),
                });
                path.push(cur);
            }
            // A stack with no frames keeps its bytes, named by why; one whose
            // frames were not all resolved says so under its innermost.
            if s.frames.is_empty() || s.error.is_some() {
                let why = format!("[{}]", s.error.as_deref().unwrap_or("no frames recorded"));
                path.push(self.child(cur, (why.clone(), None, None), || Node {
                    name: why,
                    place: String::new(),
                    kind: Kind::Missing,
                    bytes: 0,
                    children: BTreeMap::new(),
                }));
            }
            for i in path {
                self.nodes[i].bytes = self.nodes[i].bytes.saturating_add(s.bytes);
            }
        }
    }

    pub(super) fn total(&self) -> u64 {
        self.nodes[0].bytes
    }
}

fn place(f: &Frame) -> String {
    match (&f.file, f.line, &f.module) {
        (Some(file), Some(line), _) => format!("{file}:{line}"),
        (Some(file), None, _) => file.clone(),
        (None, _, Some(m)) if f.function.is_some() => m.clone(),
        (None, _, Some(m)) => format!("{m} (unsymbolized)"),
        _ => "no file or line known".into(),
    }
}

/// A frame placed in the graph.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Rect {
    node: usize,
    x: f64,
    w: f64,
    depth: usize,
}

/// The frames to draw, at most `cap`, and how many were left out (too
/// narrow, or past the cap). Children go heaviest first, left to right.
fn layout(t: &Tree, cap: usize) -> (Vec<Rect>, usize) {
    let total = t.total();
    if total == 0 {
        return (Vec::new(), 0);
    }
    let scale = W / total as f64;
    let mut rects = Vec::new();
    let mut left_out = 0usize;
    let mut todo = vec![Rect {
        node: 0,
        x: 0.0,
        w: W,
        depth: 0,
    }];
    while let Some(r) = todo.pop() {
        rects.push(r);
        let mut kids: Vec<usize> = t.nodes[r.node].children.values().copied().collect();
        kids.sort_by(|&a, &b| {
            t.nodes[b]
                .bytes
                .cmp(&t.nodes[a].bytes)
                .then_with(|| t.nodes[a].name.cmp(&t.nodes[b].name))
        });
        let mut x = r.x;
        for k in kids {
            let w = t.nodes[k].bytes as f64 * scale;
            if w < MIN_W {
                left_out += subtree(t, k);
            } else {
                todo.push(Rect {
                    node: k,
                    x,
                    w,
                    depth: r.depth + 1,
                });
            }
            x += w;
        }
    }
    if rects.len() > cap {
        // A frame is never wider than its caller, so keeping the widest
        // (callers first among equals) never leaves a frame floating.
        rects.sort_by(|a, b| b.w.total_cmp(&a.w).then(a.depth.cmp(&b.depth)));
        left_out += rects.len() - cap;
        rects.truncate(cap);
    }
    rects.sort_by(|a, b| a.depth.cmp(&b.depth).then(a.x.total_cmp(&b.x)));
    (rects, left_out)
}

fn subtree(t: &Tree, n: usize) -> usize {
    1 + t.nodes[n]
        .children
        .values()
        .map(|&c| subtree(t, c))
        .sum::<usize>()
}

/// A stable small hash of a name, for its shade.
fn shade(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) >> 32
}

/// The label that fits `w`: whole, cut with an ellipsis, or none.
fn label(name: &str, w: f64) -> Option<String> {
    let fit = ((w - 6.0) / CHAR_W).floor();
    let n = name.chars().count();
    if fit >= n as f64 {
        Some(name.into())
    } else if fit >= 4.0 {
        let mut s: String = name.chars().take(fit as usize - 1).collect();
        s.push('…');
        Some(s)
    } else {
        None
    }
}

/// The graph as inline SVG, and the frames it left out.
pub(super) fn svg(o: &mut String, t: &Tree, cap: usize, what: &str) -> usize {
    let (rects, left_out) = layout(t, cap);
    let total = t.total();
    let depth = rects.iter().map(|r| r.depth).max().unwrap_or(0);
    let h = (depth + 1) as f64 * ROW + 2.0;
    let _ = writeln!(
        o,
        "<svg class=\"flame\" viewBox=\"0 0 {W} {h:.0}\" role=\"img\" aria-label=\"{}\">",
        esc(what)
    );
    for r in &rects {
        let n = &t.nodes[r.node];
        let share = n.bytes as f64 * 100.0 / total as f64;
        let mut tip = n.name.clone();
        if !n.place.is_empty() {
            let _ = write!(tip, "\n{}", n.place);
        }
        let kind = match n.kind {
            Kind::Python => "Python frame, ",
            Kind::Native => "native frame, ",
            Kind::Kernel => "kernel frame, ",
            _ => "",
        };
        let _ = write!(tip, "\n{kind}{} ({share:.1}%)", human_bytes(n.bytes));
        let y = r.depth as f64 * ROW + 1.0;
        let _ = write!(
            o,
            "<g class=\"f\"><title>{}</title><rect x=\"{:.2}\" y=\"{y:.0}\" width=\"{:.2}\" height=\"{:.0}\" fill=\"{}\"/>",
            esc(&tip),
            r.x,
            r.w,
            ROW - 1.0,
            n.kind.color(shade(&n.name))
        );
        if let Some(l) = label(&n.name, r.w) {
            let _ = write!(
                o,
                "<text x=\"{:.2}\" y=\"{:.0}\">{}</text>",
                r.x + 3.0,
                y + ROW - 5.0,
                esc(&l)
            );
        }
        o.push_str("</g>\n");
    }
    o.push_str("</svg>\n");
    left_out
}

/// The legend, and a line on what was left out.
fn notes(o: &mut String, left_out: usize) {
    o.push_str("<ul class=\"legend\">");
    for (name, k) in LEGEND {
        let _ = write!(
            o,
            "<li><span class=\"sw\" style=\"background:{};height:10px\"></span>{name}</li>",
            k.color(0)
        );
    }
    o.push_str("</ul>\n");
    if left_out > 0 {
        let _ = writeln!(
            o,
            "<p class=\"meta\">{left_out} frames too narrow to see, or past the graph's limit of rectangles, are not drawn; <code>trainbpf report --stacks</code> lists every stack.</p>"
        );
    }
}

/// Lines of the job's own code listed above a kill's flame graph.
const OWN_LINES: usize = 3;

/// Rectangles per graph: the page's budget shared by its graphs.
fn cap(r: &Report) -> usize {
    (PAGE_RECTS / (r.kills.len() + 1)).clamp(MIN_RECTS, MAX_RECTS)
}

const HOW: &str = "Outermost frame at the top, the frame that touched the memory at the bottom; \
each frame is as wide as the new highs of memory taken under it. Hover a frame for its file, line and bytes.";

/// In a kill's section: where its growers' memory came from. Nothing
/// without `record --stacks`.
pub(super) fn kill_flame(o: &mut String, r: &Report, k: &Kill, i: usize) {
    if r.stacks.is_empty() {
        return;
    }
    let mut t = Tree::new(&format!("growers of OOM kill {}", i + 1));
    // Each grower's heaviest lines of its own code, first (`model::lead`).
    let mut lines: Vec<(u64, String)> = Vec::new();
    for g in &k.growers {
        let stacks = r.grower_stacks(k, g);
        if !stacks.is_empty() {
            t.add_process(&r.who(g.pid, g.start_ns, &g.comm), &stacks);
            for s in lead::by_lead(&stacks).iter().take(OWN_LINES) {
                if let Some(at) = s.lead.map(|l| lead::cite(&s.frames[l])) {
                    lines.push((
                        s.bytes,
                        format!("{at}, in {}", r.who(g.pid, g.start_ns, &g.comm)),
                    ));
                }
            }
        }
    }
    o.push_str("<h3>Where the growers' memory came from</h3>\n");
    if t.total() == 0 {
        o.push_str(
            "<p class=\"meta\">No growth stacks were recorded for this kill's growers.</p>\n",
        );
        return;
    }
    lines.sort_by_key(|l| std::cmp::Reverse(l.0));
    if !lines.is_empty() {
        o.push_str("<ul class=\"own-lines\">\n");
        for (bytes, at) in lines.iter().take(OWN_LINES) {
            let _ = writeln!(
                o,
                "<li><b>{}</b> {}</li>",
                esc(&human_bytes(*bytes)),
                esc(at)
            );
        }
        o.push_str("</ul>\n");
    }
    let _ = writeln!(
        o,
        "<p class=\"meta\">Growth stacks recorded up to the kill, {} in all. {HOW}</p>",
        esc(&human_bytes(t.total()))
    );
    let left = svg(
        o,
        &t,
        cap(r),
        &format!("flame graph of the growth before OOM kill {}", i + 1),
    );
    notes(o, left);
}

/// The whole run's flame graph, or a line saying how to record one.
pub(super) fn run_flame(o: &mut String, r: &Report) {
    o.push_str("<section id=\"stacks\"><h2>Where memory grew over the whole run</h2>\n");
    if r.stacks.is_empty() {
        o.push_str("<p class=\"meta\">No growth stacks in this recording: it was made with <code>--no-stacks</code>, or by a trainbpf before stacks were on by default.</p></section>\n");
        return;
    }
    let mut t = Tree::new("all processes");
    for key in r.stacks.processes() {
        let comm = r
            .processes
            .iter()
            .find(|q| q.pid == key.tgid && q.start_ns == key.start_ns)
            .map_or("?", |q| q.comm.as_str());
        let stacks = r.process_stacks(key.tgid, key.start_ns);
        t.add_process(&r.who(key.tgid, key.start_ns, comm), &stacks);
    }
    let _ = writeln!(
        o,
        "<p class=\"meta\">Every process's growth stacks, {} in all. {HOW}</p>",
        esc(&human_bytes(t.total()))
    );
    let left = svg(o, &t, cap(r), "flame graph of the whole run's growth");
    notes(o, left);
    if r.lost.stack_map_full > 0 || r.lost.stack_errors > 0 {
        let _ = writeln!(
            o,
            "<p class=\"meta\">Stacks the kernel could not aggregate (map full): {}; could not read: {}.</p>",
            r.lost.stack_map_full, r.lost.stack_errors
        );
    }
    o.push_str("</section>\n");
}

#[cfg(test)]
mod tests;
