//! Two users' recorders at once on one machine, each with its own leaking
//! Python job under its own limit, as `sudo trainbpf record` run by two
//! people beside each other: each recording has its job's kill with the
//! growth stacks that name the leaking line, and the other's kill is
//! neither shown as its own nor named in it.

use std::os::unix::fs::chown;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::*;

/// `sudo trainbpf record` by `uid`, into a directory that user owns.
fn record_as(uid: u32, dir: &Path, script: &Path) -> std::process::Child {
    std::fs::create_dir_all(dir).unwrap();
    chown(dir, Some(uid), Some(uid)).unwrap();
    Command::new(bin())
        .args(["record", "-q", "--memory-limit", "160M", "-o"])
        .arg(dir.join("r.rec"))
        .arg("--")
        .arg("/usr/bin/python3")
        .arg(script)
        .env("SUDO_UID", uid.to_string())
        .env("SUDO_GID", uid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting trainbpf record")
}

#[test]
fn two_users_recording_at_once_each_keep_their_stacks() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("two-users");
    let script = dir.path("leak.py");
    std::fs::write(&script, super::leak_py("0.005")).unwrap();
    let users = [(65534u32, dir.path("a")), (4242u32, dir.path("b"))];
    let children: Vec<_> = users
        .iter()
        .map(|(uid, d)| record_as(*uid, d, &script))
        .collect();
    let mut jobs = Vec::new();
    for (c, (uid, d)) in children.into_iter().zip(&users) {
        let out = c.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("--- uid {uid}: {}\n{stderr}", out.status);
        assert!(stderr.contains("killed"), "uid {uid}'s job was not killed");
        jobs.push((*uid, d.join("r.rec")));
    }
    let mut victims = Vec::new();
    for (uid, rec) in &jobs {
        let r = report_json(rec);
        let kills = r["kills"].as_array().unwrap();
        // Only its own job's kill: the other user's own limit is counted,
        // not shown.
        assert_eq!(kills.len(), 1, "uid {uid}: {:#}", r["kills"]);
        assert_eq!(r["kills_elsewhere"], 1, "uid {uid}");
        let k = &kills[0];
        assert_eq!(k["victim"]["in_job"], true, "uid {uid}: {k:#}");
        let top = &k["growers"][0];
        let heavy = &top["stacks"][0];
        let names: Vec<&str> = heavy["frames"]
            .as_array()
            .map(|f| f.iter().filter_map(|f| f["function"].as_str()).collect())
            .unwrap_or_default();
        eprintln!("uid {uid}: heaviest stack {} kB {names:?}", heavy["kb"]);
        assert!(
            names.contains(&"leak_step"),
            "uid {uid}'s recording lacks the leaking line: {top:#}"
        );
        assert!(u(&heavy["kb"]) >= 64 << 10, "uid {uid}: {heavy}");
        // Whatever a recorder dropped is counted, and it dropped nothing
        // of the stacks.
        assert_eq!(r["lost"]["stack_map_full"], 0, "uid {uid}: {:#}", r["lost"]);
        victims.push(u(&k["victim"]["pid"]));
        let text = Command::new(bin()).arg("report").arg(rec).output().unwrap();
        let text = String::from_utf8_lossy(&text.stdout).into_owned();
        assert!(
            text.contains("1 OOM kill of other jobs on this machine"),
            "uid {uid}: {text}"
        );
    }
    assert_ne!(victims[0], victims[1]);
    // Neither recording names the other's victim.
    for ((uid, rec), other) in jobs.iter().zip(victims.iter().rev()) {
        let text = Command::new(bin()).arg("report").arg(rec).output().unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(
            !text.contains(&format!("pid {other}")),
            "uid {uid}'s report names the other job's pid {other}:\n{text}"
        );
    }
}
