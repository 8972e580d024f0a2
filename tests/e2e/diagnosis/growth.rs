//! The growth diagnoses on real jobs OOM-killed in a memory cgroup: a
//! steady leak is `steady_leak`, warned of as memory running out before the
//! kill though it is far shorter than `--leak-span`; most of the limit
//! allocated in a second is `fast_growth`. Each kill's text section opens
//! with its most likely cause, `report --explain` gives the evidence, the
//! HTML page leads with it and `record`'s verdict names it.

use std::process::Command;

use crate::support::*;
use serde_json::Value;

const LIMIT: &str = "200M";

/// Leaks 1 MiB every 0.25 s (4 MiB/s) until the kernel kills it: ~50 s
/// under 200 MiB, a climb far shorter than the default five-minute
/// `--leak-span`.
const LEAK: &str = r#"
import time
held = []
while True:
    held.append(bytearray(b"l") * (1 << 20))
    time.sleep(0.25)
"#;

/// Idles 3 s, then allocates 10 MiB at a time without pause until killed:
/// the limit in well under a second.
const FAST: &str = r#"
import time
time.sleep(3)
held = []
while True:
    held.append(bytearray(b"f") * (10 << 20))
"#;

fn trainbpf(args: &[&str]) -> String {
    let out = Command::new(bin())
        .args(args)
        .output()
        .expect("running trainbpf");
    assert!(
        out.status.success(),
        "trainbpf {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The job's kill: its index in `kills`, and the diagnoses of it.
fn job_kill_diagnoses(r: &Value) -> (usize, Vec<&Value>) {
    let i = kills(r)
        .iter()
        .position(|k| k["victim"]["in_job"] == true)
        .unwrap_or_else(|| panic!("no kill of a job process: {:#}", r["kills"]));
    let ds = r["diagnoses"]
        .as_array()
        .expect("diagnoses array")
        .iter()
        .filter(|d| d["kill"].as_u64() == Some(i as u64))
        .collect();
    (i, ds)
}

/// The line after the heading of the job kill's section in the text
/// report (other cgroups' kills on the machine have sections too).
fn kill_opening(text: &str, victim: u64) -> String {
    let mut sections: Vec<Vec<&str>> = Vec::new();
    for l in text.lines() {
        if l.starts_with("OOM kill") {
            sections.push(Vec::new());
        }
        if let Some(s) = sections.last_mut() {
            s.push(l);
        }
    }
    let field = format!("pid {victim} python3,");
    let s = sections
        .iter()
        .find(|s| {
            s.iter()
                .any(|l| l.trim_start().starts_with("victim") && l.contains(&field))
        })
        .unwrap_or_else(|| panic!("no section for the kill of pid {victim}: {text}"));
    s.get(1).copied().unwrap_or_default().to_string()
}

#[test]
fn a_steady_leak_is_warned_of_before_the_kill_and_diagnosed_after() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diag-leak");
    let rec = dir.path("leak.rec");
    let html = dir.path("leak.html");
    let out = record(&rec, &["--memory-limit", LIMIT], &[python(), "-c", LEAK]);
    assert_eq!(out.status.code(), Some(137), "the leak runs into the limit");
    let err = String::from_utf8_lossy(&out.stderr);

    // Warned of while it ran, as memory running out, not as a leak: the
    // climb was far shorter than the five-minute leak span.
    let warned = err
        .find("trainbpf: warning: memory will run out in ~")
        .unwrap_or_else(|| panic!("no warning that memory will run out: {err}"));
    let killed = err
        .find(" killed pid ")
        .expect("the verdict names the kill");
    assert!(warned < killed, "the warning came before the kill: {err}");
    assert!(!err.contains("leak suspected"), "{err}");
    let line = err[warned..].lines().next().unwrap();
    assert!(
        line.contains(": python3 (pid ") && line.contains(", +") && line.contains("MiB/s"),
        "names who climbs and how fast: {line}"
    );
    assert!(
        line.ends_with("the job's cgroup limit of 200 MiB"),
        "and the limit: {line}"
    );
    // The verdict leads with the cause.
    assert!(
        err.contains("trainbpf: most likely: python3 (pid ")
            && err.contains(") leaked steadily: +"),
        "{err}"
    );

    let r = report_json(&rec);
    let root = u(&r["job"]["pid"]);
    let (i, ds) = job_kill_diagnoses(&r);
    let d = ds
        .first()
        .unwrap_or_else(|| panic!("no diagnosis of the kill: {:#}", r["diagnoses"]));
    assert_eq!(d["id"], "steady_leak", "{:#}", r["diagnoses"]);
    assert_eq!(d["confidence"], "high", "{d:#}");
    assert_eq!(d["pids"][0].as_u64(), Some(root), "{d:#}");
    let title = d["title"].as_str().unwrap();
    eprintln!("steady leak's most likely: {title}");
    let ev: Vec<&str> = d["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    // The rate it climbed at, measured: 4 MiB/s, with room.
    let rate: f64 = title
        .split("leaked steadily: +")
        .nth(1)
        .and_then(|s| s.split(" MiB/s").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a rate in MiB/s: {title}"));
    assert!((3.0..=5.0).contains(&rate), "{title}");
    assert!(
        ev.iter().any(|e| e.starts_with("record warned at +")),
        "the warning is part of the evidence: {ev:#?}"
    );
    // The leak warning record: kept in the recording, in the report.
    let w = r["leak_warnings"].as_array().unwrap();
    assert!(
        w.iter()
            .any(|w| w["kind"] == "running_out" && u(&w["pid"]) == root),
        "{w:#?}"
    );

    // The text report: the kill opens with it, and its first fix.
    let text = trainbpf(&["report", rec.to_str().unwrap(), "--no-color"]);
    let first = kill_opening(&text, u(&kills(&r)[i]["victim"]["pid"]));
    eprintln!("text: {first}");
    assert!(
        first.starts_with(&format!(
            "  Most likely: python3 (pid {root}) leaked steadily: +"
        )),
        "{text}"
    );
    // Stacks are on by default: the verdict and its first fix name the
    // line that leaked.
    assert!(title.contains(", in <module> (<string>:"), "{title}");
    assert!(
        text.contains("  Fix:         It grows at <module>"),
        "{text}"
    );

    // --explain: every line of its evidence.
    let e = trainbpf(&[
        "report",
        rec.to_str().unwrap(),
        "--only=explain",
        "--no-color",
    ]);
    assert!(e.contains("(steady_leak, high confidence)"), "{e}");
    for line in &ev {
        let head: String = line
            .split_whitespace()
            .take(4)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(e.contains(&head), "{head:?} in {e}");
    }

    // The HTML page: the diagnosis comes first.
    trainbpf(&[
        "report",
        rec.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    let page = std::fs::read_to_string(&html).unwrap();
    let body = &page[page.find("</header>").unwrap()..];
    assert!(
        body[body.find("<section").unwrap()..]
            .starts_with("<section class=\"diagnosis\" data-id=\"steady_leak\">"),
        "{body}"
    );
}

#[test]
fn most_of_the_limit_in_a_second_is_fast_growth() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diag-fast");
    let rec = dir.path("fast.rec");
    let out = record(&rec, &["--memory-limit", LIMIT], &[python(), "-c", FAST]);
    assert_eq!(out.status.code(), Some(137), "the step does not fit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("memory will run out"),
        "no climb to warn of: {err}"
    );
    assert!(
        err.contains("trainbpf: most likely: python3 (pid "),
        "{err}"
    );

    let r = report_json(&rec);
    let root = u(&r["job"]["pid"]);
    let (i, ds) = job_kill_diagnoses(&r);
    let d = ds
        .first()
        .unwrap_or_else(|| panic!("no diagnosis of the kill: {:#}", r["diagnoses"]));
    assert_eq!(d["id"], "fast_growth", "{:#}", r["diagnoses"]);
    assert_eq!(d["confidence"], "high", "{d:#}");
    assert_eq!(d["pids"][0].as_u64(), Some(root), "{d:#}");
    assert!(
        !ds.iter().any(|d| d["id"] == "steady_leak"),
        "not a leak: {ds:#?}"
    );
    let title = d["title"].as_str().unwrap();
    eprintln!("fast growth's most likely: {title}");
    // It took off after its 3 s idle: the rise is said in seconds, and
    // its size is most of the limit.
    let secs: f64 = title
        .split(" in the last ")
        .nth(1)
        .and_then(|s| s.split(" s:").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a span in seconds: {title}"));
    assert!(secs <= 2.5, "{title}");
    assert!(
        title.contains("of the 200 MiB memory cgroup limit"),
        "{title}"
    );
    assert!(
        d["fix"][0].as_str().unwrap().contains("batch size"),
        "{d:#}"
    );

    let text = trainbpf(&["report", rec.to_str().unwrap(), "--no-color"]);
    let first = kill_opening(&text, u(&kills(&r)[i]["victim"]["pid"]));
    eprintln!("text: {first}");
    assert!(
        first.starts_with(&format!("  Most likely: python3 (pid {root}) added ")),
        "{text}"
    );
    let e = trainbpf(&[
        "report",
        rec.to_str().unwrap(),
        "--only=explain",
        "--no-color",
    ]);
    assert!(e.contains("(fast_growth, high confidence)"), "{e}");
    assert!(e.contains("torch.no_grad()"), "{e}");
}

/// torchrun's stand-in (as in identity.rs, torchrun itself is not
/// installed here): rank 0, then rank 1, each a fork and an exec with
/// torchrun's environment; when rank 1 fails, rank 0 is stopped and the
/// launcher fails.
const LAUNCHER: &str = r#"
import os, subprocess, sys
run_id, worker = sys.argv[1], sys.argv[2]
procs = []
for rank in (0, 1):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
               TORCHELASTIC_RUN_ID=run_id)
    p = subprocess.Popen([sys.executable, "-c", worker, str(rank)], env=env,
                         stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"up\n"
    procs.append(p)
rc = procs[1].wait()
procs[0].terminate()
procs[0].wait()
sys.exit(1 if rc else 0)
"#;

/// Rank 0 holds 100 MiB; rank 1 keeps 4 MiB every step, about 35 MiB/s,
/// until the 400 MiB limit kills it: about 8 s of climb, too short for
/// the steady climb the leak model asked of a killed process (10 s), and
/// under half the limit in the last 5 s, too slow for fast growth.
const RANKS: &str = r#"
import sys, time
rank = int(sys.argv[1])
if rank == 0:
    keep = bytearray(b"0") * (100 << 20)
print("up", flush=True)
if rank == 0:
    while True:
        time.sleep(1)
kept = []
while True:
    kept.append(bytearray(b"1") * (4 << 20))
    time.sleep(0.11)
"#;

/// Runs `trainbpf record -o REC [extra…] -- cmd…` with its stderr on a
/// pseudo-terminal, as a person at a terminal does: the status line is
/// drawn. Returns how it ended and what the terminal showed.
fn record_on_a_terminal(
    rec: &std::path::Path,
    extra: &[&str],
    cmd: &[&str],
) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    use std::process::Stdio;
    let (master, slave_path) = open_pty();
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&slave_path)
        .unwrap();
    let mut c = Command::new(bin());
    c.arg("record")
        .arg("-o")
        .arg(rec)
        .args(extra)
        .arg("--")
        .args(cmd)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave));
    let mut recorder = c.spawn().expect("running trainbpf record");
    // The command holds the slave open: the master reads EOF (EIO) only
    // once the recorder and the job have closed it too.
    drop(c);
    // Read so that the recorder never blocks on a full terminal.
    let mut out = master;
    let screen = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let st = recorder.wait().unwrap();
    let screen = screen.join().unwrap();
    eprintln!(
        "--- trainbpf record {extra:?} on a terminal: {st}\n--- the terminal showed:\n{screen}"
    );
    (st, screen)
}

// The diagnosis depended on `--quiet`: a rank that
// leaked to the limit in seconds got only `container_limit`.
#[test]
fn a_ranks_leak_to_the_limit_is_diagnosed_alike_quiet_or_on_a_terminal() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("diag-quiet");
    let run_id = format!("diag-quiet-{}", std::process::id());
    let job = [python(), "-c", LAUNCHER, run_id.as_str(), RANKS];
    let quiet = dir.path("quiet.rec");
    let out = record(&quiet, &["-q", "--memory-limit", "400M"], &job);
    assert_eq!(out.status.code(), Some(1), "the launcher fails with rank 1");
    let drawn = dir.path("drawn.rec");
    let (st, screen) = record_on_a_terminal(&drawn, &["--memory-limit", "400M"], &job);
    assert_eq!(st.code(), Some(1), "the launcher fails with rank 1");
    assert!(
        screen.contains("\r\x1b[2Ktrainbpf 0:"),
        "the status line was drawn: {screen}"
    );

    let mut firsts = Vec::new();
    for (how, rec) in [("-q", &quiet), ("on a terminal", &drawn)] {
        let r = report_json(rec);
        let (_, ds) = job_kill_diagnoses(&r);
        let v = &job_kill(&r)["victim"];
        let victim = u(&v["pid"]);
        assert_eq!(v["rank"], 1, "{how}: the victim is rank 1: {v}");
        let ids: Vec<&str> = ds.iter().map(|d| d["id"].as_str().unwrap()).collect();
        let d = ds
            .first()
            .unwrap_or_else(|| panic!("{how}: no diagnosis of the kill: {:#}", r["diagnoses"]));
        let title = d["title"].as_str().unwrap();
        eprintln!("{how}: diagnoses {ids:?}; most likely: {title}");
        assert!(
            d["id"] == "steady_leak" || d["id"] == "fast_growth",
            "{how}: the leak, not only the limit: {ids:?}\n{:#}",
            r["diagnoses"]
        );
        assert_eq!(d["pids"][0].as_u64(), Some(victim), "{how}: {d:#}");
        assert!(
            title.starts_with(&format!("rank 1 (pid {victim}) ")),
            "{how}: {title}"
        );
        firsts.push(d["id"].as_str().unwrap().to_string());
    }
    assert_eq!(firsts[0], firsts[1], "the same first diagnosis either way");
}
