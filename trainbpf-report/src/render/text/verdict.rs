//! The short verdict `record` prints on stderr when the job ends.

use std::fmt::Write as _;

use super::run::{job_outcome, lost_detail};
use super::style::finish;
use super::who::rank_label;
use super::{gpu, leaks};
use crate::model::{Cause, Constraint, Report};
use crate::render::death_phrase;
use crate::term::escape as esc;
use crate::units::human_kb;

/// Kills spelled out in the verdict; the rest are counted.
const VERDICT_KILLS: usize = 3;

/// The short verdict `record` prints on stderr when the job ends.
pub fn verdict(r: &Report) -> String {
    let mut out = String::new();
    for k in r.kills.iter().take(VERDICT_KILLS) {
        let v = &k.victim;
        let mut what = match k.constraint {
            Constraint::Memcg => "memcg OOM".to_string(),
            Constraint::None => "global OOM".to_string(),
            Constraint::Unknown => "OOM".to_string(),
            c => format!("OOM ({})", c.as_str()),
        };
        if let Some(m) = &k.memcg {
            let _ = write!(what, " in {}", esc(m));
        }
        if let Some(l) = k.memcg_limit_kb {
            let _ = write!(what, " (limit {})", human_kb(l));
        }
        let who = rank_label(r, v.pid, v.start_ns, &v.comm)
            .unwrap_or_else(|| format!("pid {} ({})", v.pid, esc(&v.comm)));
        let _ = writeln!(
            out,
            "trainbpf: {what} killed {who}, RSS {}{}",
            human_kb(v.rss.resident_kb()),
            if v.in_job { "" } else { ", outside the job" }
        );
        // The kill in the one line every place that tells it in a line
        // shares (`kills[].verdict`): the top grower, what it added, where.
        if !k.verdict.is_empty() {
            let _ = writeln!(out, "trainbpf: {}", esc(&k.verdict));
        }
    }
    if r.kills.len() > VERDICT_KILLS {
        let _ = writeln!(
            out,
            "trainbpf: … and {} more OOM kills",
            r.kills.len() - VERDICT_KILLS
        );
    }
    if r.kills.is_empty() {
        let _ = writeln!(out, "trainbpf: no OOM kill recorded");
    }
    super::diagnoses::verdict(&mut out, r);
    let _ = writeln!(out, "trainbpf: job {}", job_outcome(r));
    // The root's cause, and any other process that did not simply exit.
    let root = r.job.as_ref().map(|j| j.pid);
    for d in r
        .deaths
        .iter()
        .filter(|d| Some(d.pid) == root || d.cause != Cause::Exit)
        .take(VERDICT_KILLS + 1)
    {
        let who = rank_label(r, d.pid, d.start_ns, &d.comm)
            .unwrap_or_else(|| format!("pid {} ({})", d.pid, esc(&d.comm)));
        let _ = writeln!(out, "trainbpf: {who} {}", death_phrase(d));
    }
    gpu::verdict(&mut out, r);
    leaks::verdict(&mut out, r);
    if r.lost_events() > 0 {
        let _ = writeln!(
            out,
            "trainbpf: lost events: {}{}",
            r.lost_events(),
            lost_detail(r)
        );
    }
    finish(out, false)
}
