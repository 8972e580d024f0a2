//! `record --metrics` scraped by a real Prometheus server, and `record
//! --events-jsonl`, on real OOM kills in a memory cgroup.
//!
//! Prometheus is Debian's (`cargo xtask test` installs it), started here
//! with its own scrape config, storage and loopback port; what it scraped
//! is read back through its HTTP query API, as a dashboard or an alert
//! would read it.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::support::{Cg, TempDir, bin, job_kill, report_json, require_root, serial, u};
use serde_json::Value;

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// A port free on loopback now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` over HTTP/1.0 (the server closes the connection after the
/// answer): the status code and the body.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// Prometheus' answer to an instant query, `data.result`.
fn query(port: u16, promql: &str) -> Value {
    let enc: String = promql
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let (code, body) = get(port, &format!("/api/v1/query?query={enc}"))
        .unwrap_or_else(|| panic!("querying Prometheus for {promql}"));
    assert_eq!(code, 200, "{promql}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "success", "{body}");
    v
}

/// Polls until `ok` holds, or panics with `what` after `limit`.
fn poll<T>(what: &str, limit: Duration, mut ok: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = ok() {
            return v;
        }
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A child killed when the test ends, however it ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_prometheus(dir: &TempDir, target_port: u16, port: u16) -> Reaped {
    assert!(
        Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} is missing: `cargo xtask test` installs Debian's prometheus package"
    );
    let config = dir.path("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n\
             scrape_configs:\n  - job_name: trainbpf\n    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path("prometheus.log")).unwrap();
    let child = Command::new(PROMETHEUS)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting prometheus");
    let p = Reaped(child);
    poll("Prometheus ready", Duration::from_secs(60), || {
        get(port, "/-/ready").filter(|(c, _)| *c == 200)
    });
    p
}

/// The recorder, its job waiting for `go` before it runs out of memory in
/// its 150 MiB cgroup (`tail` holds all of its input), then for `done`.
fn start_recorder(dir: &TempDir, metrics_port: u16) -> Reaped {
    let script = format!(
        "while [ ! -e {go} ]; do sleep 0.1; done; head -c 400M /dev/zero | tail; \
         while [ ! -e {done} ]; do sleep 0.1; done",
        go = dir.path("go").display(),
        done = dir.path("done").display()
    );
    let child = Command::new(bin())
        .arg("record")
        .arg("-q")
        .arg("-o")
        .arg(dir.path("m.rec"))
        .arg("--metrics")
        .arg(format!("127.0.0.1:{metrics_port}"))
        .arg("--events-jsonl")
        .arg(dir.path("events.jsonl"))
        .args(["--memory-limit", "150M", "--", "sh", "-c", &script])
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .stdin(Stdio::null())
        .spawn()
        .expect("starting trainbpf record");
    Reaped(child)
}

fn wait_exit(r: &mut Reaped) {
    let status = poll("the recorder's end", Duration::from_secs(120), || {
        r.0.try_wait().unwrap()
    });
    assert!(status.success(), "trainbpf record: {status}");
}

/// The JSON lines of `--events-jsonl`, each parsed.
fn events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.ends_with('\n'), "every line ends: {text:?}");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn prometheus_scrapes_an_oom_kill_with_the_victims_labels() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("metrics");
    let rec_port = free_port();
    let prom_port = poll("a second free port", Duration::from_secs(5), || {
        Some(free_port()).filter(|&p| p != rec_port)
    });
    let _prom = start_prometheus(&dir, rec_port, prom_port);
    let mut rec = start_recorder(&dir, rec_port);

    // Scraped before the kill: the recorder is up and counts none.
    poll("a scrape of the recorder", Duration::from_secs(60), || {
        let v = query(prom_port, "up{job=\"trainbpf\"} == 1");
        (!v["data"]["result"].as_array()?.is_empty()).then_some(())
    });
    let before = query(prom_port, "trainbpf_oom_kills_total");
    assert_eq!(
        before["data"]["result"],
        serde_json::json!([]),
        "no kill before the job ran out: {before}"
    );

    std::fs::write(dir.path("go"), "").unwrap();
    let promql = "trainbpf_oom_kills_total{constraint=\"memcg\",comm=\"tail\"}";
    let answer = poll("the kill in Prometheus", Duration::from_secs(60), || {
        let v = query(prom_port, promql);
        let r = v["data"]["result"].as_array()?.first()?.clone();
        (r["value"][1].as_str()?.parse::<f64>().ok()? >= 1.0).then_some(v)
    });
    eprintln!("PromQL {promql}:\n{answer}");
    eprintln!(
        "PromQL trainbpf_oom_kills_total:\n{}",
        query(prom_port, "trainbpf_oom_kills_total")
    );
    let series = &answer["data"]["result"][0];
    assert_eq!(series["metric"]["__name__"], "trainbpf_oom_kills_total");
    assert_eq!(series["metric"]["job"], "trainbpf");
    assert_eq!(series["value"][1], "1", "one kill: {answer}");
    // No per-pid label; rank and container are empty here (no torchrun,
    // no container), so Prometheus drops them.
    let labels: Vec<&String> = series["metric"].as_object().unwrap().keys().collect();
    assert_eq!(
        labels,
        ["__name__", "comm", "constraint", "instance", "job"],
        "{answer}"
    );
    // The victim's death follows its kill once it has exited.
    poll(
        "the victim's death in Prometheus",
        Duration::from_secs(30),
        || {
            let v = query(prom_port, "trainbpf_deaths_total{cause=\"oom_memcg\"}");
            (v["data"]["result"][0]["value"][1] == "1").then_some(())
        },
    );

    std::fs::write(dir.path("done"), "").unwrap();
    wait_exit(&mut rec);
    // The same kill in the recording and in the JSON lines.
    let report = report_json(&dir.path("m.rec"));
    let k = job_kill(&report);
    assert_eq!(k["victim"]["comm"], "tail");
    let pid = u(&k["victim"]["pid"]);
    let lines = events(&dir.path("events.jsonl"));
    let kill = lines
        .iter()
        .find(|l| l["event"] == "oom_kill")
        .unwrap_or_else(|| panic!("no oom_kill line: {lines:?}"));
    assert_eq!(u(&kill["pid"]), pid, "{kill}");
}

