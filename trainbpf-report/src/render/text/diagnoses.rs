//! Diagnoses in the terminal: "Most likely:" at the head of each kill (and
//! of a run without one), a line in `record`'s verdict, and `report
//! --explain`, every diagnosis with its confidence, evidence and fixes.
//! A kill no rule explained gets no line: nothing is made up.

use std::fmt::Write as _;

use super::style::{MIN_WIDTH, Paint, TextOptions, finish, wrap};
use crate::model::Report;
use crate::model::diagnosis::{Diagnosis, most_likely, top};
use crate::term::escape as esc;

/// `prefix` and `text`, wrapped to `width`, later lines under the text.
fn wrapped(out: &mut String, indent: &str, prefix: &str, text: &str, width: usize) {
    let pad = " ".repeat(prefix.chars().count());
    let w = width.saturating_sub(indent.len() + pad.len()).max(20);
    for (i, l) in wrap(text, w).iter().enumerate() {
        let _ = writeln!(out, "{indent}{}{l}", if i == 0 { prefix } else { &pad });
    }
}

/// "Most likely: …" and its one-line fix, with how to see the rest.
fn head(out: &mut String, d: &Diagnosis, others: usize, width: usize, p: &Paint) {
    let title = esc(&d.title);
    let first = wrap(&title, width.saturating_sub(2 + 13).max(20));
    for (i, l) in first.iter().enumerate() {
        if i == 0 {
            let _ = writeln!(out, "  {} {}", p.bold("Most likely:"), p.bold(l));
        } else {
            let _ = writeln!(out, "               {}", p.bold(l));
        }
    }
    if let Some(f) = d.fix.first() {
        wrapped(out, "  ", "Fix:         ", &esc(f), width);
    }
    let more = if others > 0 {
        format!(
            " and {others} other possible cause{}",
            if others == 1 { "" } else { "s" }
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "  {}",
        p.dim(&format!(
            "({} confidence; report --explain: the evidence{more})",
            d.confidence.as_str()
        ))
    );
}

/// At the head of kill `i`'s section: its most likely diagnosis, if any.
pub(super) fn kill_head(out: &mut String, r: &Report, i: usize, width: usize, p: &Paint) {
    let Some(d) = most_likely(&r.diagnoses, i) else {
        return;
    };
    let others = r
        .diagnoses
        .iter()
        .filter(|x| x.kill == Some(i))
        .count()
        .saturating_sub(1);
    head(out, d, others, width, p);
    out.push('\n');
}

/// With no kill: the surest diagnosis about the run, if any.
pub(super) fn run_head(out: &mut String, r: &Report, width: usize, p: &Paint) {
    if !r.kills.is_empty() {
        return;
    }
    let Some(d) = top(&r.diagnoses) else { return };
    let others = r.diagnoses.len().saturating_sub(1);
    head(out, d, others, width, p);
    out.push('\n');
}

/// The verdict's line: the run's top diagnosis and its fix.
pub(super) fn verdict(out: &mut String, r: &Report) {
    let Some(d) = top(&r.diagnoses) else { return };
    let _ = writeln!(out, "trainbpf: most likely: {}", esc(&d.title));
    if let Some(f) = d.fix.first() {
        let _ = writeln!(out, "trainbpf: fix: {}", esc(f));
    }
}

/// `report --explain`: every diagnosis, per kill then the run's, each with
/// its confidence, all of its evidence and all of its fixes.
pub(crate) fn explain(r: &Report, o: &TextOptions) -> String {
    let p = Paint(o.color);
    let width = o.width.max(MIN_WIDTH);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}\n",
        p.bold("What most likely happened, the evidence from this recording, what to change")
    );
    if r.diagnoses.is_empty() {
        let _ = writeln!(
            out,
            "No rule found a cause in this recording ({} OOM kill{}).",
            r.kills.len(),
            if r.kills.len() == 1 { "" } else { "s" }
        );
        return finish(out, o.color);
    }
    let n = r.kills.len();
    for (i, k) in r.kills.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}",
            p.red(&format!(
                "OOM kill {} of {n} at +{:.1} s: pid {} ({}){}",
                i + 1,
                r.since_start_s(k.ts_ns),
                k.victim.pid,
                esc(&k.victim.comm),
                if k.victim.in_job {
                    ""
                } else {
                    ", outside the job"
                }
            ))
        );
        let mine: Vec<&Diagnosis> = r.diagnoses.iter().filter(|d| d.kill == Some(i)).collect();
        if mine.is_empty() {
            let _ = writeln!(out, "  No rule found its cause.\n");
        }
        for (j, d) in mine.iter().enumerate() {
            one(&mut out, j, d, width, &p);
        }
    }
    let run: Vec<&Diagnosis> = r.diagnoses.iter().filter(|d| d.kill.is_none()).collect();
    if !run.is_empty() {
        let _ = writeln!(out, "{}", p.bold("About the whole run"));
        for (j, d) in run.iter().enumerate() {
            one(&mut out, j, d, width, &p);
        }
    }
    finish(out, o.color)
}

