//! The report as one self-contained HTML page (`report --html PATH`).
//!
//! Everything is inline: the SVG charts are generated here, the style sheet
//! is a few lines, and there is no script and no external resource, so the
//! page opens offline, from an attachment or a CI artifact, and cannot be
//! made to fetch anything. Every string from the recording (process names,
//! paths, the command line, kernel log lines) is untrusted and goes through
//! [`esc`].
//!
//! Layout: the most likely cause of each kill and its fix (the
//! diagnoses); the verdict per kill; memory per process over the whole run with
//! each kill marked and its window shaded (the shaded window links to the
//! kill's own section); the machine's available memory and the job cgroup's
//! usage against its limit over the run; then per kill its story, a zoomed
//! chart of the window before it, the growers and the flame graph of their
//! growth stacks; the whole run's flame graph; last the processes' peaks
//! and those that came and went.

use std::fmt::Write as _;

use crate::model::Report;
use crate::render::rfc3339_ms;
use crate::units::{human_duration, human_secs};

/// Escaping, colours and the SVG charts' frame.
/// One colour per process across the page's charts.
mod colours;
/// The diagnoses, first on the page.
mod diagnoses;
mod draw;
/// Flame graphs of growth stacks, per kill and for the whole run.
mod flame;
/// One OOM kill's section.
mod kill;
/// Several recordings of one job: one group per host.
mod merged;
/// Memory over the run, pressure, and the processes' table.
mod run;

pub(crate) use draw::esc;
pub use merged::render_merged;

pub fn render(r: &Report) -> String {
    let mut o = String::with_capacity(256 << 10);
    // A run's command line, or what an attach attached to.
    let command = r.job.as_ref().map(|_| r.title());
    // A command line can be a whole script (`python3 -c "…"`): the heading
    // gets its first line, the full text sits below it, folded.
    let title = match &command {
        Some(c) => {
            let first = c.lines().next().unwrap_or("");
            let mut t: String = first.chars().take(120).collect();
            if t.len() < c.trim_end().len() {
                t.push_str(" …");
            }
            format!("trainbpf report: {t}")
        }
        None => "trainbpf report".into(),
    };
    page_head(&mut o, &title);
    let _ = writeln!(o, "<header><h1>{}</h1>", esc(&title));
    if let Some(c) = command.filter(|c| title.ends_with('…') && !c.is_empty()) {
        let _ = writeln!(
            o,
            "<details><summary>full command</summary><pre>{}</pre></details>",
            esc(&c)
        );
    }
    let _ = writeln!(o, "<p class=\"meta\">{}</p></header>", esc(&about(r)));
    body(&mut o, r);
    footer(&mut o, r);
    o
}

/// The document up to `<body>`.
fn page_head(o: &mut String, title: &str) {
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        esc(title)
    );
}

fn footer(o: &mut String, r: &Report) {
    let _ = writeln!(
        o,
        "<footer>Written by trainbpf {} from the recording alone; this page loads nothing from the network.</footer>\n</body>\n</html>",
        esc(&r.header.trainbpf_version)
    );
}

/// The kernel, the span and the start recorded, events and what was lost.
fn about(r: &Report) -> String {
    let mut about = format!(
        "kernel {}, {} recorded",
        if r.header.kernel.is_empty() {
            "unknown"
        } else {
            &r.header.kernel
        },
        human_duration(r.duration_ns())
    );
    if let Some(t) = r.first_ns.and_then(|t| r.realtime_ns(t)) {
        let _ = write!(about, " from {}", rfc3339_ms(t));
    }
    let _ = write!(
        about,
        ", {} events, lost events: {}",
        r.events,
        r.lost_events()
    );
    let all = r
        .job
        .as_ref()
        .is_some_and(|j| j.attached.as_deref() == Some("all"));
    if let Some(line) = crate::render::readable::left_out_line(&r.left_out, all) {
        let _ = write!(about, "; {line}");
    }
    about
}

/// The page below its header: diagnoses, verdicts, charts, kills, stacks
/// and processes.
fn body(o: &mut String, r: &Report) {
    diagnoses::lead(o, r);
    verdicts(o, r);
    let colours = colours::Colours::of_page(r);
    run::run_section(o, r, &colours);
    let n = r.kills.len();
    for (i, k) in r.kills.iter().enumerate() {
        kill::kill_section(o, r, k, (i, n), &colours);
    }
    flame::run_flame(o, r);
    run::processes_section(o, r);
}

