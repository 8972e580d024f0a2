//! The frames' namer: the child that parses the job's files (unwind
//! tables, symbols, line tables) runs as the invoking user, or `nobody`
//! when root runs the recorder without sudo, with no capabilities, no new
//! privileges, the kernel's default OOM score and a seccomp filter; and the
//! recording's stacks are still named through it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// The recorder's children running the namer.
fn namers(recorder: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ppid == Some(recorder) && cmd.split(|&b| b == 0).nth(1) == Some(&b"__name-frames"[..])
        })
        .collect()
}

fn field<'a>(status: &'a str, key: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or("")
        .trim()
}

/// Records the leaking job with `env`, and checks the namer's rights
/// while it runs: its ids are `uid`, and it has nothing more.
fn check(dir: &Path, name: &str, env: &[(&str, &str)], uid: u32) {
    let script = dir.join("leak.py");
    let out_dir = dir.join(name);
    std::fs::create_dir_all(&out_dir).unwrap();
    std::os::unix::fs::chown(&out_dir, Some(uid), Some(uid)).unwrap();
    let rec = out_dir.join("r.rec");
    let mut c = Command::new(bin());
    c.args(["record", "-q", "--memory-limit", "256M", "-o"])
        .arg(&rec)
        .arg("--")
        .arg("/usr/bin/python3")
        .arg(&script)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("starting trainbpf record");
    let recorder = child.id();
    let recorder_status =
        std::fs::read_to_string(format!("/proc/{recorder}/status")).unwrap_or_default();
    let until = Instant::now() + Duration::from_secs(20);
    let mut seen = None;
    let mut last = String::new();
    while Instant::now() < until {
        if let Some(&pid) = namers(recorder).first() {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let adj =
                std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap_or_default();
            // Its privileges go first; its seccomp filter once it has read
            // the C library, before its first request.
            if !status.is_empty()
                && field(&status, "Uid:") != "0\t0\t0\t0"
                && field(&status, "Seccomp:") == "2"
            {
                seen = Some((pid, status, adj));
                break;
            }
            if !status.is_empty() {
                last = status;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- {name}: {}\n{stderr}", out.status);
    let (pid, status, adj) =
        seen.unwrap_or_else(|| panic!("{name}: no namer under its filter seen; last:\n{last}"));
    eprintln!("{name}: namer {pid}:\n{status}");
    let ids = format!("{uid}\t{uid}\t{uid}\t{uid}");
    assert_eq!(field(&status, "Uid:"), ids, "{name}");
    assert_eq!(field(&status, "Gid:"), ids, "{name}");
    assert_eq!(field(&status, "Groups:"), "", "{name}");
    for caps in ["CapInh:", "CapPrm:", "CapEff:", "CapAmb:", "CapBnd:"] {
        assert_eq!(
            u64::from_str_radix(field(&status, caps), 16),
            Ok(0),
            "{name}: {caps}"
        );
    }
    assert_eq!(field(&status, "NoNewPrivs:"), "1", "{name}");
    // One filter more than the recorder has (a container may give it one).
    let inherited: u32 = field(&recorder_status, "Seccomp_filters:")
        .parse()
        .unwrap_or(0);
    assert_eq!(
        field(&status, "Seccomp_filters:"),
        (inherited + 1).to_string(),
        "{name}: its own filter"
    );
    assert_eq!(
        adj.trim(),
        "0",
        "{name}: neither the recorder's protection nor the first victim"
    );
    // The stacks were named through it.
    assert!(stderr.contains("killed"), "{name}: no kill");
    let r = report_json(&rec);
    let heavy = &job_kill(&r)["growers"][0]["stacks"][0];
    assert!(heavy.to_string().contains("leak_step"), "{name}: {heavy}");
    let native = heavy["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "native" && f["function"].is_string())
        .count();
    assert!(native > 0, "{name}: no native frame named: {heavy}");
    assert_eq!(r["job_reads"]["namer_failed"], 0, "{name}");
}

#[test]
fn the_namer_runs_as_the_invoking_user_with_nothing_more() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("namer");
    std::fs::write(dir.path("leak.py"), super::leak_py("0.02")).unwrap();
    check(
        &dir.path(""),
        "sudo",
        &[("SUDO_UID", "4242"), ("SUDO_GID", "4242")],
        4242,
    );
    // Root without sudo: nobody.
    check(&dir.path(""), "root", &[], 65534);
}
