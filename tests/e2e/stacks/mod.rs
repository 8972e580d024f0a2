//! Growth stacks (`record --stacks`), end to end: a C program built with
//! frame pointers grows through `grow_here()` under a memory limit until
//! the kernel kills it; the report names that function, its file and the
//! line that touched the pages.

use std::process::Command;

use crate::support::*;
use serde_json::Value;

fn frame_names(stack: &Value) -> String {
    stack["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| format!("{}:{} in {}", f["file"], f["line"], f["function"]))
        .collect::<Vec<_>>()
        .join(" <- ")
}

#[test]
fn the_heaviest_native_stack_names_grow_here_and_its_line() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("stacks");
    let exe = build_grow_c(&dir);
    let rec = dir.path("s.rec");
    let out = record(
        &rec,
        &["--memory-limit", "64M", "-q"],
        &[exe.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("killed"), "no kill: {stderr}");
    let r = report_json(&rec);
    let k = job_kill(&r);
    let top = &k["growers"][0];
    assert_eq!(top["victim"], true, "{top}");
    let pid = u(&top["pid"]);
    let stacks = top["stacks"].as_array().expect("growers[].stacks");
    assert!(!stacks.is_empty(), "no stacks for the top grower: {top}");
    let heavy = &stacks[0];
    eprintln!(
        "heaviest stack: {} kB, {} (note: {})",
        heavy["kb"],
        frame_names(heavy),
        heavy["error"]
    );
    let f0 = &heavy["frames"][0];
    assert_eq!(f0["function"], "grow_here", "{}", frame_names(heavy));
    assert_eq!(f0["kind"], "native");
    assert!(
        f0["file"].as_str().is_some_and(|f| f.ends_with("grow.c")),
        "{f0}"
    );
    assert_eq!(u(&f0["line"]), grow_c_touch_line(), "{f0}");
    // Its callers follow, innermost first.
    assert_eq!(
        heavy["frames"][1]["function"],
        "step",
        "{}",
        frame_names(heavy)
    );
    assert_eq!(
        heavy["frames"][2]["function"],
        "main",
        "{}",
        frame_names(heavy)
    );
    // It took most of what the process grew (the limit is 64 MiB; libc's
    // own start-up and the exec before are the rest).
    let kb = u(&heavy["kb"]);
    assert!(kb >= 40 << 10, "grow_here's stack holds only {kb} kB");
    assert!(u(&heavy["count"]) >= 40, "{heavy}");

    // The whole run's stacks of the process say the same.
    let p = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| u(&p["pid"]) == pid)
        .expect("the process in processes[]");
    assert_eq!(p["stacks"][0]["frames"][0]["function"], "grow_here");
    assert!(u(&p["stacks"][0]["kb"]) >= kb);

    // The victim's stack at death: the allocating thread, killed inside
    // grow_here, named (from the live process or its growth stacks').
    let d = &k["victim"]["stack_at_death"];
    eprintln!("at death: {d}");
    assert_eq!(d["trigger"], true, "{d}");
    assert_eq!(d["signal"], 9, "{d}");
    assert_eq!(u(&d["tid"]), pid, "{d}");
    assert_eq!(d["frames"][0]["function"], "grow_here", "{d}");
    assert!(
        d["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["function"] == "main"),
        "{d}"
    );

    // The text report: under the kill's growers, and `report --stacks`.
    let want = format!("grow.c:{} in grow_here", grow_c_touch_line());
    for extra in [&[][..], &["--stacks"][..]] {
        let text = Command::new(bin())
            .arg("report")
            .arg(&rec)
            .args(extra)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(
            text.contains(&want),
            "report {extra:?} lacks {want:?}:\n{text}"
        );
    }

    // The HTML page: the kill's flame graph and the whole run's each have
    // a frame titled `grow_here` with its file and line, as the browser
    // builds the page.
    let html = dir.path("s.html");
    let out = Command::new(bin())
        .arg("report")
        .arg(&rec)
        .arg("--html")
        .arg(&html)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(!page.contains("<script"), "self-contained");
    let dom = headless(&html, &["--dump-dom".to_string()]);
    assert_eq!(dom.matches("<svg class=\"flame\"").count(), 2, "{dom}");
    // The touching line's frame, once in each graph. (A stack taken
    // inside malloc, unwound by the tables, has grow_here too, at the
    // call's line: a frame of its own.)
    let touch = format!("grow.c:{}\n", grow_c_touch_line());
    let titled: Vec<&str> = dom
        .split("<g class=\"f\">")
        .filter(|g| g.starts_with("<title>grow_here\n") && g.contains(&touch))
        .collect();
    assert_eq!(titled.len(), 2, "a grow_here frame in each graph: {dom}");
    for g in titled {
        eprintln!(
            "flame frame: {}",
            g.lines().take(3).collect::<Vec<_>>().join(" | ")
        );
        assert!(
            g.contains(&format!("grow.c:{}\n", grow_c_touch_line())),
            "{g}"
        );
        assert!(g.contains("<rect"), "{g}");
    }
    let kill = &dom[dom.find("id=\"kill-1\"").unwrap()..];
    assert!(kill.find("<svg class=\"flame\"") < kill.find("id=\"stacks\""));
}

#[test]
fn without_stacks_nothing_is_taken() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("nostacks");
    let exe = build_grow_c(&dir);
    let rec = dir.path("n.rec");
    record(
        &rec,
        &["--no-stacks", "--memory-limit", "32M", "-q"],
        &[exe.to_str().unwrap()],
    );
    let r = report_json(&rec);
    let top = &job_kill(&r)["growers"][0];
    assert_eq!(top["stacks"], Value::Array(vec![]), "{top}");
    assert!(
        r["processes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["stacks"] == Value::Array(vec![]))
    );
    assert_eq!(r["lost"]["stack_errors"], 0);
    let v = &job_kill(&r)["victim"];
    assert!(
        v["stack_at_death"].is_null() && v["stack_error"].is_null(),
        "{v}"
    );
    // The page has no flame graph, and says how to get one.
    let html = dir.path("n.html");
    let out = Command::new(bin())
        .arg("report")
        .arg(&rec)
        .arg("--html")
        .arg(&html)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(!page.contains("class=\"flame\""));
    assert!(page.contains("made with <code>--no-stacks</code>"));
}

/// A Python job that keeps 1 MiB more in `leak_step` every `sleep_s`
/// seconds, until its limit.
fn leak_py(sleep_s: &str) -> String {
    format!(
        "import time
keep = []
def leak_step():
    keep.append(b'x' * (1 << 20))
while True:
    leak_step()
    time.sleep({sleep_s})
"
    )
}

mod leaf;
mod namer;
mod two;
