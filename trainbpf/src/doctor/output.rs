//! `doctor`'s two outputs: text for people, JSON for scripts.

use serde::Serialize;

use super::{Check, Facts, Status};

/// `doctor --json`: `{"kernel", "root", "checks": [...]}`, keys in this
/// order (a struct keeps it; `json!` would sort them).
pub fn render_json(f: &Facts, checks: &[Check]) -> String {
    #[derive(Serialize)]
    struct Out<'a> {
        kernel: &'a str,
        root: bool,
        checks: &'a [Check],
    }
    let out = Out {
        kernel: &f.kernel,
        root: f.root,
        checks,
    };
    // Serializing plain strings, bools and enums cannot fail.
    let mut s = serde_json::to_string_pretty(&out).unwrap_or_default();
    s.push('\n');
    s
}

/// One line per check (status, id, finding), then why and fix indented.
pub fn render_text(f: &Facts, checks: &[Check]) -> String {
    // Findings quote process names (oom_score_adj) and helpers' output:
    // escaped for the terminal (JSON escapes by its own rules).
    use trainbpf_report::term::escape as esc;
    let mut s = format!(
        "trainbpf doctor: Linux {}{}\n\n",
        esc(&f.kernel),
        if f.root { ", as root" } else { ", not root" }
    );
    for c in checks {
        s.push_str(&format!(
            "{:<5} {:<13} {}\n",
            c.status.word(),
            c.id,
            esc(&c.finding)
        ));
        if !c.why.is_empty() {
            s.push_str(&format!("{:20}why: {}\n", "", esc(&c.why)));
        }
        if !c.fix.is_empty() {
            s.push_str(&format!("{:20}fix: {}\n", "", esc(&c.fix)));
        }
    }
    let count = |st: Status| checks.iter().filter(|c| c.status == st).count();
    s.push_str(&format!(
        "\n{} ok, {} info, {} warn, {} fail\n",
        count(Status::Ok),
        count(Status::Info),
        count(Status::Warn),
        count(Status::Fail)
    ));
    let unchecked: Vec<&str> = checks
        .iter()
        .filter(|c| c.state == "not_checked")
        .map(|c| c.id)
        .collect();
    if !unchecked.is_empty() {
        s.push_str(&format!(
            "not checked without root: {}; run `sudo trainbpf doctor`\n",
            unchecked.join(", ")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::{checks, testdata::*};

    #[test]
    fn text_has_one_line_per_check_and_json_the_documented_keys() {
        let f = facts_6_18();
        let c = checks(&f);
        let text = render_text(&f, &c);
        for k in &c {
            let line = format!("{:<5} {:<13} {}", k.status.word(), k.id, k.finding);
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        let v: serde_json::Value = serde_json::from_str(&render_json(&f, &c)).unwrap();
        let arr = v["checks"].as_array().unwrap();
        assert_eq!(arr.len(), c.len());
        for k in arr {
            for key in ["id", "status", "finding", "why", "fix"] {
                assert!(k[key].is_string(), "{key} in {k}");
            }
            assert!(["ok", "warn", "fail", "info"].contains(&k["status"].as_str().unwrap()));
        }
    }
}
