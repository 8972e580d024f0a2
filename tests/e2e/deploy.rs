//! deploy/kubernetes/daemonset.yaml grants the recorder a few capabilities
//! instead of a privileged container. This runs `record --all` with exactly
//! those (the bounding set cut to them, no_new_privs as
//! `allowPrivilegeEscalation: false` sets it) and checks that it still does
//! its work on another user's processes: loads and attaches, reads a
//! non-root rank's RANK from its environment, and catches its OOM kill.

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::support::*;
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

/// `record --all` with only `caps`, returned once its probes are attached.
fn recorder_with(caps: &[String], rec: &Path) -> Child {
    let args = ["record", "--all", "-q", "-o"].map(String::from);
    let mut args = args.to_vec();
    args.push(rec.to_str().unwrap().to_string());
    trainbpf_with(caps, &args)
}

/// `trainbpf ARGS` with only `caps`, returned once its probes are attached.
fn trainbpf_with(caps: &[String], args: &[String]) -> Child {
    let set = format!("-all,+{}", caps.join(",+"));
    let mut child = Command::new("setpriv")
        .args(["--no-new-privs", "--inh-caps=-all", "--bounding-set", &set])
        .arg(bin())
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux)");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        let n = err.read_line(&mut line).unwrap();
        assert!(n > 0, "{args:?} with {caps:?} ended before attaching");
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
        .args(["report", "--format=json"])
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
    let cg = Cg::new("deploy", "64M");
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

/// The pod IP and node name the test's kubelet gives the DaemonSet's
/// downward API: an address of this machine other than 127.0.0.1, and a
/// name other than its own.
const POD_IP: &str = "127.0.0.2";
const NODE_NAME: &str = "tbdeploy-node";

/// The container's command line as the kubelet runs it: each `$(VAR)` of
/// its `env` replaced, a downward-API field by the test's stand-in.
fn daemonset_argv() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/daemonset.yaml");
    let ds: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let mut vars = Vec::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let field = e["valueFrom"]["fieldRef"]["fieldPath"].as_str();
        let value = match field {
            Some("status.podIP") => POD_IP,
            Some("spec.nodeName") => NODE_NAME,
            other => panic!("no stand-in for {other:?} in {e}"),
        };
        vars.push((format!("$({})", e["name"].as_str().unwrap()), value));
    }
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    let mut argv = strs(&c["command"]);
    argv.extend(strs(&c["args"]));
    for a in &mut argv {
        for (var, value) in &vars {
            *a = a.replace(var.as_str(), value);
        }
    }
    argv
}

/// The TCP addresses `pid` listens on, from /proc/net/tcp{,6}: its
/// sockets' inodes matched to the kernel's listening sockets.
fn listening(pid: u32) -> Vec<std::net::SocketAddr> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_str()?;
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap().lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // st 0A is LISTEN; the inode is the tenth field.
            if f[3] != "0A" || !inodes.iter().any(|i| i == f[9]) {
                continue;
            }
            let (ip, port) = f[1].split_once(':').unwrap();
            let port = u16::from_str_radix(port, 16).unwrap();
            // Each 32-bit word of the address in the host's (little-endian) order.
            let words: Vec<[u8; 4]> = (0..ip.len() / 8)
                .map(|i| {
                    u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16)
                        .unwrap()
                        .to_le_bytes()
                })
                .collect();
            let ip: std::net::IpAddr = match words.as_slice() {
                [w] => std::net::Ipv4Addr::from(*w).into(),
                w => std::net::Ipv6Addr::from(<[u8; 16]>::try_from(w.concat()).unwrap()).into(),
            };
            out.push(std::net::SocketAddr::new(ip, port));
        }
    }
    out
}

// The DaemonSet served every tenant's process names on every node address.
/// The DaemonSet's command line, as the kubelet would run it with its
/// downward API, with the DaemonSet's capabilities: `/metrics` listens on
/// the pod's IP alone (no wildcard address that every interface of the
/// node answers on), answers there, and the recording is named, and names
/// its host, for the node.
#[test]
fn the_daemonset_serves_metrics_on_the_pod_ip_alone() {
    require_root();
    let _g = serial();
    let caps = daemonset_caps();
    let dir = TempDir::new("deploy-bind");
    let mut argv = daemonset_argv();
    eprintln!("the DaemonSet's command line: {argv:?}");
    // The recording in the test's directory, under the manifest's name.
    let o = argv.iter().position(|a| a == "-o").unwrap() + 1;
    let name = Path::new(&argv[o]).file_name().unwrap().to_owned();
    argv[o] = dir.0.join(name).to_str().unwrap().to_string();
    let mut recorder = trainbpf_with(&caps, &argv[1..]);

    let addrs = listening(recorder.id());
    eprintln!("the recorder listens on {addrs:?}");
    assert!(
        addrs.iter().all(|a| !a.ip().is_unspecified()),
        "/metrics listens on every address of the node: {addrs:?}"
    );
    let port = addrs.first().map(|a| a.port()).expect("a listening socket");
    assert_eq!(addrs, [format!("{POD_IP}:{port}").parse().unwrap()]);
    let mut s = std::net::TcpStream::connect((POD_IP, port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut s, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer:.80}");

    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) }, 0);
    assert!(recorder.wait().unwrap().success());
    let recs: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(recs.len(), 1, "{recs:?}");
    let file = recs[0].file_name().unwrap().to_str().unwrap();
    assert!(file.starts_with(&format!("{NODE_NAME}-")), "{file}");
    // The recording's own host, as report reads it.
    let out = Command::new(bin())
        .arg("report")
        .arg(&recs[0])
        .arg("--html")
        .arg(dir.path("{host}.html"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path(&format!("{NODE_NAME}.html")).exists());
}
