//! The pip wheel as a user installs it: a fresh virtual environment, `pip
//! install` of the built wheel with no index (it must need nothing else),
//! and that environment's `trainbpf`, run by its absolute path as root the
//! way `sudo "$(command -v trainbpf)"` runs it, records and reports a real
//! OOM kill.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

use crate::support::*;

/// The wheel `cargo xtask test` built (`cargo xtask wheel` prints one).
fn wheel() -> PathBuf {
    let p = std::env::var_os("TRAINBPF_WHEEL")
        .map(PathBuf::from)
        .expect(
            "TRAINBPF_WHEEL is not set: run the suite with `cargo xtask test`, or set it to \
         the path `cargo xtask wheel` prints. This test does not skip.",
        );
    assert!(p.is_file(), "TRAINBPF_WHEEL: no file at {}", p.display());
    p
}

fn git_head() -> String {
    let out = Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR")])
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .expect("running git");
    assert!(out.status.success(), "git rev-parse HEAD failed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn pip_installed_wheel_records_and_reports_a_kill() {
    require_root();
    let _g = serial();
    let wheel = wheel();
    let dir = TempDir::new("wheel");
    let venv = dir.path("venv");
    let made = Command::new(python())
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("python3 -m venv");
    assert!(made.success(), "making the venv failed");
    // --no-index: a runtime dependency would have to be fetched, and fails.
    let pip = Command::new(venv.join("bin/pip"))
        .args(["install", "--no-index", "--no-cache-dir", "--quiet"])
        .arg(&wheel)
        .output()
        .expect("running pip");
    assert!(
        pip.status.success(),
        "pip install {}: {}",
        wheel.display(),
        String::from_utf8_lossy(&pip.stderr)
    );
    let show = Command::new(venv.join("bin/pip"))
        .args(["show", "trainbpf"])
        .output()
        .expect("pip show");
    let show = String::from_utf8_lossy(&show.stdout).into_owned();
    assert!(
        show.lines().any(|l| l.trim_end() == "Requires:"),
        "the wheel requires nothing: {show}"
    );
    assert!(
        show.lines()
            .any(|l| l == format!("Version: {}", env!("CARGO_PKG_VERSION"))),
        "the wheel's version is Cargo's: {show}"
    );

    // What `command -v trainbpf` finds with the venv active.
    let exe = venv.join("bin/trainbpf");
    let version = Command::new(&exe)
        .arg("--version")
        .output()
        .expect("running the wheel's trainbpf");
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    assert_eq!(
        version,
        format!(
            "trainbpf {} (commit {})",
            env!("CARGO_PKG_VERSION"),
            git_head()
        ),
        "--version names the release and the commit"
    );

    let rec = dir.path("kill.rec");
    let grow = "hold = []\nwhile True:\n    hold.append(bytearray(b'w') * (4 << 20))\n";
    let out = Command::new(&exe)
        .args(["record", "--memory-limit", "96M", "-o"])
        .arg(&rec)
        .args(["--", python(), "-c", grow])
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .stdin(Stdio::null())
        .output()
        .expect("running the wheel's trainbpf record");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- wheel's trainbpf record: {}\n{stderr}", out.status);
    assert_eq!(out.status.code(), Some(137), "the job was OOM-killed");

    let json = Command::new(&exe)
        .args(["report", "--format", "json"])
        .arg(&rec)
        .output()
        .expect("running the wheel's trainbpf report");
    assert!(json.status.success(), "report --format json failed");
    let r: serde_json::Value = serde_json::from_slice(&json.stdout).expect("report JSON");
    let kills = kills(&r);
    assert_eq!(kills.len(), 1, "one kill: {kills:#?}");
    let victim = u(&kills[0]["victim"]["pid"]);
    let kernel = dmesg_kill(victim).unwrap_or_else(|| panic!("no kernel line for {victim}"));
    assert!(kernel.memcg, "the kernel says memcg OOM");
    assert_eq!(u(&kills[0]["victim"]["anon_rss_kb"]), kernel.anon_kb);
    assert_eq!(u(&r["lost_events"]), 0);

    let text = Command::new(&exe)
        .arg("report")
        .arg(&rec)
        .output()
        .expect("running the wheel's trainbpf report");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("OOM kill at") && text.contains(&format!("pid {victim}")),
        "the text report explains the kill: {text}"
    );
}
