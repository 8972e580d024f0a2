//! The report's outputs, on one real memcg OOM kill: the terminal report,
//! the HTML page (rendered by a real browser, headless Chromium), the
//! Perfetto trace (checked against the trace-event format) and the JSON
//! (checked against docs/report.schema.json). All of them must name the same
//! victim and top grower.
//!
//! The job: a trainer that forks short-lived DataLoader-like workers twice,
//! then a sibling with oom_score_adj 1000 and a worker that grows until the
//! cgroup's limit. The kernel kills the sibling, so the victim and the top
//! grower are different processes, as they are in the confusing real cases.
//! The files are kept under target/tmp/outputs/ for a person to look at.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use crate::support::*;
use serde_json::Value;

const SCENE: &str = r#"
import os, time
def name(n):
    with open("/proc/self/comm", "w") as f:
        f.write(n)
def spawn(fn):
    pid = os.fork()
    if pid == 0:
        fn()
        os._exit(0)
    return pid
def loader():
    name("pt_data_worker")
    hold = bytearray(b"d") * (12 << 20)
    time.sleep(0.8)
name("trainer")
model = bytearray(b"m") * (24 << 20)
for epoch in range(2):
    for w in [spawn(loader) for _ in range(3)]:
        os.waitpid(w, 0)
def sacrifice():
    name("sacrifice")
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    keep = bytearray(b"s") * (16 << 20)
    time.sleep(60)
sib = spawn(sacrifice)
time.sleep(0.3)
def grow():
    name("leaky_worker")
    hold = []
    while True:
        try:
            os.kill(sib, 0)
            if open(f"/proc/{sib}/stat").read().split()[2] == "Z":
                break
        except ProcessLookupError:
            break
        hold.append(bytearray(b"w") * (4 << 20))
        time.sleep(0.04)
g = spawn(grow)
os.waitpid(g, 0)
os.waitpid(sib, 0)
"#;

fn out_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("outputs");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The scene recorded once for all the tests of this file.
fn recording() -> &'static Path {
    static REC: OnceLock<PathBuf> = OnceLock::new();
    require_root();
    REC.get_or_init(|| {
        let _g = serial();
        let rec = out_dir().join("scene.rec");
        let _ = std::fs::remove_file(&rec);
        let out = record(&rec, &["--memory-limit", "200M"], &[python(), "-c", SCENE]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "the trainer survives its sibling's kill"
        );
        rec
    })
}

/// `trainbpf report REC ARGS…`; its stdout.
fn report(rec: &Path, args: &[&str]) -> String {
    let out = Command::new(bin())
        .arg("report")
        .arg(rec)
        .args(args)
        .output()
        .expect("running trainbpf report");
    assert!(
        out.status.success(),
        "report {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 report")
}

/// The JSON's verdict: (victim comm, victim pid, top grower comm, pid).
fn verdict(json: &Value) -> (String, u64, String, u64) {
    let ks = kills(json);
    assert_eq!(ks.len(), 1, "one kill: {ks:#?}");
    let k = &ks[0];
    let top = &k["growers"][0];
    (
        k["victim"]["comm"].as_str().unwrap().to_string(),
        u(&k["victim"]["pid"]),
        top["comm"].as_str().expect("a top grower").to_string(),
        u(&top["pid"]),
    )
}

