//! A leaf that sets up no frame of its own (glibc's `memcpy`): the
//! frame-pointer walk starts at its caller's caller. A growth stack is
//! unwound by the files' unwind tables from a copy of the stack, and the
//! stack at death takes the caller from the top of the stack; each frame
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
    build_c(dir, name, COPY_C, flags)
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
        text.contains(&format!("did not fit, in grow_here ({name}.c:{line})")),
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
            .ends_with(&format!("{name}.c:{line} in grow_here")),
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
    assert_eq!(f[1]["found"], "unwind table", "{s}");
    let copy_line = COPY_C.lines().position(|l| l.contains("COPY")).unwrap() as u64 + 1;
    assert_eq!(u(&f[1]["line"]), copy_line, "{s}");
    assert_eq!(function(&s, 2), "step", "{s}");
    assert_eq!(f[2]["found"], "unwind table", "{s}");
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
    let (s, death) = heaviest(&["-O2", "-fomit-frame-pointer"], "leaf-o2");
    assert!(function(&s, 0).contains("mem"), "the copy itself: {s}");
    // Every caller, by the unwind tables: the frame-pointer walk alone
    // had `memcpy` and nothing after it.
    for (i, name) in [(1, "grow_here"), (2, "step"), (3, "main")] {
        assert_eq!(function(&s, i), name, "{s}");
        assert_eq!(s["frames"][i]["found"], "unwind table", "{s}");
    }
    // The stack at death, by frame pointers and the stack's top: the
    // caller of the leaf at least.
    eprintln!("at death: {death}");
    assert_eq!(function(&death, 1), "grow_here", "{death}");
}

/// The file range and header offset of section `name` in a 64-bit ELF.
fn section(elf: &[u8], name: &str) -> (usize, usize, usize) {
    let rd = |at: usize, n: usize| -> u64 {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&elf[at..at + n]);
        u64::from_le_bytes(b)
    };
    let (shoff, shentsize, shnum, shstrndx) = (
        rd(0x28, 8) as usize,
        rd(0x3a, 2) as usize,
        rd(0x3c, 2) as usize,
        rd(0x3e, 2) as usize,
    );
    let strtab = rd(shoff + shstrndx * shentsize + 0x18, 8) as usize;
    (0..shnum)
        .map(|i| shoff + i * shentsize)
        .find(|&h| {
            let at = strtab + rd(h, 4) as usize;
            elf[at..].split(|&b| b == 0).next() == Some(name.as_bytes())
        })
        .map(|h| (rd(h + 0x18, 8) as usize, rd(h + 0x20, 8) as usize, h))
        .unwrap_or_else(|| panic!("no {name} section"))
}

/// A job whose program's unwind tables are hostile, as a job can make
/// them: the kernel runs a program by its segments, and never looks at
/// the sections the unwinder reads. One claims a 2 GiB `.eh_frame`; in
/// another the tables are garbage. Each recording completes with its kill
/// and its growth stacks; the refused file is counted and named, and its
/// stacks fall back to frame pointers.
#[test]
fn hostile_unwind_tables_cost_frames_never_the_recording() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("leaf-hostile");
    let exe = build(&dir, "leaf-hostile", &["-O0", "-fno-omit-frame-pointer"]);
    let elf = std::fs::read(&exe).unwrap();
    let mut big = elf.clone();
    let (_, _, h) = section(&elf, ".eh_frame");
    big[h + 0x20..h + 0x28].copy_from_slice(&(2u64 << 30).to_le_bytes());
    let mut junk = elf.clone();
    for name in [".eh_frame", ".eh_frame_hdr"] {
        let (at, size, _) = section(&elf, name);
        for (i, b) in junk[at..at + size].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(0x9d) ^ 0xa5;
        }
    }
    for (name, bytes, refused) in [("big", big, true), ("junk", junk, false)] {
        let path = dir.path(name);
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let rec = dir.path(&format!("{name}.rec"));
        let out = record(
            &rec,
            &["--memory-limit", "64M", "-q"],
            &[path.to_str().unwrap()],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("killed"), "{name}: no kill: {stderr}");
        let r = report_json(&rec);
        let top = &job_kill(&r)["growers"][0];
        let heavy = &top["stacks"][0];
        eprintln!("{name}: heaviest stack {heavy}");
        assert!(u(&heavy["kb"]) >= 32 << 10, "{name}: {heavy}");
        assert!(function(heavy, 0).contains("mem"), "{name}: {heavy}");
        let reads = &r["job_reads"];
        if refused {
            assert!(u(&reads["unwind_refused"]) >= 1, "{reads}");
            let notes = reads["notes"].to_string();
            assert!(
                notes.contains("/big: unwind tables not read") && notes.contains("over the 64 MiB"),
                "{notes}"
            );
            // glibc's tables still unwind its memcpy; past it, in the
            // refused file, frame pointers.
            assert_eq!(function(heavy, 1), "grow_here", "{heavy}");
            assert_eq!(heavy["frames"][1]["found"], "unwind table", "{heavy}");
            assert_eq!(function(heavy, 2), "step", "{heavy}");
            assert_eq!(heavy["frames"][2]["found"], "frame pointer", "{heavy}");
        }
    }
}
