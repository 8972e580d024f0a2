//! Driver libraries a job process mapped after recording started: how long
//! each process was held for its probes, or the window in which its calls
//! went unrecorded.

use std::fmt::Write as _;

use super::style::{Paint, wrap};
use crate::model::Report;
use crate::term::escape as esc;
use crate::units::human_ms;

pub(crate) fn part(out: &mut String, r: &Report, width: usize, p: &Paint) {
    let g = &r.gpu;
    if g.late.is_empty() {
        return;
    }
    let end = r.last_ns.unwrap_or(0);
    let held: Vec<_> = g.late.iter().filter(|l| l.held).collect();
    if !held.is_empty() {
        let longest = held
            .iter()
            .filter_map(|l| l.attached_ns.map(|a| a.saturating_sub(l.mapped_ns)))
            .max()
            .unwrap_or(0);
        let line = format!(
            "Driver library mapped after recording started: {} process(es) held until probed, no call missed ({} in all, longest {}).",
            held.len(),
            human_ms(g.lost.held_ns),
            human_ms(longest)
        );
        for l in wrap(&line, width - 4) {
            let _ = writeln!(out, "  {}", p.dim(&l));
        }
    }
    for l in g.late.iter().filter(|l| !l.held) {
        let span = human_ms(l.attached_ns.unwrap_or(end).saturating_sub(l.mapped_ns));
        let probed = match l.attached_ns {
            Some(_) => format!("probes attached {span} later"),
            None => format!("never probed ({span} to the end)"),
        };
        let line = format!(
            "Uncovered: pid {} mapped {} and was not held; {probed}: {} call(s) into the NVIDIA driver in that window went unrecorded, and what they allocated or freed is missing from the ledger{}.",
            l.pid,
            esc(if l.path.is_empty() {
                "libcuda"
            } else {
                &l.path
            }),
            l.calls,
            l.note
                .as_deref()
                .map(|n| format!(" ({})", esc(n)))
                .unwrap_or_default()
        );
        for w in wrap(&line, width - 4) {
            let _ = writeln!(out, "  {}", p.yellow(&w));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::gpu::GpuLate;
    use crate::render::fixture::sample_report;

    #[test]
    fn holds_are_summed_and_each_window_says_what_it_missed() {
        let mut r = sample_report();
        let t0 = r.first_ns.unwrap();
        let late = |pid, held, attached: Option<u64>, calls| GpuLate {
            pid,
            tid: pid,
            path: "/opt/env\x1b[2J/libcuda.so.1".into(),
            mapped_ns: t0,
            attached_ns: attached.map(|ms| t0 + ms * 1_000_000),
            held,
            note: None,
            calls,
        };
        r.gpu.late = vec![
            late(10, true, Some(12), 0),
            late(11, true, Some(30), 0),
            late(12, false, Some(300), 4),
        ];
        r.gpu.lost.held = 2;
        r.gpu.lost.held_ns = 42_000_000;
        let mut out = String::new();
        part(&mut out, &r, 400, &Paint(false));
        assert!(
            out.contains(
                "2 process(es) held until probed, no call missed (42.0 ms in all, longest 30.0 ms)"
            ),
            "{out}"
        );
        assert!(
            out.contains("Uncovered: pid 12 mapped /opt/env\\x1b[2J/libcuda.so.1 and was not held; probes attached 300.0 ms later: 4 call(s) into the NVIDIA driver"),
            "{out}"
        );
        assert_eq!(out.matches("Uncovered").count(), 1, "{out}");
        // Never probed: the window runs to the recording's end.
        r.gpu.late = vec![late(13, false, None, 7)];
        let mut out = String::new();
        part(&mut out, &r, 400, &Paint(false));
        assert!(out.contains("never probed ("), "{out}");
        assert!(out.contains("7 call(s)"), "{out}");
        // The driver calls of a window are lost events.
        r.gpu.lost.window_calls = 7;
        assert_eq!(crate::model::gpu::lost_events(&r), 7);
        assert!(r.lost_events() >= 7);
    }
}
