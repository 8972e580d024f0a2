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
    for i in 0..n {
        let Some(d) = most_likely(&r.diagnoses, i) else {
            continue;
        };
        let all: Vec<&Diagnosis> = r.diagnoses.iter().filter(|x| x.kill == Some(i)).collect();
        let what = if n > 1 {
            format!(" (<a href=\"#kill-{0}\">OOM kill {0}</a>)", i + 1)
        } else {
            format!(" (<a href=\"#kill-{}\">the OOM kill</a>)", i + 1)
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