/// Acceptance: the terminal, HTML and Perfetto outputs name the victim and
/// the top grower that the JSON names.
#[test]
fn every_output_names_the_jsons_victim_and_top_grower() {
    let rec = recording();
    // One test at a time in the binary: chromium and the reports
    // would take the CPUs from another test's job.
    let _g = serial();
    let json: Value = serde_json::from_str(&report(rec, &["--format=json"])).unwrap();
    let (victim, victim_pid, top, top_pid) = verdict(&json);
    eprintln!("JSON: victim {victim} ({victim_pid}), top grower {top} ({top_pid})");
    assert_eq!(
        victim, "sacrifice",
        "the kernel killed the oom_score_adj 1000 sibling"
    );
    assert_eq!(json["kills"][0]["victim"]["oom_score_adj"], 1000);

    // Terminal: the story names both, and the chart marks them.
    let text = report(rec, &["--no-color"]);
    std::fs::write(out_dir().join("report.txt"), &text).unwrap();
    // The story is wrapped to the terminal's width, and a long cgroup path
    // (the job's cgroup sits below the recorder's) can break a phrase
    // across lines: read the words, not the line breaks.
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains(&format!("killed pid {victim_pid} ({victim})")),
        "{text}"
    );
    assert!(words.contains(&format!("{top} (pid {top_pid}, ")), "{text}");
    let victim_row = text
        .lines()
        .find(|l| l.contains("← victim") && l.contains(&victim_pid.to_string()))
        .unwrap_or_else(|| panic!("no chart row marks the victim:\n{text}"));
    assert!(victim_row.contains(&victim), "{victim_row}");
    let top_row = text
        .lines()
        .find(|l| l.contains("top grower") && l.contains(&top_pid.to_string()))
        .unwrap_or_else(|| panic!("no chart row marks the top grower:\n{text}"));
    assert!(top_row.contains(&top), "{top_row}");
    assert!(
        text.chars().any(|c| ('▁'..='█').contains(&c)),
        "sparklines: {text}"
    );
    assert!(text.contains("Whole run:"), "{text}");
    assert!(
        text.contains("pt_data_worker ×6"),
        "the six short-lived workers came and went: {text}"
    );
    assert!(!text.contains('\x1b'), "no colour when piped");

    // HTML: what the browser built, not just the file's bytes.
    let html = out_dir().join("report.html");
    let perfetto = out_dir().join("trace.json");
    report(
        rec,
        &[
            "--html",
            html.to_str().unwrap(),
            "--perfetto",
            perfetto.to_str().unwrap(),
        ],
    );
    let dom = headless(&html, &["--dump-dom".to_string()]);
    assert!(
        dom.contains(&format!("data-victim=\"{victim}\"")),
        "kill section names the victim"
    );
    assert!(dom.contains(&format!("data-top-grower=\"{top}\"")));
    assert!(dom.contains(&format!(
        "<b class=\"victim\">{victim} (pid {victim_pid})</b>"
    )));
    assert!(dom.contains(&format!("<b class=\"grower\">{top} (pid {top_pid})</b>")));

    // Perfetto: the kill's instant event.
    let trace: Value = serde_json::from_slice(&std::fs::read(&perfetto).unwrap()).unwrap();
    let kill = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["ph"] == "i")
        .expect("an instant event for the kill");
    assert_eq!(kill["args"]["victim_comm"], victim.as_str());
    assert_eq!(u(&kill["args"]["victim_pid"]), victim_pid);
    assert_eq!(kill["args"]["top_grower_comm"], top.as_str());
    assert_eq!(u(&kill["args"]["top_grower_pid"]), top_pid);
}

/// The HTML page in a real browser: a screenshot that is not blank, with
/// the kill marker and the victim in the rendered DOM.
#[test]
fn html_report_renders_in_headless_chromium() {
    let rec = recording();
    let _g = serial();
    let html = out_dir().join("page.html");
    report(rec, &["--html", html.to_str().unwrap()]);
    let page = std::fs::read_to_string(&html).unwrap();
    for banned in ["<script", "src=\"http", "href=\"http", "@import", "url("] {
        assert!(!page.contains(banned), "self-contained: found {banned}");
    }

    let png = out_dir().join("report.png");
    let _ = std::fs::remove_file(&png);
    headless(
        &html,
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1400,1000".to_string(),
        ],
    );
    eprintln!("screenshot: {}", png.display());
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(&png).expect("chromium wrote the screenshot"),
    ));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("PNG size")];
    let info = reader.next_frame(&mut buf).expect("PNG frame");
    assert_eq!((info.width, info.height), (1400, 1000));
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let px = &buf[..info.buffer_size()];
    let (mut ink, mut red) = (0usize, 0usize);
    let total = (info.width * info.height) as usize;
    for p in px.chunks(channels) {
        let (r, g, b) = (p[0] as i32, p[1] as i32, p[2] as i32);
        if r < 235 || g < 235 || b < 235 {
            ink += 1;
        }
        // The kill marker's red (#d62728).
        if r > 170 && g < 90 && b < 90 {
            red += 1;
        }
    }
    let share = ink as f64 / total as f64;
    eprintln!(
        "non-white: {:.1}% of pixels, kill red: {red} pixels",
        share * 100.0
    );
    assert!(share > 0.03, "the page is blank: {:.2}% ink", share * 100.0);
    assert!(red > 100, "no kill marker drawn ({red} red pixels)");

    let dom = headless(&html, &["--dump-dom".to_string()]);
    let json: Value = serde_json::from_str(&report(rec, &["--format=json"])).unwrap();
    let (victim, ..) = verdict(&json);
    assert!(
        dom.contains("class=\"kill-marker\""),
        "kill marker in the DOM"
    );
    assert!(dom.contains("✕ OOM kill 1"), "kill marker label");
    assert!(dom.contains(&victim), "victim named");
    assert!(dom.matches("<svg").count() >= 4, "run and window charts");
}

