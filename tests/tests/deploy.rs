//! deploy/kubernetes/daemonset.yaml grants the recorder a few capabilities
//! instead of a privileged container. This runs `record --all` with exactly
//! those (the bounding set cut to them, no_new_privs as
//! `allowPrivilegeEscalation: false` sets it) and checks that it still does
//! its work on another user's processes: loads and attaches, reads a
//! non-root rank's RANK from its environment, and catches its OOM kill.

mod common;

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::*;
use serde_json::Value;

const NOBODY: &str = "65534";

/// The capabilities the DaemonSet's container adds, as setpriv names them.
fn daemonset_caps() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/daemonset.yaml");
    let ds: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let caps = &ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"];
    assert_eq!(caps["drop"][0], "ALL");
    caps["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_lowercase())
        .collect()
}

/// A v1 or v2 memory cgroup made by the test, removed on drop.
struct Cg(PathBuf);

impl Cg {
    fn new(limit: &str) -> Cg {
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|s| s.contains("memory"));
        let (root, file) = if v2 {
            ("/sys/fs/cgroup", "memory.max")
        } else {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        };
        let dir = Path::new(root).join(format!("trainbpf-test-deploy-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        std::fs::write(dir.join(file), limit).expect("set the limit");
        Cg(dir)
    }
}

impl Drop for Cg {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `record --all` with only `caps`, returned once its probes are attached.
fn recorder_with(caps: &[String], rec: &Path) -> Child {
    let set = format!("-all,+{}", caps.join(",+"));
    let mut child = Command::new("setpriv")
        .args(["--no-new-privs", "--inh-caps=-all", "--bounding-set", &set])
        .arg(bin())
        .args(["record", "--all", "-q", "-o"])
        .arg(rec)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux)");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        let n = err.read_line(&mut line).unwrap();
        assert!(n > 0, "record --all with {caps:?} ended before attaching");
        eprint!("{line}");
        if line.contains("attached") {
            break;
        }
    }
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::stderr()));
    child
}

/// A "rank" running as nobody in the cgroup. Rank 1 grows past the limit
/// once a line arrives on its stdin; rank 0 only waits.
fn rank(cg: &Cg, n: u32) -> Child {
    let script = "import sys\nsys.stdin.readline()\nif sys.argv[1] == '1':\n    h = [bytearray(b'r') * (8 << 20) for _ in range(64)]\nsys.stdin.readline()\n";
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {procs} && exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups \
             env RANK={n} LOCAL_RANK={n} WORLD_SIZE=2 {py} -c \"$0\" {n}",
            procs = cg.0.join("cgroup.procs").display(),
            py = python(),
        ))
        .arg(script)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The role of the report group holding all of `pids`, read from the
/// recording while it is being written.
fn group_of(rec: &Path, pids: &[u64]) -> Option<String> {
    let out = Command::new(bin())
        .args(["report", "--json"])
        .arg(rec)
        .output()
        .ok()?;
    let r: Value = serde_json::from_slice(&out.stdout).ok()?;
    r["groups"].as_array()?.iter().find_map(|g| {
        let members: Vec<u64> = g["pids"]
            .as_array()?
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        pids.iter()
            .all(|p| members.contains(p))
            .then(|| g["role"].as_str().unwrap_or("").to_string())
    })
}

#[test]
fn the_daemonsets_capabilities_record_another_users_ranks_and_kill() {
    require_root();
    let _g = serial();
    let caps = daemonset_caps();
    let dir = TempDir::new("deploy");
    let rec = dir.path("all.rec");
    let cg = Cg::new("64M");
    let mut recorder = recorder_with(&caps, &rec);

    // The recorder holds no more than the DaemonSet grants: no SYS_ADMIN,
    // no DAC_OVERRIDE (the test would prove nothing otherwise).
    let status = std::fs::read_to_string(format!("/proc/{}/status", recorder.id())).unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    const DAC_OVERRIDE: u32 = 1;
    const SYS_ADMIN: u32 = 21;
    const BPF: u32 = 39;
    assert_eq!(
        eff & (1 << SYS_ADMIN | 1 << DAC_OVERRIDE),
        0,
        "CapEff {eff:x}"
    );
    assert_ne!(eff & 1 << BPF, 0, "CapEff {eff:x}");

    let mut r0 = rank(&cg, 0);
    let mut r1 = rank(&cg, 1);
    let pids = [u64::from(r0.id()), u64::from(r1.id())];
    // Read when the recorder saw them start; waited for here, not slept.
    let start = Instant::now();
    let role = loop {
        if let Some(role) = group_of(&rec, &pids) {
            break role;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the two ranks (uid {NOBODY}) never made one group in the recording with {caps:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(
        role, "torchrun ranks",
        "grouped, but not as ranks: RANK in their environment went unread with {caps:?}"
    );

    r1.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let st = r1.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        st.signal(),
        Some(libc::SIGKILL),
        "rank 1 was OOM-killed: {st}"
    );
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) }, 0);
    assert!(recorder.wait().unwrap().success());
    drop(r0.stdin.take());
    let _ = r0.kill();
    let _ = r0.wait();

    let r = report_json(&rec);
    let kill = kills(&r)
        .iter()
        .find(|k| u(&k["victim"]["pid"]) == pids[1])
        .unwrap_or_else(|| panic!("rank 1's kill is not in the recording: {:#}", r["kills"]));
    assert_eq!(kill["victim"]["uid"].to_string(), NOBODY);
    assert_eq!(kill["victim"]["in_job"], true);
}