fn one(out: &mut String, j: usize, d: &Diagnosis, width: usize, p: &Paint) {
    let lead = format!("{}. ", j + 1);
    wrapped(
        out,
        "  ",
        &lead,
        &format!(
            "{} ({}, {} confidence)",
            esc(&d.title),
            d.id,
            d.confidence.as_str()
        ),
        width,
    );
    let _ = writeln!(out, "     {}", p.dim("Evidence:"));
    for e in &d.evidence {
        wrapped(out, "       ", "- ", &esc(e), width);
    }
    let _ = writeln!(out, "     {}", p.dim("Fix:"));
    for f in &d.fix {
        wrapped(out, "       ", "- ", &esc(f), width);
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::diagnosis::Confidence;
    use crate::render::fixture::sample_report;

    fn diagnosis(id: &'static str, kill: Option<usize>, confidence: Confidence) -> Diagnosis {
        Diagnosis {
            id,
            confidence,
            title: format!("{id} happened to python3 (pid 700)"),
            evidence: vec![
                format!("{id}: first figure"),
                format!("{id}: second figure"),
            ],
            fix: vec![format!("{id}: first fix"), format!("{id}: second fix")],
            kill,
            pids: vec![700],
        }
    }

    fn with(ds: Vec<Diagnosis>) -> Report {
        let mut r = sample_report();
        r.diagnoses = ds;
        r
    }

    fn text(r: &Report) -> String {
        super::super::render(
            r,
            &TextOptions {
                color: false,
                width: 200,
            },
        )
    }

    #[test]
    fn each_kill_opens_with_its_most_likely_cause_and_fix() {
        let r = with(vec![
            diagnosis("steady_leak", Some(0), Confidence::High),
            diagnosis("container_limit", Some(0), Confidence::Medium),
        ]);
        let t = text(&r);
        let mut lines = t.lines().skip_while(|l| !l.starts_with("OOM kill"));
        lines.next();
        assert_eq!(
            lines.next().unwrap(),
            "  Most likely: steady_leak happened to python3 (pid 700)",
            "{t}"
        );
        assert_eq!(
            lines.next().unwrap(),
            "  Fix:         steady_leak: first fix"
        );
        assert_eq!(
            lines.next().unwrap(),
            "  (high confidence; report --explain: the evidence and 1 other possible cause)"
        );
        assert!(!t.contains("container_limit happened"), "one per kill: {t}");
        let v = super::super::verdict(&r);
        assert!(
            v.contains("trainbpf: most likely: steady_leak happened to python3 (pid 700)\n"),
            "{v}"
        );
        assert!(v.contains("trainbpf: fix: steady_leak: first fix\n"), "{v}");
    }

    #[test]
    fn no_diagnosis_says_nothing_and_a_runs_own_shows_without_a_kill() {
        let t = text(&with(vec![]));
        assert!(!t.contains("Most likely"), "{t}");
        assert!(!super::super::verdict(&with(vec![])).contains("most likely"));
        // A run-level diagnosis beside a kill is --explain's, not the head's.
        let t = text(&with(vec![diagnosis(
            "steady_leak",
            None,
            Confidence::High,
        )]));
        assert!(!t.contains("Most likely"), "{t}");
        let mut r = with(vec![diagnosis("steady_leak", None, Confidence::High)]);
        r.kills.clear();
        let t = text(&r);
        let at = t.find("  Most likely: steady_leak happened").expect(&t);
        assert!(
            at < t.find("no OOM kill recorded").unwrap(),
            "near the top: {t}"
        );
        assert_eq!(t.matches("Most likely").count(), 1, "{t}");
    }

    #[test]
    fn explain_prints_every_diagnosis_whole() {
        let mut r = with(vec![
            diagnosis("steady_leak", Some(0), Confidence::High),
            diagnosis("container_limit", Some(0), Confidence::Medium),
            diagnosis("pinned_memory", None, Confidence::Low),
        ]);
        r.diagnoses[0].title = "python3 \x1b]0;pwned\x07 leaked".into();
        let e = explain(&r, &TextOptions::default());
        for id in ["steady_leak", "container_limit", "pinned_memory"] {
            for what in ["first figure", "second figure", "first fix", "second fix"] {
                assert!(e.contains(&format!("- {id}: {what}")), "{e}");
            }
        }
        assert!(
            e.contains("1. python3 \\x1b]0;pwned\\x07 leaked (steady_leak, high confidence)"),
            "{e}"
        );
        assert!(e.contains("2. container_limit happened to python3 (pid 700) (container_limit, medium confidence)"), "{e}");
        assert!(e.contains("About the whole run\n  1. pinned_memory"), "{e}");
        assert!(!e.contains('\x1b'), "{e}");
        let none = explain(&with(vec![]), &TextOptions::default());
        assert!(
            none.contains("No rule found a cause in this recording (1 OOM kill)."),
            "{none}"
        );
    }
}
