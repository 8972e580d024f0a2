//! `trainbpf doctor` against the real machine: what it says about the
//! kernel's eBPF features must match what the kernel really offers, checked
//! against oracles that don't go through trainbpf (sysfs, /proc/swaps, the
//! kernel release).

use std::{
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Output},
};

use crate::support::*;
use serde_json::Value;

fn doctor(args: &[&str]) -> Output {
    let out = Command::new(bin())
        .arg("doctor")
        .args(args)
        .output()
        .expect("running trainbpf doctor");
    eprintln!(
        "--- trainbpf doctor {args:?}: {}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn parse(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn check<'a>(v: &'a Value, id: &str) -> &'a Value {
    v["checks"]
        .as_array()
        .expect("checks array")
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {v:#}"))
}

fn state(v: &Value, id: &str) -> String {
    check(v, id)["state"].as_str().unwrap_or("").to_string()
}

/// (major, minor) of the running kernel.
fn kernel_version() -> (u32, u32) {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut it = r.trim().split(['.', '-']).map(|p| p.parse().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// On this machine doctor reports kprobes absent, fentry denied,
/// tp_btf available, swap none. Each expectation comes from an oracle, so on
/// the 6.18 Firecracker kernel (../shared/PLATFORM.md) they are exactly
/// those, and elsewhere the test still checks doctor against the truth.
#[test]
fn json_reports_this_kernels_features() {
    require_root();
    let _g = serial();
    let out = doctor(&["--json"]);
    assert!(out.status.success(), "doctor exits 0: {}", out.status);
    let v = parse(&out);
    assert_eq!(v["root"], true);

    // Every check carries the documented keys and a known status.
    for c in v["checks"].as_array().unwrap() {
        for key in ["id", "status", "finding", "why", "fix", "state"] {
            assert!(c[key].is_string(), "{key} missing in {c}");
        }
        let s = c["status"].as_str().unwrap();
        assert!(["ok", "info", "warn", "fail"].contains(&s), "{c}");
        assert_ne!(c["state"], "not_checked", "as root every check runs: {c}");
    }

    let kprobe_pmu = Path::new("/sys/bus/event_source/devices/kprobe").exists();
    assert_eq!(
        state(&v, "kprobes"),
        if kprobe_pmu { "available" } else { "absent" },
        "{:#}",
        check(&v, "kprobes")
    );

    // This kernel has no kprobes and refuses fentry (EPERM); where kprobes
    // exist fentry may go either way, but it is never "failed".
    let fentry = state(&v, "fentry");
    if kprobe_pmu {
        assert!(
            ["available", "denied"].contains(&fentry.as_str()),
            "{fentry}"
        );
    } else {
        assert_eq!(fentry, "denied", "{:#}", check(&v, "fentry"));
        assert!(
            check(&v, "fentry")["finding"]
                .as_str()
                .unwrap()
                .contains("Operation not permitted"),
            "the kernel's own refusal is quoted"
        );
    }

    // tp_btf/mark_victim gets a task_struct where the kernel's BTF says so:
    // upstream from 6.8, earlier where backported (Debian's 6.1). Where it
    // is absent, the finding says what BTF showed, not a version.
    let tp_btf = state(&v, "tp_btf");
    if kernel_version() >= (6, 8) {
        assert_eq!(tp_btf, "available", "{:#}", check(&v, "tp_btf"));
        assert_eq!(check(&v, "tp_btf")["status"], "ok");
    } else {
        assert!(
            tp_btf == "available" || tp_btf == "absent",
            "{:#}",
            check(&v, "tp_btf")
        );
        if tp_btf == "absent" {
            let finding = check(&v, "tp_btf")["finding"].as_str().unwrap_or("");
            assert!(finding.contains("BTF"), "{finding}");
        }
    }

    // /proc/swaps lists active swap areas below its header line.
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
    let has_swap = swaps.lines().skip(1).any(|l| !l.trim().is_empty());
    assert_eq!(state(&v, "swap"), if has_swap { "present" } else { "none" });

    assert_eq!(
        state(&v, "btf"),
        if Path::new("/sys/kernel/btf/vmlinux").exists() {
            "available"
        } else {
            "absent"
        }
    );
    assert_eq!(state(&v, "ringbuf"), "available");

    // record's plan follows from the above.
    let record = check(&v, "record");
    let finding = record["finding"].as_str().unwrap();
    if !kprobe_pmu && fentry == "denied" && tp_btf == "available" {
        assert!(
            finding.starts_with("OOM kill via tp_btf:mark_victim; no oom_kill_process probe"),
            "{finding}"
        );
        assert_eq!(record["state"], "partial");
        let why = record["why"].as_str().unwrap();
        assert!(why.contains("totalpages"), "says what is lost: {why}");
    }
}

#[test]
fn text_output_has_a_line_per_check_and_exits_zero_despite_warnings() {
    require_root();
    let _g = serial();
    let out = doctor(&[]);
    assert!(out.status.success(), "{}", out.status);
    let text = String::from_utf8(out.stdout).unwrap();
    for id in [
        "overcommit",
        "swap",
        "cgroup_limit",
        "oom_score_adj",
        "shm",
        "psi",
        "thp",
        "nvidia",
        "tracefs",
        "btf",
        "kprobes",
        "fentry",
        "tp_btf",
        "lockdown",
        "ringbuf",
        "record",
    ] {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(id))
            .unwrap_or_else(|| panic!("no line for {id} in\n{text}"));
        let status = line.split_whitespace().next().unwrap();
        assert!(["ok", "info", "warn", "fail"].contains(&status), "{line}");
    }
    assert!(text.contains("why: "), "{text}");
    // There are warnings on this machine (kprobes), and still exit 0.
    assert!(text.lines().any(|l| l.starts_with("warn ")), "{text}");
}

/// Without root the machine checks still run, and the eBPF probes say they
/// need root instead of reporting a bogus "denied".
#[test]
fn without_root_it_runs_the_rest_and_names_what_needs_root() {
    require_root();
    let _g = serial();
    // A copy nobody can execute from anywhere on the path.
    let dir = TempDir::new("doctor-nobody");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path("trainbpf");
    std::fs::copy(bin(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |args: &[&str]| {
        Command::new(&exe)
            .arg("doctor")
            .args(args)
            .uid(65534)
            .gid(65534)
            .output()
            .expect("running doctor as nobody")
    };
    let out = run(&["--json"]);
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v = parse(&out);
    assert_eq!(v["root"], false);
    for id in ["fentry", "tp_btf", "ringbuf", "record"] {
        assert_eq!(state(&v, id), "not_checked", "{:#}", check(&v, id));
    }
    for id in [
        "swap",
        "overcommit",
        "btf",
        "kprobes",
        "cgroup_limit",
        "shm",
    ] {
        assert_ne!(state(&v, id), "not_checked", "{id} needs no root");
    }
    let text = String::from_utf8(run(&[]).stdout).unwrap();
    assert!(
        text.contains("not checked without root: ") && text.contains("sudo trainbpf doctor"),
        "{text}"
    );
}

/// The cgroup check reads the limit of the cgroup doctor runs in: put it in
/// a fresh memory cgroup with a 300 MiB limit and look.
#[test]
fn cgroup_limit_reports_the_containing_cgroups_limit() {
    require_root();
    let _g = serial();
    let cg = TestCgroup::new(300 << 20);
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1" && exec "$2" doctor --json"#)
        .arg("sh")
        .arg(cg.0.join("cgroup.procs"))
        .arg(bin())
        .output()
        .expect("running doctor in a cgroup");
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v = parse(&out);
    let c = check(&v, "cgroup_limit");
    assert_eq!(c["state"], "limited", "{c:#}");
    let finding = c["finding"].as_str().unwrap();
    assert!(finding.contains("limit 300 MiB"), "{finding}");
    let name = cg.0.file_name().unwrap().to_str().unwrap();
    assert!(finding.contains(name), "names the cgroup: {finding}");
}

/// A memory cgroup with a limit, removed on drop: cgroup v2 where it has
/// the memory controller, v1 otherwise (as `record --memory-limit` does).
struct TestCgroup(PathBuf);

impl TestCgroup {
    fn new(limit: u64) -> TestCgroup {
        let name = format!("trainbpf-test-doctor-{}", std::process::id());
        for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            let ctl = std::fs::read_to_string(Path::new(root).join("cgroup.controllers"));
            if ctl.is_ok_and(|c| c.split_whitespace().any(|w| w == "memory")) {
                let _ = std::fs::write(Path::new(root).join("cgroup.subtree_control"), "+memory");
                let dir = Path::new(root).join(&name);
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join("memory.max"), limit.to_string()).unwrap();
                return TestCgroup(dir);
            }
        }
        let dir = Path::new("/sys/fs/cgroup/memory").join(&name);
        std::fs::create_dir_all(&dir).expect("no memory cgroup controller (v2 or v1)");
        std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).unwrap();
        TestCgroup(dir)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // The doctor process has exited, so the cgroup is empty.
        let _ = std::fs::remove_dir(&self.0);
    }
}
