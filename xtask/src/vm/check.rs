//! The guest's console, parsed: one report per pass, checked against what
//! the `oom_kill_process` probe must have given.

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

const RECORD_BEGIN: &str = "===RECORD-BEGIN===";
const RECORD_END: &str = "===RECORD-END===";
pub const REPORT_BEGIN: &str = "===REPORT-BEGIN===";
pub const REPORT_END: &str = "===REPORT-END===";

/// The lines between a begin marker and the next end marker, and the end
/// marker's line (which carries the exit status), if there was one.
fn section<'a>(
    console: &'a str,
    begin: &str,
    end: &str,
) -> Option<(Vec<&'a str>, Option<&'a str>)> {
    let mut lines = console.lines().skip_while(|l| !l.starts_with(begin));
    lines.next()?;
    let mut body = Vec::new();
    for line in lines {
        if line.starts_with(end) {
            return Some((body, Some(line)));
        }
        body.push(line);
    }
    Some((body, None))
}

/// The guest records three times: `--oom-probe auto` (fentry where allowed)
/// and `--oom-probe kprobe` in a 64M memcg, then with no limit, into a
/// global OOM of the guest's 1 GiB.
pub const PASSES: [&str; 3] = ["auto", "kprobe", "global"];
const PASS: &str = "===PASS===";

/// The console output of one pass: from its `===PASS=== name` line to the
/// next pass; the whole console when there are no pass lines.
pub fn pass_output<'a>(console: &'a str, pass: &str) -> &'a str {
    let head = format!("{PASS} {pass}\n");
    let Some(start) = console.find(&head) else {
        return if console.contains(PASS) { "" } else { console };
    };
    let rest = &console[start + head.len()..];
    &rest[..rest.find(PASS).unwrap_or(rest.len())]
}

/// Checks the guest's report for one pass; returns the summary to print.
pub fn check(console: &str, pass: &str) -> Result<String> {
    if let Some(panic) = console.lines().find(|l| l.contains("Kernel panic")) {
        bail!("the guest kernel panicked: {panic}");
    }
    let (record, record_end) = section(console, RECORD_BEGIN, RECORD_END)
        .context("the guest never started the record (no /init output)")?;
    let record_log = record.join("\n");
    // "trainbpf: recording to …; OOM kill via …", then "  fallback:" lines.
    let startup: Vec<&str> = record
        .iter()
        .skip_while(|l| !l.starts_with("trainbpf: recording to"))
        .take_while(|l| l.starts_with("trainbpf: recording to") || l.starts_with("  fallback:"))
        .copied()
        .collect();
    ensure!(
        !startup.is_empty(),
        "`trainbpf record` did not start ({}); its output in the guest:\n{record_log}",
        record_end.unwrap_or("no end marker")
    );

    let (report, report_end) =
        section(console, REPORT_BEGIN, REPORT_END).context("the guest printed no report")?;
    let report: Value = serde_json::from_str(&report.join("\n")).with_context(|| {
        format!(
            "the guest's report is not JSON ({}); the record's output:\n{record_log}",
            report_end.unwrap_or("no end marker")
        )
    })?;

    let kills = report["kills"].as_array().cloned().unwrap_or_default();
    let Some(kill) = kills.first() else {
        bail!("the report has no kill; the record's output:\n{record_log}");
    };
    let positive = |key: &str| kill[key].as_i64().filter(|n| *n > 0);
    let victim = &kill["victim"];
    let mut failures = Vec::new();
    let source = kill["source"].as_str().unwrap_or_default();
    if !source.contains("kprobe") && !source.contains("fentry") {
        failures.push(format!(
            "source is {source:?}: no oom_kill_process probe (kprobe or fentry) reported the kill"
        ));
    }
    if pass == "kprobe" && !source.contains("kprobe") {
        failures.push(format!(
            "source is {source:?}: the forced kprobe did not report the kill"
        ));
    }
    // The reconstruction of oom_badness from tracked memory must agree with
    // the kernel's own chosen_points.
    if kill["ranking"]["agrees_with_kernel"] != true {
        failures.push(format!(
            "the reconstructed badness ({}) does not agree with the kernel's points ({})",
            kill["ranking"]["victim_points"], kill["kernel_points"]
        ));
    }
    for key in ["kernel_points", "totalpages"] {
        if positive(key).is_none() {
            failures.push(format!("{key} is {}, not a positive number", kill[key]));
        }
    }
    if kill["trigger"]["pid"].as_i64().is_none_or(|p| p <= 0) {
        failures.push(format!("the trigger's pid is not set: {}", kill["trigger"]));
    }
    if victim["comm"] != "grow" || victim["pid"] != report["job"]["pid"] {
        failures.push(format!(
            "the victim is {} (pid {}), not the grower (the job, pid {})",
            victim["comm"], victim["pid"], report["job"]["pid"]
        ));
    }
    let want = if pass == "global" { "none" } else { "memcg" };
    let death = report["deaths"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["pid"] == victim["pid"]));
    let want_cause = if pass == "global" {
        "oom_global"
    } else {
        "oom_memcg"
    };
    if death.is_none_or(|d| d["cause"] != want_cause) {
        failures.push(format!(
            "the victim's death is {}, not {want_cause}",
            death.map_or("missing".to_string(), |d| d["cause"].to_string())
        ));
    }
    if kill["constraint"] != want {
        failures.push(format!(
            "the constraint is {}, not {want}: the job's 64M limit did not kill it (or, for the global pass, the guest's memory did not run out)",
            kill["constraint"]
        ));
    }
    if kills.len() > 1 {
        failures.push(format!("{} kills, where the grower dies once", kills.len()));
    }
    let attach = &report["recording"]["attach"];
    if !failures.is_empty() {
        bail!(
            "{}\nrecord's start-up line:\n{}\nthe kill: {}",
            failures.join("\n"),
            startup.join("\n"),
            serde_json::to_string_pretty(kill)?
        );
    }

    let mut summary = format!(
        "vm: pass {pass}: kernel {}\n\
         vm: {}\n\
         vm: kill via {source} (oom_kill_process: {}, victim: {}), constraint {} in {}\n\
         vm: victim {} (pid {}), trigger {} (pid {})\n\
         vm: kernel_points {}, totalpages {}",
        text(&report["recording"]["kernel"]),
        startup.join("\nvm: "),
        text(&attach["oom_context"]),
        text(&attach["oom_victim"]),
        text(&kill["constraint"]),
        text(&kill["memcg"]),
        text(&victim["comm"]),
        victim["pid"],
        text(&kill["trigger"]["comm"]),
        kill["trigger"]["pid"],
        kill["kernel_points"],
        kill["totalpages"],
    );
    // Informational: the reconstruction of oom_badness, where this version
    // of trainbpf reports one.
    if let Some(first) = kill["candidates"].as_array().and_then(|c| c.first()) {
        summary.push_str(&format!(
            "\nvm: reconstruction ranks {} (pid {}) first with {} points (agrees with the kernel: {})",
            text(&first["comm"]),
            first["pid"],
            first["points"],
            kill["ranking"]["agrees_with_kernel"]
        ));
    }
    Ok(summary)
}

