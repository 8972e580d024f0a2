//! The flame graph on fixtures: merged widths, escaping, the cap, the page.

use super::*;

fn f(name: &str, line: u32) -> Frame {
    Frame {
        kind: "native".into(),
        addr: 0x1000 + u64::from(line),
        function: Some(name.into()),
        file: Some("/src/grow.c".into()),
        line: Some(line),
        module: Some("/bin/grow".into()),
        found: None,
    }
}

/// Frames innermost first, as recorded.
fn st(bytes: u64, frames: Vec<Frame>) -> GrowthStack {
    GrowthStack {
        bytes,
        count: 1,
        frames,
        error: None,
    }
}

fn fixture() -> Tree {
    let mut t = Tree::new("all");
    t.add_process(
        "grow (pid 7)",
        &[
            st(
                600 << 20,
                vec![f("grow_here", 6), f("step", 11), f("main", 16)],
            ),
            st(300 << 20, vec![f("other", 3), f("step", 11), f("main", 16)]),
            // `step` itself took some: self bytes under `step`.
            st(50 << 20, vec![f("step", 11), f("main", 16)]),
            // The same function at another line is another frame.
            st(
                30 << 20,
                vec![f("grow_here", 7), f("step", 11), f("main", 16)],
            ),
            GrowthStack {
                bytes: 20 << 20,
                count: 2,
                frames: Vec::new(),
                error: Some("stack could not be read: EFAULT".into()),
            },
        ],
    );
    t.add_process("py (pid 9)", &[st(1 << 20, vec![f("leak", 4)])]);
    // Frames not all resolved: the reason sits under the innermost.
    let mut gone = st(4 << 20, vec![f("step", 11), f("main", 16)]);
    gone.frames[0].function = None;
    gone.error = Some("unsymbolized: the process was gone".into());
    t.add_process("grow (pid 7)", &[gone]);
    t
}

fn named(t: &Tree, name: &str) -> Vec<usize> {
    (0..t.nodes.len())
        .filter(|&i| t.nodes[i].name == name)
        .collect()
}

/// Each frame holds its callees' bytes and its own; frames merge on
/// function, file and line; the graph's total is every stack's sum.
#[test]
fn merged_widths_add_up() {
    let t = fixture();
    assert_eq!(t.total(), (600 + 300 + 50 + 30 + 20 + 1 + 4) << 20);
    for n in &t.nodes {
        let kids: u64 = n.children.values().map(|&c| t.nodes[c].bytes).sum();
        assert!(kids <= n.bytes, "{n:?}");
    }
    let step = named(&t, "step");
    assert_eq!(step.len(), 1, "step merged along the path");
    assert_eq!(t.nodes[step[0]].bytes, (600 + 300 + 50 + 30) << 20);
    assert_eq!(named(&t, "grow_here").len(), 2, "two lines, two frames");
    let root_kids: u64 = t.nodes[0]
        .children
        .values()
        .map(|&c| t.nodes[c].bytes)
        .sum();
    assert_eq!(root_kids, t.total());

    let (rects, left_out) = layout(&t, MAX_RECTS);
    assert_eq!(left_out, 0);
    assert_eq!(rects.len(), t.nodes.len());
    let at = |n: usize| rects.iter().find(|r| r.node == n).unwrap();
    for r in &rects {
        let n = &t.nodes[r.node];
        let kids: Vec<&Rect> = n.children.values().map(|&c| at(c)).collect();
        let sum: f64 = kids.iter().map(|k| k.w).sum();
        assert!(sum <= r.w + 1e-6, "{r:?}");
        for k in &kids {
            assert_eq!(k.depth, r.depth + 1);
            assert!(
                k.x >= r.x - 1e-6 && k.x + k.w <= r.x + r.w + 1e-6,
                "{k:?} in {r:?}"
            );
        }
        let own: u64 = n.children.values().map(|&c| t.nodes[c].bytes).sum();
        if own == n.bytes {
            assert!((sum - r.w).abs() < 1e-6, "no self bytes: {r:?}");
        }
    }
    // Outermost on top: main under the process, grow_here below step.
    assert_eq!(at(named(&t, "main")[0]).depth, 2);
    assert_eq!(at(named(&t, "grow_here")[0]).depth, 4);
    assert_eq!(at(0).w, W);
    let mut o = String::new();
    svg(&mut o, &t, MAX_RECTS, "test");
    assert!(o.contains("[stack could not be read: EFAULT]"), "{o}");
    let why = named(&t, "[unsymbolized: the process was gone]");
    assert_eq!(at(why[0]).depth, 4, "under main, then the address");
    assert_eq!(t.nodes[why[0]].bytes, 4 << 20);
    assert!(
        o.contains("/src/grow.c:6\nnative frame, 600 MiB (59.7%)"),
        "{o}"
    );
}