/// Each line parses; the kill is there with the victim's pid, constraint
/// and cgroup, its death says it was the OOM killer, a SIGTERM's death
/// names its sender, and clean exits are left out. The file is the
/// invoking user's, 0600, appended to; a link at the path is refused.
#[test]
fn events_jsonl_has_each_kill_and_death() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("events-jsonl");
    let path = dir.path("events.jsonl");
    std::fs::write(&path, "").unwrap();
    let script = "sleep 30 & s=$!; kill -TERM $s; wait $s; head -c 400M /dev/zero | tail; true";
    let out = crate::support::record(
        &dir.path("e.rec"),
        &[
            "-q",
            "--memory-limit",
            "150M",
            "--events-jsonl",
            path.to_str().unwrap(),
        ],
        &["sh", "-c", script],
    );
    assert!(out.status.success(), "{out:?}");
    let report = report_json(&dir.path("e.rec"));
    let k = job_kill(&report);
    let pid = u(&k["victim"]["pid"]);
    let lines = events(&path);
    for l in &lines {
        assert!(l["time"].as_str().unwrap().ends_with('Z'), "{l}");
        assert!(!l["host"].as_str().unwrap().is_empty(), "{l}");
        assert!(l["event"] == "oom_kill" || l["event"] == "death", "{l}");
        assert!(
            !(l["event"] == "death" && l["cause"] == "exit" && l["exit_code"] == 0),
            "a clean exit is no event: {l}"
        );
    }
    let kill = lines
        .iter()
        .find(|l| l["event"] == "oom_kill" && u(&l["pid"]) == pid)
        .unwrap_or_else(|| panic!("no line for the kill of {pid}: {lines:#?}"));
    assert_eq!(kill["comm"], "tail");
    assert_eq!(kill["constraint"], "memcg");
    assert_eq!(kill["memcg"], k["memcg"], "{kill}");
    assert!(u(&kill["rss_bytes"]) > 100 << 20, "{kill}");
    // The kill's one line: the report's, told at the kill (with -q too).
    assert_eq!(kill["verdict"], k["verdict"], "{kill}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("trainbpf: {}\n", k["verdict"].as_str().unwrap())),
        "{stderr}"
    );
    let death = |pid: u64| {
        lines
            .iter()
            .find(|l| l["event"] == "death" && u(&l["pid"]) == pid)
            .unwrap_or_else(|| panic!("no death line of {pid}: {lines:#?}"))
    };
    assert_eq!(death(pid)["cause"], "oom_memcg");
    assert_eq!(death(pid)["signal"], 9);
    let termed = crate::support::deaths(&report)
        .iter()
        .find(|d| d["signal"] == 15)
        .unwrap_or_else(|| panic!("no SIGTERM death: {}", report["deaths"]));
    let d = death(u(&termed["pid"]));
    assert_eq!(d["cause"], "signal");
    assert_eq!(d["sender_comm"], "sh", "{d}");

    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.uid(), 0);
    let n = lines.len();
    // A second recording appends.
    let out = crate::support::record(
        &dir.path("e2.rec"),
        &["-q", "--events-jsonl", path.to_str().unwrap()],
        &["sh", "-c", "exit 3"],
    );
    assert_eq!(out.status.code(), Some(3));
    let again = events(&path);
    assert_eq!(&again[..n], &lines[..], "appended, not replaced");
    assert!(again[n..].iter().any(|l| l["exit_code"] == 3), "{again:#?}");
    // A new file is 0600.
    let fresh = dir.path("fresh.jsonl");
    let out = crate::support::record(
        &dir.path("e3.rec"),
        &["-q", "--events-jsonl", fresh.to_str().unwrap()],
        &["true"],
    );
    assert!(out.status.success());
    assert_eq!(std::fs::metadata(&fresh).unwrap().mode() & 0o777, 0o600);
    // Never through a link.
    let link = dir.path("link.jsonl");
    std::os::unix::fs::symlink(dir.path("target"), &link).unwrap();
    let out = crate::support::record(
        &dir.path("e4.rec"),
        &["-q", "--events-jsonl", link.to_str().unwrap()],
        &["true"],
    );
    assert!(!out.status.success(), "a link at the path is refused");
    assert!(!dir.path("target").exists());
}

