//! One report per distributed job: two recorders stand in for two nodes,
//! each in a UTS namespace of its own with its own hostname, writing
//! `DIR/{host}.rec`. One node's job is OOM-killed in a memory cgroup; the
//! other's then exits 1, as a rank does when its peer vanishes. `trainbpf
//! report DIR` merges them: both hosts, every kill, death and process
//! labelled with its host, and the first failure named on its host.

use std::{
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Command, Output, Stdio},
};

use crate::support::*;
use serde_json::Value;

const NODE_OOM: &str = "tbnode1";
const NODE_AFTER: &str = "tbnode2";

/// Grows by 8 MiB every 20 ms, touching every page, until the limit.
const GROW: &str = r#"
import time
hold = []
while True:
    hold.append(bytearray(b"x") * (8 << 20))
    time.sleep(0.02)
"#;

/// `trainbpf record -o DIR/{host}.rec EXTRA -- CMD` in a new UTS namespace
/// whose hostname is `host`: another node, as far as the recorder can tell.
fn record_as_node(host: &str, dir: &Path, extra: &[&str], cmd: &[&str]) -> Output {
    let name = host.to_string();
    let mut c = Command::new(bin());
    c.arg("record")
        .arg("-o")
        .arg(dir.join("{host}.rec"))
        .args(extra)
        .arg("--")
        .args(cmd)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .stdin(Stdio::null());
    // SAFETY: unshare and sethostname are system calls, safe between fork
    // and exec; nothing is allocated (the name was made before the fork).
    unsafe {
        c.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWUTS) != 0
                || libc::sethostname(name.as_ptr().cast(), name.len()) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = c.output().expect("running trainbpf record");
    eprintln!(
        "--- {host}: trainbpf record {extra:?} -- {cmd:?}: {}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn report(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(bin())
        .arg("report")
        .args(args)
        .env("COLUMNS", "160")
        .output()
        .expect("running trainbpf report");
    assert!(
        out.status.success(),
        "report {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn two_nodes_merge_into_one_report_naming_the_first_failure_on_its_host() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("merge");
    let runs = dir.path("run");
    std::fs::create_dir(&runs).unwrap();

    // Node 1: the job outgrows its 160 MiB cgroup and is OOM-killed.
    let out = record_as_node(
        NODE_OOM,
        &runs,
        &["--memory-limit", "160M", "--quiet"],
        &[python(), "-c", GROW],
    );
    assert_eq!(out.status.code(), Some(137), "node 1's job was OOM-killed");
    // Node 2, after it: its rank gives up and exits 1.
    let out = record_as_node(
        NODE_AFTER,
        &runs,
        &["--quiet"],
        &[
            python(),
            "-c",
            "import time, sys; time.sleep(0.3); sys.exit(1)",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "node 2's job exited 1");

    // The placeholder made one file per host.
    let mut names: Vec<String> = std::fs::read_dir(&runs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![format!("{NODE_OOM}.rec"), format!("{NODE_AFTER}.rec")]
    );

    // JSON: both recordings, every item labelled.
    let j: Value =
        serde_json::from_str(&report(&[runs.as_os_str(), "--format=json".as_ref()])).unwrap();
    let recs = j["recordings"].as_array().expect("recordings");
    assert_eq!(recs.len(), 2, "{recs:#?}");
    let hosts: Vec<&str> = recs.iter().map(|r| r["host"].as_str().unwrap()).collect();
    assert_eq!(hosts, vec![NODE_OOM, NODE_AFTER], "by file name");
    for (i, r) in recs.iter().enumerate() {
        assert!(
            r["path"]
                .as_str()
                .unwrap()
                .ends_with(&format!("{}.rec", hosts[i])),
            "{r}"
        );
        assert!(r["started"].is_string(), "{r}");
        let unc = r["clock_uncertainty_ns"]
            .as_u64()
            .expect("anchor uncertainty kept");
        assert!(unc < 50_000_000, "two clock reads took {unc} ns");
    }
    assert_eq!(recs[0]["clock_offset_ms"], 0.0, "node 1 started the job");
    let offset = recs[1]["clock_offset_ms"].as_f64().unwrap();
    assert!(offset > 0.0, "node 2 recorded after node 1: {offset} ms");
    for section in ["kills", "deaths", "processes"] {
        let items = j[section].as_array().unwrap();
        assert!(!items.is_empty() || section == "kills", "{section} empty");
        for it in items {
            let i = it["recording"].as_u64().unwrap() as usize;
            assert_eq!(it["host"], hosts[i], "{section}: {it}");
        }
    }
    for (i, host) in hosts.iter().enumerate() {
        assert!(
            j["processes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["host"] == *host && p["recording"] == i),
            "a process of {host}"
        );
    }
    // Kills of other cgroups (tests beside this one) may be in either
    // recording: the job's is the one in node 1's job.
    let kill = j["kills"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["victim"]["in_job"] == true && k["host"] == NODE_OOM)
        .unwrap_or_else(|| panic!("no job kill on {NODE_OOM}: {:#}", j["kills"]));
    assert_eq!(kill["recording"], 0);
    let victim = u(&kill["victim"]["pid"]);
    let f = &j["first_failure"];
    assert_eq!(f["host"], NODE_OOM, "{f:#}");
    assert_eq!(f["kind"], "oom_kill", "{f:#}");
    assert_eq!(u(&f["pid"]), victim, "{f:#}");
    let then = f["then"].as_array().unwrap();
    assert!(
        then.iter()
            .any(|t| t["host"] == NODE_AFTER && t["kind"] == "exit" && t["recording"] == 1),
        "node 2's exit 1 follows: {f:#}"
    );
    let death = j["deaths"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["host"] == NODE_AFTER && d["code"] == 1)
        .unwrap_or_else(|| panic!("node 2's exit: {:#}", j["deaths"]));
    assert_eq!(death["recording"], 1);

    // Text, HTML and Perfetto from one run.
    let html = dir.path("job.html");
    let trace = dir.path("job.trace.json");
    let text = report(&[
        dir.path("run/tbnode1.rec").as_os_str(),
        dir.path("run/tbnode2.rec").as_os_str(),
        "--html".as_ref(),
        html.as_os_str(),
        "--perfetto".as_ref(),
        trace.as_os_str(),
        "--no-color".as_ref(),
    ]);
    let head: String = text.lines().take(14).collect::<Vec<_>>().join("\n");
    eprintln!("--- merged text report, head:\n{head}\n---");
    assert!(
        text.starts_with("trainbpf report: 2 recordings of one job\n"),
        "{head}"
    );
    assert!(
        head.contains(&format!("recording 0: {NODE_OOM}  ")),
        "{head}"
    );
    assert!(
        head.contains(&format!("recording 1: {NODE_AFTER}  ")),
        "{head}"
    );
    assert!(head.contains("each anchor read to within "), "{head}");
    let first = text
        .lines()
        .find(|l| l.starts_with("first:"))
        .expect("a first: line");
    assert!(
        first.starts_with(&format!(
            "first: pid {victim} (python3) on {NODE_OOM} was OOM-killed at "
        )),
        "{first}"
    );
    assert!(
        first.contains(&format!("on {NODE_AFTER} exited with code 1")),
        "{first}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains(&format!("  {NODE_OOM}  OOM kill: pid {victim} (python3)"))),
        "the job's timeline names the kill's host:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("OOM kill") && l.ends_with(&format!(" on {NODE_OOM}"))),
        "the kill's heading names its host:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains(&format!("s  {NODE_AFTER}  pid "))
                && l.contains("exited with code 1")),
        "the death line names its host:\n{text}"
    );

    let page = std::fs::read_to_string(&html).unwrap();
    for (i, host) in hosts.iter().enumerate() {
        assert!(
            page.contains(&format!(
                "<section class=\"host\" id=\"host-{i}\" data-host=\"{host}\" data-recording=\"{i}\">"
            )),
            "a group for {host}"
        );
    }
    assert_eq!(page.matches("<section class=\"host\"").count(), 2);
    assert!(page.contains("id=\"r0-kill-"), "node 1's kill in its group");

    let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let ev = t["traceEvents"].as_array().unwrap();
    let groups: Vec<(u64, &str)> = ev
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| {
            (
                e["pid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(groups.len(), 2, "{groups:?}");
    assert!(
        groups[0].1.starts_with(&format!("{NODE_OOM} (recording 0")),
        "{groups:?}"
    );
    assert!(
        groups[1]
            .1
            .starts_with(&format!("{NODE_AFTER} (recording 1")),
        "{groups:?}"
    );
    for (pid, name) in &groups {
        assert!(
            ev.iter().any(|e| e["ph"] == "C" && e["pid"] == *pid),
            "counters in {name}'s group"
        );
    }
    assert!(
        ev.iter().any(|e| e["ph"] == "i"
            && e["pid"] == groups[0].0
            && e["name"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{NODE_OOM}: OOM kill"))),
        "the kill on node 1's track"
    );
}

/// `trainbpf report ARGS`, its output whatever its status.
fn report_output(args: &[&std::ffi::OsStr]) -> Output {
    let out = Command::new(bin())
        .arg("report")
        .args(args)
        .output()
        .expect("running trainbpf report");
    eprintln!(
        "--- report {args:?}: {}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `20261201T180102Z`, as `{time}` expands.
fn is_time_stamp(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 16
        && b[8] == b'T'
        && b[15] == b'Z'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 8 | 15) || c.is_ascii_digit())
}

// `--events-jsonl` and `report --pprof` took `{host}` literally.
/// Every path the recorder and report write takes the placeholders `-o`
/// takes, or refuses one it cannot know with an error naming it:
/// `--events-jsonl DIR/{host}.jsonl` on two nodes gives one file per node,
/// `report --pprof/--html/--perfetto` expand the recording's `{host}` and
/// `{time}`, and an unknown placeholder, `{rank}` at report time, or
/// `{host}` over two hosts' recordings is an error before anything is
/// written.
#[test]
fn every_output_path_expands_its_placeholders_or_refuses_them() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("merge-placeholders");
    let runs = dir.path("run");
    std::fs::create_dir(&runs).unwrap();
    let jsonl = runs.join("{host}.jsonl");
    for host in [NODE_OOM, NODE_AFTER] {
        let out = record_as_node(
            host,
            &runs,
            &["--quiet", "--events-jsonl", jsonl.to_str().unwrap()],
            &["sh", "-c", "exit 3"],
        );
        assert_eq!(out.status.code(), Some(3), "{host}'s job exited 3");
    }
    assert_eq!(
        names_in(&runs),
        [
            format!("{NODE_OOM}.jsonl"),
            format!("{NODE_OOM}.rec"),
            format!("{NODE_AFTER}.jsonl"),
            format!("{NODE_AFTER}.rec"),
        ],
        "one events file per node, beside its recording"
    );
    for host in [NODE_OOM, NODE_AFTER] {
        let text = std::fs::read_to_string(runs.join(format!("{host}.jsonl"))).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(
            lines
                .iter()
                .all(|l| l["host"] == host && l["exit_code"] == 3),
            "{host}: {text}"
        );
        assert!(!lines.is_empty(), "{host}: its job's exit 3");
    }

    // report's outputs take the recording's host and start.
    let rec = runs.join(format!("{NODE_OOM}.rec"));
    let outs = dir.path("out");
    std::fs::create_dir(&outs).unwrap();
    let out = report_output(&[
        rec.as_os_str(),
        "--pprof".as_ref(),
        outs.join("{host}.pb.gz").as_os_str(),
        "--html".as_ref(),
        outs.join("{host}.html").as_os_str(),
        "--perfetto".as_ref(),
        outs.join("{host}-{time}.json").as_os_str(),
    ]);
    assert!(out.status.success(), "report with placeholders");
    let names = names_in(&outs);
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(
        names[0],
        format!("{NODE_OOM}-{}", &names[0][NODE_OOM.len() + 1..])
    );
    let stamp = names[0][NODE_OOM.len() + 1..].trim_end_matches(".json");
    assert!(is_time_stamp(stamp), "{names:?}");
    assert_eq!(
        names[1..],
        [format!("{NODE_OOM}.html"), format!("{NODE_OOM}.pb.gz")]
    );
    // Merged: one start for the job, but no one host.
    let out = report_output(&[
        runs.as_os_str(),
        "--html".as_ref(),
        outs.join("job-{time}.html").as_os_str(),
    ]);
    assert!(out.status.success(), "a merged report's {{time}}");
    assert!(
        names_in(&outs).iter().any(|n| n
            .strip_prefix("job-")
            .and_then(|n| n.strip_suffix(".html"))
            .is_some_and(is_time_stamp)),
        "{:?}",
        names_in(&outs)
    );
    let before = names_in(&outs);
    let out = report_output(&[
        runs.as_os_str(),
        "--html".as_ref(),
        outs.join("late-{time}.html").as_os_str(),
        "--perfetto".as_ref(),
        outs.join("{host}.json").as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{{host}} of two hosts");
    assert!(
        err.contains("--perfetto") && err.contains("{host}") && err.contains(NODE_AFTER),
        "{err}"
    );
    assert_eq!(names_in(&outs), before, "neither output written");

    // Placeholders that cannot be expanded: clear errors, nothing written.
    let out = report_output(&[
        rec.as_os_str(),
        "--pprof".as_ref(),
        outs.join("{rank}.pb.gz").as_os_str(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{{rank}} is the recorder's");
    assert!(err.contains("--pprof") && err.contains("{rank}"), "{err}");
    assert_eq!(names_in(&outs), before, "nothing written");
    let out = record_as_node(
        NODE_OOM,
        &runs,
        &[
            "--quiet",
            "--events-jsonl",
            runs.join("{nope}.jsonl").to_str().unwrap(),
        ],
        &["sh", "-c", "exit 3"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && out.status.code() != Some(3),
        "refused before the job"
    );
    assert!(
        err.contains("--events-jsonl") && err.contains("unknown placeholder {nope}"),
        "{err}"
    );
    assert!(!runs.join("{nope}.jsonl").exists());
}