const STYLE: &str = "
body{font:15px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1140px;padding:16px 20px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px;word-break:break-all}h2{font-size:18px;margin:28px 0 6px}h3{font-size:15px;margin:14px 0 4px}
.meta{color:#666;margin:0}.verdict{border-left:4px solid #d62728;padding:6px 12px;background:#fdf3f3;margin:8px 0}
.verdict.ok{border-color:#2ca02c;background:#f3fbf3}.story{font-size:16px;background:#fafafa;border:1px solid #eee;padding:8px 12px}
svg{width:100%;height:auto;display:block;background:#fff}svg text{font:12px system-ui,sans-serif;fill:#444}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;margin:4px 0 10px;padding:0;list-style:none;font-size:13px}
.legend li{white-space:nowrap}.sw{display:inline-block;width:14px;height:4px;margin-right:5px;vertical-align:middle}
table{border-collapse:collapse;font-size:13px;margin:6px 0}th,td{padding:3px 10px;text-align:right;border-bottom:1px solid #eee}
th{background:#f4f4f4}td.l,th.l{text-align:left}tr.victim td{color:#b00;font-weight:600}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:6px 0}dt{color:#666}dd{margin:0}
svg.flame g.f:hover rect{stroke:#222;stroke-width:1}svg.flame text{font-size:11px;fill:#111;pointer-events:none}
.diagnosis{border:2px solid #d98b00;border-radius:4px;padding:6px 14px;margin:10px 0;background:#fffbf0}
.diagnosis .likely{font-size:17px;margin:4px 0}.diagnosis .fix{margin:4px 0}.conf{color:#777;font-size:13px;font-weight:normal}
footer{color:#888;font-size:12px;margin-top:30px}a{color:#1f5fa8}pre{white-space:pre-wrap;word-break:break-all;font-size:12px;background:#fafafa;padding:6px}
";

/// One line per kill: the victim and the top grower, the page's headline.
fn verdicts(o: &mut String, r: &Report) {
    if r.kills.is_empty() {
        let _ = writeln!(o, "<p class=\"verdict ok\">No OOM kill recorded.</p>");
        return;
    }
    for (i, k) in r.kills.iter().enumerate() {
        let top = match k.growers.first() {
            Some(g) => format!(
                "; top grower <b class=\"grower\">{}</b> {}",
                esc(&r.who(g.pid, g.start_ns, &g.comm)),
                esc(&crate::render::grower_figure(g))
            ),
            None => "; no process grew in the window".into(),
        };
        let _ = writeln!(
            o,
            "<p class=\"verdict\"><a href=\"#kill-{n}\">OOM kill {n}</a> at +{}: victim <b class=\"victim\">{}</b>{top}.</p>",
            esc(&human_secs(
                k.ts_ns.saturating_sub(r.first_ns.unwrap_or(k.ts_ns))
            )),
            esc(&r.who(k.victim.pid, k.victim.start_ns, &k.victim.comm)),
            n = i + 1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixture::sample_report;

    #[test]
    fn escapes_untrusted_names() {
        assert_eq!(
            esc("<script>alert('x')</script>&\"\u{7}"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;\u{fffd}"
        );
        let mut r = sample_report();
        r.kills[0].victim.comm = "<img src=x onerror=alert(1)>".into();
        let h = render(&r);
        assert!(!h.contains("<img"), "{h}");
        assert!(h.contains("&lt;img src=x onerror=alert(1)&gt;"));
    }

    #[test]
    fn self_contained_and_names_victim_and_grower() {
        let h = render(&sample_report());
        assert!(h.starts_with("<!DOCTYPE html>"));
        assert!(!h.contains("<script"), "no script needed");
        assert!(!h.contains("http") && !h.contains("src="), "nothing remote");
        assert!(h.contains("data-victim=\"pt_data_worker\""));
        assert!(h.contains("id=\"kill-1\""));
        assert!(h.contains("pt_data_worker"));
    }
}