/// Attached with `--cgroup`, the recorder serves the same: the cgroup's
/// limit, then the kill of a process in it.
#[test]
fn an_attached_recorder_serves_the_kill_and_the_cgroups_limit() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("metrics-cgroup");
    let cg = Cg::new("metrics", "120M");
    let script = format!(
        "echo $$ > {procs}; while [ ! -e {go} ]; do sleep 0.1; done; \
         head -c 300M /dev/zero | tail; while [ ! -e {done} ]; do sleep 0.1; done",
        procs = cg.0.join("cgroup.procs").display(),
        go = dir.path("go").display(),
        done = dir.path("done").display()
    );
    let mut job = Reaped(
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    poll("the job in its cgroup", Duration::from_secs(10), || {
        let procs = std::fs::read_to_string(cg.0.join("cgroup.procs")).ok()?;
        (!procs.trim().is_empty()).then_some(())
    });
    let port = free_port();
    let mut rec = Reaped(
        Command::new(bin())
            .args(["record", "-q", "-o"])
            .arg(dir.path("c.rec"))
            .arg("--cgroup")
            .arg(&cg.0)
            .arg("--metrics")
            .arg(format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let scrape = || {
        get(port, "/metrics")
            .filter(|(c, _)| *c == 200)
            .map(|r| r.1)
    };
    let first = poll("the endpoint", Duration::from_secs(60), || {
        scrape().filter(|t| t.contains("trainbpf_cgroup_memory_limit_bytes "))
    });
    assert!(
        first.contains("\ntrainbpf_cgroup_memory_limit_bytes 125829120"),
        "{first}"
    );
    assert!(!first.contains("trainbpf_oom_kills_total{"), "{first}");
    std::fs::write(dir.path("go"), "").unwrap();
    let want = "\ntrainbpf_oom_kills_total{constraint=\"memcg\",comm=\"tail\",rank=\"\",container=\"\"} 1\n";
    poll("the kill at /metrics", Duration::from_secs(60), || {
        scrape().filter(|t| t.contains(want))
    });
    // The victim's death follows its kill, as soon as it has exited.
    let death = "\ntrainbpf_deaths_total{cause=\"oom_memcg\"} 1\n";
    poll(
        "the victim's death at /metrics",
        Duration::from_secs(30),
        || scrape().filter(|t| t.contains(death)),
    );
    std::fs::write(dir.path("done"), "").unwrap();
    poll("the job's end", Duration::from_secs(30), || {
        job.0.try_wait().unwrap()
    });
    // SAFETY: kill(2) on our own child: SIGINT detaches it.
    assert_eq!(unsafe { libc::kill(rec.0.id() as i32, libc::SIGINT) }, 0);
    wait_exit(&mut rec);
}

/// One `GET /metrics` that must be answered within `deadline`: connect,
/// request, and the whole answer, or `Err` saying what went wrong.
fn scrape_within(port: u16, deadline: Duration) -> Result<(), String> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), deadline)
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(deadline)).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&buf);
    if t0.elapsed() > deadline {
        return Err(format!("answered after {:?}", t0.elapsed()));
    }
    let code = text.split_whitespace().nth(1);
    if code != Some("200") || !text.contains("\ntrainbpf_") {
        return Err(format!(
            "not an answer: {} bytes {:?}",
            buf.len(),
            &text[..text.len().min(80)]
        ));
    }
    Ok(())
}

