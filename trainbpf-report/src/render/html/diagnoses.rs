//! The diagnoses, first on the page: per kill its most likely cause and
//! one-line fix, with the evidence, every fix and the other possible causes
//! folded below; with no kill, the run's surest. A kill no rule explained
//! gets nothing: nothing is made up.

use std::fmt::Write as _;

use super::esc;
use crate::model::Report;
use crate::model::diagnosis::{Diagnosis, most_likely, top};

pub(super) fn lead(o: &mut String, r: &Report) {
    let n = r.kills.len();
    // Kills with the same most likely cause and fix (a respawned worker
    // leaking at the same line, killed again) share one box.
    let mut groups: Vec<(&Diagnosis, Vec<usize>)> = Vec::new();
    for i in 0..n {
        let Some(d) = most_likely(&r.diagnoses, i) else {
            continue;
        };
        match groups
            .iter_mut()
            .find(|(g, _)| g.id == d.id && g.fix.first() == d.fix.first())
        {
            Some((_, kills)) => kills.push(i),
            None => groups.push((d, vec![i])),
        }
    }
    for (d, kills) in groups {
        let all: Vec<&Diagnosis> = r
            .diagnoses
            .iter()
            .filter(|x| x.kill.is_some_and(|k| kills.contains(&k)))
            .collect();
        let link = |i: usize| format!("<a href=\"#kill-{0}\">{0}</a>", i + 1);
        let what = match kills.as_slice() {
            [i] if n == 1 => format!(" (<a href=\"#kill-{}\">the OOM kill</a>)", i + 1),
            [i] => format!(" (OOM kill {})", link(*i)),
            [rest @ .., last] => format!(
                " (OOM kills {} and {})",
                rest.iter().map(|&i| link(i)).collect::<Vec<_>>().join(", "),
                link(*last)
            ),
            [] => String::new(),
        };
        block(o, d, &what, &all);
    }
    if n == 0
        && let Some(d) = top(&r.diagnoses)
    {
        let all: Vec<&Diagnosis> = r.diagnoses.iter().collect();
        block(o, d, "", &all);
    }
}

fn block(o: &mut String, d: &Diagnosis, what: &str, all: &[&Diagnosis]) {
    let _ = writeln!(
        o,
        "<section class=\"diagnosis\" data-id=\"{}\"><p class=\"likely\"><b>Most likely</b>{what}: \
         {} <span class=\"conf\">{} confidence</span></p>",
        esc(d.id),
        esc(&d.title),
        d.confidence.as_str()
    );
    if let Some(f) = d.fix.first() {
        let _ = writeln!(o, "<p class=\"fix\"><b>Fix:</b> {}</p>", esc(f));
    }
    let _ = writeln!(
        o,
        "<details><summary>The evidence, every fix{}</summary>",
        if all.len() > 1 {
            ", the other possible causes"
        } else {
            ""
        }
    );
    for x in all {
        let _ = writeln!(
            o,
            "<h3>{} <span class=\"conf\">{}, {} confidence</span></h3>",
            esc(&x.title),
            esc(x.id),
            x.confidence.as_str()
        );
        list(o, "Evidence", &x.evidence);
        list(o, "Fix", &x.fix);
    }
    let _ = writeln!(o, "</details></section>");
}

fn list(o: &mut String, head: &str, items: &[String]) {
    let _ = write!(o, "<p>{head}:</p><ul>");
    for i in items {
        let _ = write!(o, "<li>{}</li>", esc(i));
    }
    let _ = writeln!(o, "</ul>");
}

#[cfg(test)]
mod tests {
    use crate::model::diagnosis::{Confidence, Diagnosis};
    use crate::render::fixture::sample_report;

    /// Two kills, the same cause and fix: one box, naming both.
    #[test]
    fn kills_with_the_same_diagnosis_share_one_box() {
        let mut r = sample_report();
        let k = r.kills[0].clone();
        r.kills.push(k);
        let d = |kill| Diagnosis {
            id: "steady_leak",
            confidence: Confidence::High,
            title: format!("worker {kill} leaked"),
            evidence: vec![],
            fix: vec!["stop keeping the list".into()],
            kill: Some(kill),
            pids: vec![700],
        };
        r.diagnoses = vec![d(0), d(1)];
        let h = super::super::render(&r);
        assert_eq!(h.matches("<b>Most likely</b>").count(), 1, "{h}");
        assert!(
            h.contains(
                "<b>Most likely</b> (OOM kills <a href=\"#kill-1\">1</a> and <a href=\"#kill-2\">2</a>): worker 0 leaked"
            ),
            "{h}"
        );
        assert!(
            h.contains("worker 1 leaked"),
            "the second's own title, below"
        );
        // Another fix: a box of its own.
        r.diagnoses[1].fix = vec!["a smaller batch".into()];
        let h = super::super::render(&r);
        assert_eq!(h.matches("<b>Most likely</b>").count(), 2);
    }

    #[test]
    fn the_diagnosis_is_the_first_thing_on_the_page() {
        let mut r = sample_report();
        let h = super::super::render(&r);
        assert!(!h.contains("Most likely"), "none made up");
        r.diagnoses = vec![Diagnosis {
            id: "steady_leak",
            confidence: Confidence::High,
            title: "python3 <b>(pid 700)</b> leaked".into(),
            evidence: vec!["climbed +4 MiB/s".into()],
            fix: vec!["stop keeping the list".into(), "record --stacks".into()],
            kill: Some(0),
            pids: vec![700],
        }];
        let h = super::super::render(&r);
        let body = &h[h.find("</header>").unwrap()..];
        let first = body.find("<section").unwrap();
        assert!(
            body[first..].starts_with("<section class=\"diagnosis\" data-id=\"steady_leak\">"),
            "{body}"
        );
        assert!(first < body.find("class=\"verdict\"").unwrap(), "{body}");
        assert!(
            body.contains("python3 &lt;b&gt;(pid 700)&lt;/b&gt; leaked"),
            "{body}"
        );
        assert!(body.contains("<b>Fix:</b> stop keeping the list"), "{body}");
        assert!(body.contains("<li>record --stacks</li>"), "{body}");
        assert!(body.contains("<li>climbed +4 MiB/s</li>"), "{body}");
    }
}