/// A JSON string without its quotes; anything else as JSON.
fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_load_is_quoted_from_the_console() {
        let console = "===RECORD-BEGIN===\n\
                       trainbpf: attaching tp_btf:sched_process_fork: invalid argument\n\
                       ===RECORD-END=== exit=1\n\
                       ===REPORT-BEGIN===\n\
                       trainbpf: reading /rec: no such file\n\
                       ===REPORT-END=== exit=1\n";
        let err = format!("{:#}", check(console, "auto").unwrap_err());
        assert!(
            err.contains("did not start (===RECORD-END=== exit=1)"),
            "{err}"
        );
        assert!(
            err.contains("sched_process_fork: invalid argument"),
            "{err}"
        );
    }

    #[test]
    fn a_kill_without_kernel_figures_fails_each_check() {
        let report = serde_json::json!({
            "recording": {"kernel": "6.1.0-50-amd64", "attach": {}},
            "job": {"pid": 96},
            "kills": [{
                "source": "tracepoint", "kernel_points": null, "totalpages": null,
                "trigger": {"pid": null, "comm": null}, "constraint": "memcg",
                "victim": {"pid": 96, "comm": "grow"},
            }],
        });
        let console = format!(
            "===RECORD-BEGIN===\ntrainbpf: recording to /rec; OOM kill via …\n\
             ===RECORD-END=== exit=137\n===REPORT-BEGIN===\n{report}\n===REPORT-END=== exit=0\n"
        );
        let err = format!("{:#}", check(&console, "auto").unwrap_err());
        for what in [
            "no oom_kill_process probe",
            "kernel_points is null",
            "totalpages is null",
        ] {
            assert!(err.contains(what), "{what}: {err}");
        }
        assert!(err.contains("the trigger's pid is not set"), "{err}");
        assert!(!err.contains("not the grower"), "{err}");
    }
}