/// A client that holds `n` connections open and sends nothing on them,
/// reopening each as soon as the server closes it, until `stop`. Returns
/// how many connections it opened in all.
fn hog(port: u16, n: usize, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use std::sync::atomic::Ordering;
    let mut open: Vec<TcpStream> = Vec::new();
    let mut opened = 0;
    while !stop.load(Ordering::Relaxed) {
        // Keep only the connections the server has not closed.
        open.retain(|s| {
            let mut b = [0u8; 1];
            match s.peek(&mut b) {
                Ok(n) => n > 0,
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            }
        });
        while open.len() < n {
            let Ok(s) = TcpStream::connect(("127.0.0.1", port)) else {
                break;
            };
            s.set_nonblocking(true).unwrap();
            open.push(s);
            opened += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    opened
}

// One client reopening idle connections blinded /metrics.
/// A client that keeps more connections open than the server serves at
/// once, idle, and reopens each as soon as it closes, must not stop a
/// scraper: every one of 20 scrapes is answered within 2 s.
#[test]
fn idle_connections_do_not_blind_the_endpoint() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("metrics-hog");
    let port = free_port();
    let script = format!(
        // Ends also once the test's directory is gone, however it ends.
        "while [ ! -e {done} ] && [ -d {dir} ]; do sleep 0.1; done",
        done = dir.path("done").display(),
        dir = dir.0.display()
    );
    let mut rec = Reaped(
        Command::new(bin())
            .args(["record", "-q", "-o"])
            .arg(dir.path("h.rec"))
            .arg("--metrics")
            .arg(format!("127.0.0.1:{port}"))
            .args(["--", "sh", "-c", &script])
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID")
            .stdin(Stdio::null())
            .spawn()
            .expect("starting trainbpf record"),
    );
    poll("the endpoint", Duration::from_secs(60), || {
        scrape_within(port, Duration::from_secs(2)).ok()
    });

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hogger = {
        let stop = stop.clone();
        std::thread::spawn(move || hog(port, 18, &stop))
    };
    // The hog's connections are all open before the first scrape.
    std::thread::sleep(Duration::from_millis(500));
    let mut failed = Vec::new();
    for i in 0..20 {
        if let Err(e) = scrape_within(port, Duration::from_secs(2)) {
            failed.push(format!("scrape {i}: {e}"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opened = hogger.join().unwrap();
    eprintln!(
        "{} of 20 scrapes answered while another client opened {opened} idle connections",
        20 - failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} of 20 scrapes failed: {failed:#?}",
        failed.len()
    );

    // A connection that sends nothing is closed within about a second.
    let mut idle = TcpStream::connect(("127.0.0.1", port)).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let t0 = Instant::now();
    let n = idle.read(&mut [0u8; 16]).unwrap_or(0);
    let waited = t0.elapsed();
    eprintln!("a silent connection was closed after {waited:?}");
    assert_eq!(n, 0, "nothing is sent to a silent client");
    assert!(
        waited < Duration::from_millis(2500),
        "a silent connection held for {waited:?}"
    );

    std::fs::write(dir.path("done"), "").unwrap();
    wait_exit(&mut rec);
}
