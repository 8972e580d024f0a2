//! What reaches a terminal and what the root recorder runs:
//! names a job gives itself are escaped in every text output, and nothing
//! the environment names is run or loaded as root unless root alone
//! controls it.

use std::{
    os::unix::fs::{PermissionsExt as _, chown},
    path::Path,
    process::{Command, Output, Stdio},
};

use crate::support::*;

/// The name the job gives itself (PR_SET_NAME): an OSC that sets the
/// terminal's title, 11 bytes, within comm's 15.
const COMM: &str = "\x1b]0;pwned\x07";
/// How the text outputs must show it.
const COMM_ESCAPED: &str = "\\x1b]0;pwned\\x07";
/// How they must show its argument, which sets the title and clears the
/// screen.
const ARG_ESCAPED: &str = "\\x1b]2;argv\\x07\\x1b[2J";

/// Renames itself to [`COMM`], then grows 2 MiB every 50 ms (about 4 s to
/// a 160 MiB limit: time for the status line to be drawn).
const JOB: &str = r#"
import ctypes, time
ctypes.CDLL(None).prctl(15, b"\x1b]0;pwned\x07", 0, 0, 0)
hold = []
while True:
    hold.append(bytearray(b"x") * (2 << 20))
    time.sleep(0.05)
"#;

/// Every ESC in `out` must open a sequence trainbpf writes itself: the
/// status line's erase (`ESC [ 2 K`) or an SGR colour (`ESC [ digits m`).
/// Returns the offending sequences.
fn foreign_escapes(out: &[u8]) -> Vec<String> {
    let mut bad = Vec::new();
    for (i, _) in out.iter().enumerate().filter(|(_, b)| **b == 0x1b) {
        let rest = &out[i + 1..];
        let params = rest
            .iter()
            .skip(1)
            .take_while(|b| b.is_ascii_digit() || **b == b';')
            .count();
        let ours =
            rest.first() == Some(&b'[') && matches!(rest.get(1 + params), Some(b'm') | Some(b'K'));
        if !ours {
            bad.push(String::from_utf8_lossy(&rest[..rest.len().min(12)]).into_owned());
        }
    }
    bad
}

