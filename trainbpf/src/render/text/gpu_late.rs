//! Driver libraries a job process mapped after recording started: how long
//! each process was held for its probes, or the window in which its calls
//! went unrecorded.

use std::fmt::Write as _;

use super::style::{Paint, wrap};
use crate::model::Report;
use crate::term::escape as esc;
use crate::units::human_ms;

pub fn part(out: &mut String, r: &Report, width: usize, p: &Paint) {
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
