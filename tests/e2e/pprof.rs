//! `report --pprof`, end to end and read by a real reader: a C program
//! built with frame pointers grows through `grow_here()` under a memory
//! limit until the kernel kills it, recorded with `--stacks`; `go tool
//! pprof` (Debian's golang-go, which `cargo xtask test` installs) reads the
//! profile and names `grow_here` as where the memory grew.

use std::{
    path::Path,
    process::{Command, Output},
};

use crate::support::*;

/// Debian's `go`, by absolute path.
const GO: &str = "/usr/bin/go";

fn go_pprof(args: &[&str], profile: &Path) -> String {
    assert!(
        Path::new(GO).exists(),
        "{GO} is missing: `cargo xtask test` installs golang-go, or `apt-get install golang-go`"
    );
    let out = Command::new(GO)
        .args(["tool", "pprof"])
        .args(args)
        .arg(profile)
        .output()
        .expect("running go tool pprof");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("--- go tool pprof {args:?}:\n{stdout}");
    stdout
}

fn report_pprof(rec: &Path, profile: &Path) -> Output {
    let out = Command::new(bin())
        .arg("report")
        .arg(rec)
        .arg("--pprof")
        .arg(profile)
        .output()
        .expect("running trainbpf report --pprof");
    assert!(
        out.status.success(),
        "report --pprof: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `-top`'s rows, heaviest flat first: (flat, function and the rest).
/// A `-top` size (`62.84MB`, `64088kB`, `1.2GB`: pprof picks the unit by
/// magnitude, in powers of 1024) in MiB.
fn megabytes(v: &str) -> f64 {
    let split = v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len());
    let n: f64 = v[..split].parse().unwrap_or_else(|_| panic!("size {v}"));
    match &v[split..] {
        "B" | "" => n / 1024.0 / 1024.0,
        "kB" => n / 1024.0,
        "MB" => n,
        "GB" => n * 1024.0,
        u => panic!("unit {u} in {v}"),
    }
}

fn top_rows(top: &str) -> Vec<(String, String)> {
    top.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() >= 6).then(|| (cols[0].to_string(), cols[5..].join(" ")))
        })
        .collect()
}

#[test]
fn go_tool_pprof_names_grow_here() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("pprof");
    let exe = build_grow_c(&dir);
    let rec = dir.path("s.rec");
    let out = record(
        &rec,
        &["--memory-limit", "64M", "-q"],
        &[exe.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("killed"), "no kill: {stderr}");
    let profile = dir.path("grow.pb.gz");
    let out = report_pprof(&rec, &profile);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("wrote"), "{stderr}");
    assert!(!stderr.contains("empty profile"), "{stderr}");

    // The heaviest function by its own bytes is grow_here, with most of
    // the 64 MiB the job grew to.
    let top = go_pprof(&["-top"], &profile);
    assert!(top.contains("Type: inuse_space"), "{top}");
    let rows = top_rows(&top);
    let (flat, func) = rows.first().expect("no rows in -top");
    assert_eq!(func, "grow_here", "{top}");
    let mb = megabytes(flat);
    assert!(mb >= 40.0, "grow_here holds only {flat}: {top}");
    // Its callers are there, as cumulative only.
    for caller in ["step", "main"] {
        assert!(rows.iter().any(|(_, f)| f == caller), "{caller}: {top}");
    }

    // By line: the statement that touched the pages.
    let lines = go_pprof(&["-top", "-lines"], &profile);
    let want = format!("grow.c:{}", grow_c_touch_line());
    let first = &top_rows(&lines)[0].1;
    assert!(
        first.starts_with("grow_here ") && first.ends_with(&want),
        "{want}: {lines}"
    );

    // Labels: the process's pid and comm.
    let r = report_json(&rec);
    let pid = u(&job_kill(&r)["growers"][0]["pid"]);
    let tags = go_pprof(&["-tags"], &profile);
    assert!(tags.contains("comm:") && tags.contains(": grow"), "{tags}");
    assert!(tags.contains(&format!(": {pid}")), "pid {pid}: {tags}");
}

#[test]
fn without_stacks_the_profile_is_empty_and_valid() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("pprof-empty");
    let rec = dir.path("e.rec");
    let out = record(&rec, &["--no-stacks", "-q"], &["/bin/true"]);
    assert!(out.status.success(), "record failed");
    let profile = dir.path("e.pb.gz");
    let out = report_pprof(&rec, &profile);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no growth stacks") && stderr.contains("empty profile"),
        "{stderr}"
    );
    let top = go_pprof(&["-top"], &profile);
    assert!(top.contains("of 0 total"), "{top}");
    assert!(top.contains("--no-stacks"), "{top}");
    assert!(top_rows(&top).is_empty(), "{top}");
}