/// A process's name and arguments were printed raw in
/// the text report, the verdict and the status line, so a job could set
/// the terminal's title or clear the screen of whoever ran the recorder.
///
/// The job, started with an argument that sets the title and clears the
/// screen, renames itself to an OSC title sequence, and is OOM-killed in a --memory-limit. `record` runs on
/// a pseudo-terminal (`script`), so that the status line is drawn and the
/// verdict printed on it: no ESC but trainbpf's own erase and colour codes
/// and no BEL may reach it, and the escaped name must be on the status line
/// and in the verdict. `report`'s text must hold no control character but
/// line breaks, and show both the name and the argument escaped.
#[test]
fn process_names_are_escaped_in_every_text_output() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("sec-terminal");
    let job = dir.path("job.py");
    std::fs::write(&job, JOB).unwrap();
    let rec = dir.path("t.rec");
    // script runs the line with sh: printf makes the raw bytes.
    let cmd = format!(
        "{} record -o {} --memory-limit 160M -- {} {} \"$(printf '\\033]2;argv\\007\\033[2J')\"",
        bin().display(),
        rec.display(),
        python(),
        job.display()
    );
    let out = Command::new("/usr/bin/script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("COLUMNS", "200")
        .stdin(Stdio::null())
        .output()
        .expect("running record under script");
    let tty = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("--- record on a terminal: {}\n{tty:?}", out.status);
    assert_eq!(out.status.code(), Some(137), "the job was OOM-killed");

    let bad = foreign_escapes(&out.stdout);
    assert!(
        bad.is_empty(),
        "escape sequences from the job reached the terminal: {bad:?}"
    );
    assert!(!out.stdout.contains(&0x07), "a BEL reached the terminal");
    let verdict = tty
        .lines()
        // A kill elsewhere on the machine is reported too ("outside the
        // job"): the verdict line wanted is the job's own.
        .find(|l| l.contains("killed pid") && !l.contains("outside the job"))
        .unwrap_or_else(|| panic!("no verdict line in {tty:?}"));
    assert!(
        verdict.contains(&format!("({COMM_ESCAPED})")),
        "the verdict names the victim escaped: {verdict:?}"
    );
    // The status line, redrawn in place: `\r ESC[2K trainbpf 0:02 | … |
    // NAME(PID) +N MiB/s`.
    let status: Vec<&str> = tty
        .split(['\r', '\n'])
        .filter(|s| s.contains("trainbpf 0:0"))
        .collect();
    assert!(!status.is_empty(), "the status line was drawn: {tty:?}");
    assert!(
        status
            .iter()
            .any(|s| s.contains(&format!("{COMM_ESCAPED}("))),
        "the status line names the grower escaped: {status:?}"
    );

    let r = report_json(&rec);
    assert_eq!(
        r["kills"][0]["victim"]["comm"], COMM,
        "the recording keeps the name as the kernel gave it"
    );
    let out = Command::new(bin())
        .arg("report")
        .arg(&rec)
        .env("COLUMNS", "200")
        .output()
        .expect("running trainbpf report");
    assert!(out.status.success(), "{}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("--- report:\n{text}");
    let raw: Vec<u8> = out
        .stdout
        .iter()
        .copied()
        .filter(|b| (*b < 0x20 && *b != b'\n') || *b == 0x7f)
        .collect();
    assert!(raw.is_empty(), "control bytes {raw:?} in the report");
    assert!(
        text.contains(&format!(
            "victim      pid {}",
            r["kills"][0]["victim"]["pid"]
        )) && text.contains(COMM_ESCAPED),
        "the victim is named escaped"
    );
    assert!(
        text.lines().next().unwrap_or("").contains(ARG_ESCAPED),
        "the title shows the job's argv escaped"
    );
}

/// A file or directory that belongs to `nobody`, as a local user's would.
fn give_to_nobody(p: &Path) {
    chown(p, Some(65534), Some(65534)).unwrap();
}

fn run_logged(what: &str, c: &mut Command) -> Output {
    let out = c.stdin(Stdio::null()).output().expect(what);
    eprintln!(
        "--- {what}: {}\n--- stdout:\n{}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The root recorder dlopened `$TRAINBPF_LIBNVML`
/// and ran `ldconfig` and `nvidia-smi` through `PATH`, so whatever the
/// environment named ran as root.
///
/// A local user's directory holds an NVML whose constructor writes a
/// marker, and `ldconfig` and `nvidia-smi` scripts that write markers; it
/// comes first in PATH. `record` and `doctor`, run as root with that
/// environment, must write no marker, and must name the refused library.
/// A second library, root's but writable by everyone (0666), is refused
/// too.
#[test]
fn helpers_and_libraries_the_environment_names_do_not_run_as_root() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("sec-helpers");
    let markers = dir.path("markers");
    std::fs::create_dir(&markers).unwrap();
    std::fs::set_permissions(&markers, std::fs::Permissions::from_mode(0o777)).unwrap();
    let user = dir.path("user");
    let bin_dir = user.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();

    let src = dir.path("nvml.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n\
             __attribute__((constructor)) static void mark(void) {{\n\
             FILE *f = fopen(\"{}/nvml\", \"w\"); if (f) fclose(f); }}\n\
             int nvmlInit_v2(void) {{ return 0; }}\n",
            markers.display()
        ),
    )
    .unwrap();
    let lib = user.join("libnvidia-ml.so.1");
    cc_shared(&src, &lib);
    // Root's own copy, but anyone may rewrite it.
    let open_lib = dir.path("libnvidia-ml-0666.so.1");
    std::fs::copy(&lib, &open_lib).unwrap();
    std::fs::set_permissions(&open_lib, std::fs::Permissions::from_mode(0o666)).unwrap();

    for helper in ["ldconfig", "nvidia-smi"] {
        let p = bin_dir.join(helper);
        std::fs::write(
            &p,
            format!("#!/bin/sh\n: > {}/{helper}\n", markers.display()),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        give_to_nobody(&p);
    }
    for p in [&lib, &bin_dir, &user] {
        give_to_nobody(p);
    }
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let rec = dir.path("h.rec");
    let out = run_logged(
        "trainbpf record",
        Command::new(bin())
            .args(["record", "-o"])
            .arg(&rec)
            .args(["--", "/bin/true"])
            .env("PATH", &path)
            .env("TRAINBPF_LIBNVML", &lib)
            .env_remove("LD_LIBRARY_PATH"),
    );
    let doctor = run_logged(
        "trainbpf doctor",
        Command::new(bin())
            .arg("doctor")
            .env("PATH", &path)
            .env("TRAINBPF_LIBNVML", &open_lib)
            .env_remove("LD_LIBRARY_PATH"),
    );

    let ran: Vec<String> = std::fs::read_dir(&markers)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(ran.is_empty(), "ran as root from the environment: {ran:?}");

    assert_eq!(out.status.code(), Some(0), "record still records");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: TRAINBPF_LIBNVML names {}, which root will not load",
            lib.display()
        )) && stderr.contains("is owned by uid 65534, not root"),
        "record names the refused library and why: {stderr}"
    );
    let r = report_json(&rec);
    let nvml = r["gpu"]["sources"]
        .as_array()
        .expect("gpu sources")
        .iter()
        .find(|s| s["source"] == "nvml")
        .expect("the NVML source is reported");
    assert_eq!(nvml["used"], false);
    assert!(
        nvml["detail"]
            .as_str()
            .unwrap()
            .contains("TRAINBPF_LIBNVML names"),
        "the recording keeps the refusal: {nvml}"
    );

    assert!(doctor.status.success(), "{}", doctor.status);
    let text = String::from_utf8_lossy(&doctor.stdout);
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("helpers"))
        .unwrap_or_else(|| panic!("no helpers check in\n{text}"));
    assert!(line.starts_with("warn "), "{line}");
    assert!(
        line.contains(&format!("TRAINBPF_LIBNVML names {}", open_lib.display()))
            && line.contains("can be written by every user"),
        "doctor names the refused library and why: {line}"
    );
}