/// The Perfetto output against the trace-event format: a JSON object with
/// `traceEvents`, each event with the fields its phase requires.
#[test]
fn perfetto_trace_follows_the_trace_event_format() {
    let rec = recording();
    let _g = serial();
    let path = out_dir().join("format.json");
    report(rec, &["--perfetto", path.to_str().unwrap()]);
    let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).expect("valid JSON");
    let events = v
        .as_object()
        .expect("a JSON object")
        .get("traceEvents")
        .and_then(Value::as_array)
        .expect("traceEvents array");
    assert!(!events.is_empty());
    let mut counters = std::collections::HashMap::<u64, usize>::new();
    let mut names = std::collections::HashMap::<u64, String>::new();
    let mut instants = 0;
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no ph: {e}"));
        assert!(e["name"].is_string(), "name: {e}");
        let pid = e["pid"].as_u64().unwrap_or_else(|| panic!("pid: {e}"));
        assert!(e["tid"].is_u64(), "tid: {e}");
        let ts = e["ts"].as_f64().unwrap_or_else(|| panic!("ts: {e}"));
        assert!(ts >= 0.0, "{e}");
        match ph {
            "C" => {
                let args = e["args"].as_object().unwrap_or_else(|| panic!("args: {e}"));
                assert!(!args.is_empty(), "{e}");
                assert!(args.values().all(Value::is_number), "numeric args: {e}");
                *counters.entry(pid).or_default() += 1;
            }
            "M" => {
                let args = &e["args"];
                match e["name"].as_str().unwrap() {
                    "process_name" | "thread_name" => {
                        let n = args["name"].as_str().unwrap_or_else(|| panic!("{e}"));
                        names.insert(pid, n.to_string());
                    }
                    "process_sort_index" | "thread_sort_index" => {
                        assert!(args["sort_index"].is_i64(), "{e}")
                    }
                    "process_labels" => assert!(args["labels"].is_string(), "{e}"),
                    other => panic!("unknown metadata event {other}"),
                }
            }
            "i" | "I" => {
                assert!(
                    matches!(e["s"].as_str(), Some("g" | "p" | "t")),
                    "scope: {e}"
                );
                assert!(e["args"]["victim"].is_string(), "{e}");
                assert!(e["args"]["trigger"].is_string(), "{e}");
                instants += 1;
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    assert_eq!(instants, 1, "one kill, one instant");
    // Every counter track belongs to a named process; the system's memory
    // is one of them, and the victim and the top grower have RSS tracks.
    for pid in counters.keys() {
        assert!(names.contains_key(pid), "counter pid {pid} has no name");
    }
    assert!(names.values().any(|n| n.starts_with("system")), "{names:?}");
    let json: Value = serde_json::from_str(&report(rec, &["--format=json"])).unwrap();
    let (victim, victim_pid, top, top_pid) = verdict(&json);
    for (comm, pid) in [(victim, victim_pid), (top, top_pid)] {
        assert!(
            counters.contains_key(&pid),
            "{comm} ({pid}) has an RSS counter track"
        );
        // Job processes name their parent; a grower outside the job (a
        // compiler beside it) says so instead.
        let name = &names[&pid];
        assert!(
            name.starts_with(&format!("{comm} (pid {pid}) ← "))
                || name.starts_with(&format!("{comm} (pid {pid}) [outside the job]")),
            "{names:?}"
        );
    }
}

/// `report --json` on real recordings (a kill, and a job that just exits)
/// validates against docs/report.schema.json.
#[test]
fn json_report_matches_the_schema() {
    let rec = recording();
    let schema_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/report.schema.json");
    let schema: Value =
        serde_json::from_slice(&std::fs::read(&schema_path).unwrap()).expect("schema is JSON");
    let validator = jsonschema::draft202012::new(&schema).expect("a valid JSON Schema");

    let quiet = {
        let _g = serial();
        let rec = out_dir().join("quiet.rec");
        let out = record(&rec, &[], &["/bin/sh", "-c", "exit 3"]);
        assert_eq!(out.status.code(), Some(3));
        rec
    };
    for (rec, args) in [
        (rec, &[][..]),
        (rec, &["--window", "5s"][..]),
        (quiet.as_path(), &[][..]),
    ] {
        let mut full = vec!["--format=json"];
        full.extend_from_slice(args);
        let v: Value = serde_json::from_str(&report(rec, &full)).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&v)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{} {args:?} does not match the schema:\n{}",
            rec.display(),
            errors.join("\n")
        );
    }
    // The schema is not vacuous: a report missing a documented key fails.
    let mut v: Value = serde_json::from_str(&report(rec, &["--format=json"])).unwrap();
    v["kills"][0].as_object_mut().unwrap().remove("victim");
    assert!(!validator.is_valid(&v), "a kill without a victim must fail");
}
