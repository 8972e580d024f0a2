//! A leaf that sets up no frame of its own (glibc's `memcpy`): the
//! frame-pointer walk starts at its caller's caller, so the function that
//! called it is taken from the top of the stack instead, and each frame
//! says how it was found. Built with frame pointers, and as pip wheels are
//! built (`-O2 -fomit-frame-pointer`).

use std::path::PathBuf;
use std::process::Command;

use crate::support::*;
use serde_json::Value;

/// Grows through `memcpy` called from `grow_here`; nothing after the call
/// may let the compiler turn it into a tail call (a jump, which leaves no
/// return address into `grow_here` at all).
const COPY_C: &str = r#"#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK (1 << 20)
static char src[CHUNK];
volatile char sink;

__attribute__((noinline, noclone)) char *grow_here(size_t n) {
    char *p = malloc(n);
    memcpy(p, src, n); /* COPY */
    sink = p[n - 1];
    return p;
}

__attribute__((noinline, noclone)) void step(void) {
    grow_here(CHUNK);
    usleep(5000);
}

int main(void) {
    memset(src, 1, CHUNK);
    for (;;)
        step();
}
"#;

fn build(dir: &TempDir, name: &str, flags: &[&str]) -> PathBuf {
    let src = dir.path("copy.c");
    std::fs::write(&src, COPY_C).unwrap();
    let exe = dir.path(name);
    let cc = Command::new("/usr/bin/cc")
        .args(flags)
        .args(["-g", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("running /usr/bin/cc");
    assert!(
        cc.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    exe
}

/// The heaviest growth stack of the killed job's top grower, and the
/// victim's stack at death.
fn heaviest(flags: &[&str], name: &str) -> (Value, Value) {
    let dir = TempDir::new(name);
    let exe = build(&dir, name, flags);
    let rec = dir.path("l.rec");
    let out = record(
        &rec,
        &["--memory-limit", "64M", "-q"],
        &[exe.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("killed"), "no kill: {stderr}");
    let r = report_json(&rec);
    let death = job_kill(&r)["victim"]["stack_at_death"].clone();
    let top = &job_kill(&r)["growers"][0];
    assert_eq!(top["victim"], true, "{top}");
    let heavy = top["stacks"][0].clone();
    eprintln!("{name}: heaviest stack {heavy}");
    assert!(
        u(&heavy["kb"]) >= 32 << 10,
        "most of the growth is the copy's: {heavy}"
    );
    // The text leads with the job's own line: the kill's "Most likely"
    // cites it, and the stack under the growers starts there, with the
    // copy named as what ran inside it.
    let text = Command::new(bin())
        .arg("report")
        .arg(&rec)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).replace("\n               ", " ");
    eprintln!("{text}");
    let line = COPY_C.lines().position(|l| l.contains("COPY")).unwrap() + 1;
    assert!(
        text.contains(&format!("did not fit, in grow_here (copy.c:{line})")),
        "the verdict cites grow_here:\n{text}"
    );
    let led = text
        .split("Where the top growers' memory came from")
        .nth(1)
        .expect("growers' stacks in the text");
    // After the section's, the grower's and the stack's headings, and a
    // note (`[...]`) where the stack has one.
    let first = led
        .lines()
        .skip(3)
        .find(|l| !l.trim().starts_with('['))
        .unwrap_or("");
    assert!(
        first
            .trim()
            .ends_with(&format!("copy.c:{line} in grow_here")),
        "the stack starts at grow_here: {first:?}\n{led}"
    );
    assert!(led.contains("(inside it: __mem"), "{led}");
    (heavy, death)
}

fn function(stack: &Value, i: usize) -> &str {
    stack["frames"][i]["function"].as_str().unwrap_or("")
}

#[test]
fn a_frameless_memcpy_keeps_its_caller_with_frame_pointers() {
    require_root();
    let _g = serial();
    let (s, death) = heaviest(&["-O0", "-fno-omit-frame-pointer"], "leaf-fp");
    let f = &s["frames"];
    assert!(function(&s, 0).contains("mem"), "the copy itself: {s}");
    assert_eq!(f[0]["found"], "ip", "{s}");
    assert_eq!(function(&s, 1), "grow_here", "{s}");
    assert_eq!(f[1]["found"], "stack pointer", "{s}");
    let copy_line = COPY_C.lines().position(|l| l.contains("COPY")).unwrap() as u64 + 1;
    assert_eq!(u(&f[1]["line"]), copy_line, "{s}");
    assert_eq!(function(&s, 2), "step", "{s}");
    assert_eq!(f[2]["found"], "frame pointer", "{s}");
    assert_eq!(function(&s, 3), "main", "{s}");
    // Killed inside the copy: its stack at death keeps grow_here too.
    eprintln!("at death: {death}");
    assert!(function(&death, 0).contains("mem"), "{death}");
    assert_eq!(function(&death, 1), "grow_here", "{death}");
    assert_eq!(death["frames"][1]["found"], "stack pointer", "{death}");
    assert_eq!(function(&death, 2), "step", "{death}");
}

#[test]
fn a_frameless_memcpy_keeps_its_caller_without_frame_pointers() {
    require_root();
    let _g = serial();
    let (s, _) = heaviest(&["-O2", "-fomit-frame-pointer"], "leaf-o2");
    assert!(function(&s, 0).contains("mem"), "the copy itself: {s}");
    assert_eq!(function(&s, 1), "grow_here", "{s}");
    assert_eq!(s["frames"][1]["found"], "stack pointer", "{s}");
}