/// Names from the process are escaped in labels and tooltips; a frame
/// too narrow for its name is drawn without text.
#[test]
fn hostile_names_are_escaped_and_narrow_frames_unlabelled() {
    let mut evil = f("<script>alert(1)</script>", 1);
    evil.file = Some("\"><img src=x onerror=alert(2)>".into());
    let mut t = Tree::new("all");
    t.add_process(
        "</svg><script>x</script> (pid 1)",
        &[
            st(1000 << 20, vec![evil]),
            st(2 << 20, vec![f("a_rather_long_function_name", 9)]),
        ],
    );
    let mut o = String::new();
    svg(&mut o, &t, MAX_RECTS, "test");
    assert!(!o.contains("<script") && !o.contains("<img"), "{o}");
    assert_eq!(o.matches("</svg>").count(), 1);
    assert!(o.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{o}");
    assert!(o.contains("&quot;&gt;&lt;img src=x"), "{o}");
    // 2 MiB of 1002: about 2 units wide, a rectangle with no label.
    let narrow = o
        .split("<g ")
        .find(|l| l.contains("<title>a_rather_long_function_name"))
        .unwrap();
    assert!(
        narrow.contains("<rect") && !narrow.contains("<text"),
        "{narrow}"
    );
    assert_eq!(label("grow_here", 40.0).as_deref(), Some("grow…"));
    assert_eq!(label("grow_here", 200.0).as_deref(), Some("grow_here"));
    assert_eq!(label("grow_here", 20.0), None);
}

/// A huge profile draws at most the cap, keeps the widest frames and
/// says how many it left out.
#[test]
fn rectangles_are_capped() {
    let mut t = Tree::new("all");
    let stacks: Vec<GrowthStack> = (0..600u32)
        .map(|i| {
            st(
                if i == 0 { 8 << 20 } else { 1 << 20 },
                (0..4).map(|d| f(&format!("fn_{i}_{d}"), d)).collect(),
            )
        })
        .collect();
    t.add_process("big (pid 1)", &stacks);
    let mut o = String::new();
    let left = svg(&mut o, &t, 500, "test");
    assert_eq!(o.matches("<rect").count(), 500);
    assert_eq!(left, 600 * 4 + 2 - 500);
    assert!(o.contains("<title>fn_0_0\n"), "the heaviest kept");
    assert!(o.len() < 200 << 10, "{} bytes", o.len());
    let mut notes_html = String::new();
    notes(&mut notes_html, left);
    assert!(notes_html.contains("1902 frames"), "{notes_html}");
    // Every drawn frame's caller is drawn too.
    let (rects, _) = layout(&t, 500);
    for r in &rects {
        for &c in t.nodes[r.node].children.values() {
            if let Some(k) = rects.iter().find(|k| k.node == c) {
                assert_eq!(k.depth, r.depth + 1);
            }
        }
        if r.node != 0 {
            let parent = (0..t.nodes.len())
                .find(|&p| t.nodes[p].children.values().any(|&c| c == r.node))
                .unwrap();
            assert!(rects.iter().any(|k| k.node == parent), "{r:?} floats");
        }
    }
}

/// The page: a graph in the kill's section and one for the run with
/// stacks; without, no graph and a line on how to record them.
#[test]
fn page_has_graphs_only_with_stacks() {
    use crate::decode::{
        ProcKey,
        stacks::{StackDelta, StackSample},
    };
    let mut r = crate::render::fixture::sample_report();
    let plain = super::super::render(&r);
    assert!(!plain.contains("class=\"flame\""));
    assert!(plain.contains("made with <code>--no-stacks</code>"));
    r.stacks.observe(
        1_000_000_000,
        StackSample {
            stacks: vec![StackDelta {
                proc: ProcKey {
                    tgid: 812,
                    start_ns: 5,
                },
                stack_id: 3,
                py_id: 0,
                py_state: 0,
                bytes: 200 << 20,
                count: 400,
                frames: Some(vec![f("grow_here", 6), f("main", 16)]),
                error: None,
                gpu: false,
                leaf_ret: 0,
            }],
        },
    );
    let h = super::super::render(&r);
    assert_eq!(h.matches("<svg class=\"flame\"").count(), 2, "{h}");
    let kill = &h[h.find("id=\"kill-1\"").unwrap()..h.find("id=\"stacks\"").unwrap()];
    assert!(kill.contains("<title>grow_here\n/src/grow.c:6\nnative frame, 200 MiB (100.0%)"));
    assert!(kill.contains("<title>pt_data_worker (pid 812)"));
    assert!(!h.contains("<script"));
}
