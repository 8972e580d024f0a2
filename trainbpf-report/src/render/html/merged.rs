//! The page of several recordings of one job: the recordings, their
//! clocks, the first failure and the job's timeline at the top; then one
//! group per host (a `<section class="host">`), each holding that
//! recording's own page body, its anchors made its own.

use std::fmt::Write as _;

use super::{about, body, esc, page_head};
use crate::model::Merged;
use crate::render::job_lines::{clocks_line, first_line, recording_line, timeline_line};
use crate::units::human_secs;

pub fn render_merged(m: &Merged) -> String {
    let mut o = String::with_capacity(512 << 10);
    let title = format!(
        "trainbpf report: {} recordings of one job",
        m.recordings.len()
    );
    page_head(&mut o, &title);
    let _ = writeln!(o, "<header><h1>{}</h1>", esc(&title));
    o.push_str("<ul class=\"recordings\">\n");
    for r in &m.recordings {
        let _ = writeln!(
            o,
            "<li><a href=\"#host-{}\">{}</a></li>",
            r.index,
            esc(&recording_line(r))
        );
    }
    o.push_str("</ul>\n");
    let _ = writeln!(o, "<p class=\"meta\">{}</p></header>", esc(&clocks_line(m)));
    match first_line(m) {
        Some(f) => {
            let _ = writeln!(o, "<p class=\"verdict first\">{}</p>", esc(&f));
        }
        None => o.push_str("<p class=\"verdict ok\">No failure in any recording.</p>\n"),
    }
    timeline(&mut o, m);
    for r in &m.reports {
        let i = r.source.index;
        let _ = writeln!(
            o,
            "<section class=\"host\" id=\"host-{i}\" data-host=\"{}\" data-recording=\"{i}\">\n\
             <h2>{}: recording {i}, {}</h2>\n<p class=\"meta\">{}</p>",
            esc(&r.header.hostname),
            esc(&r.header.hostname),
            esc(&r.source.path),
            esc(&about(r))
        );
        let mut part = String::with_capacity(256 << 10);
        body(&mut part, r);
        // Every id and in-page link in a recording's body made its own:
        // two hosts' "kill-1" must not be one anchor. What came from
        // processes is escaped (`"` as `&quot;`), so only our own markup
        // matches.
        let part = part
            .replace(" id=\"", &format!(" id=\"r{i}-"))
            .replace("href=\"#", &format!("href=\"#r{i}-"));
        o.push_str(&part);
        o.push_str("</section>\n");
    }
    let _ = writeln!(
        o,
        "<footer>Written by trainbpf {} from the recordings alone; this page loads nothing from the network.</footer>\n</body>\n</html>",
        esc(&m
            .reports
            .first()
            .map(|r| r.header.trainbpf_version.clone())
            .unwrap_or_default())
    );
    o
}

/// Every kill and failure across the job, on the wall clock.
fn timeline(o: &mut String, m: &Merged) {
    let start = m.started_ns().unwrap_or(0);
    o.push_str("<section id=\"job\"><h2>Across the job (wall clock)</h2>\n<table><tr><th>at</th><th class=\"l\">host</th><th class=\"l\">what</th></tr>\n");
    for h in m.shown() {
        let _ = writeln!(
            o,
            "<tr data-host=\"{}\"><td>+{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
            esc(m.host(h.recording)),
            esc(&human_secs(h.at_ns.saturating_sub(start))),
            esc(m.host(h.recording)),
            esc(&timeline_line(m, h))
        );
    }
    o.push_str("</table></section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Report, merge::merge};

    fn node(host: &str, wall_s: u64) -> Report {
        let mut r = crate::render::fixture::sample_report();
        r.header.hostname = host.into();
        r.header.clock.realtime_ns = wall_s * 1_000_000_000;
        r.header.clock.monotonic_ns = r.first_ns.unwrap();
        r
    }

    #[test]
    fn one_group_per_host_with_anchors_of_its_own() {
        let m = merge(vec![
            ("/a.rec".into(), node("node1", 1_800_000_000)),
            ("/b.rec".into(), node("<b>evil", 1_800_000_005)),
        ]);
        let h = render_merged(&m);
        assert!(h.contains("<section class=\"host\" id=\"host-0\" data-host=\"node1\""));
        assert!(h.contains("<section class=\"host\" id=\"host-1\" data-host=\"&lt;b&gt;evil\""));
        assert!(!h.contains("<b>evil"));
        assert_eq!(h.matches("<section class=\"host\"").count(), 2);
        assert!(
            h.contains("id=\"r0-kill-1\"") && h.contains("id=\"r1-kill-1\""),
            "own anchors"
        );
        assert!(h.contains("href=\"#r1-kill-1\""));
        assert!(!h.contains("id=\"kill-1\""));
        assert!(h.contains("class=\"verdict first\">first: pid 812 (pt_data_worker) on node1"));
        assert!(!h.contains("<script"));
    }
}
