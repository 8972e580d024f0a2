//! "files written as root": `sudo trainbpf` must not let the user
//! who ran it, nor their job, turn the root recorder's file writes against
//! the machine. Each test plays the attacker of one finding: the recorder
//! runs as root with `SUDO_UID`/`SUDO_GID` naming nobody (65534), in a
//! directory nobody owns, and root-owned files stand in for the machine's.

use std::{
    ffi::OsStr,
    io::Read as _,
    os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use crate::support::*;

const NOBODY: u32 = 65534;

/// A directory the unprivileged user owns: where they (and their job) may
/// plant links.
fn users_dir(tag: &str) -> TempDir {
    let d = TempDir::new(tag);
    std::os::unix::fs::chown(&d.0, Some(NOBODY), Some(NOBODY)).unwrap();
    d
}

/// A root-owned file standing in for one of the machine's.
fn roots_file(path: &Path, content: &str) {
    std::fs::write(path, content).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

fn assert_untouched(path: &Path, content: &str) {
    let m = std::fs::symlink_metadata(path).unwrap();
    assert!(m.is_file(), "{} is still a regular file", path.display());
    assert_eq!(
        (m.uid(), m.gid(), m.mode() & 0o7777),
        (0, 0, 0o644),
        "{} keeps its owner and mode",
        path.display()
    );
    let now = std::fs::read_to_string(path).unwrap();
    assert!(
        now == content,
        "{} keeps its content; it holds {} bytes: {:?}",
        path.display(),
        now.len(),
        now.chars().take(80).collect::<String>()
    );
}

/// `sudo trainbpf record` as nobody: root, with SUDO_UID/SUDO_GID set.
fn as_nobody(cwd: &Path, args: &[&OsStr]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .env("SUDO_UID", NOBODY.to_string())
        .env("SUDO_GID", NOBODY.to_string())
        .current_dir(cwd)
        .stdin(Stdio::null());
    c
}

fn output(mut c: Command, what: &str) -> Output {
    let out = c.output().unwrap();
    eprintln!(
        "--- {what}: {}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn record_as_nobody(cwd: &Path, rec: &Path, extra: &[&str], cmd: &[&str]) -> Output {
    let mut args: Vec<&OsStr> = vec!["record".as_ref(), "-o".as_ref(), rec.as_os_str()];
    args.extend(extra.iter().map(OsStr::new));
    args.push("--".as_ref());
    args.extend(cmd.iter().map(OsStr::new));
    output(as_nobody(cwd, &args), &format!("record {cmd:?} as nobody"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `record -o PATH` followed a link the user planted
/// and handed its target to them (truncated, chmod 0600, chown SUDO_UID),
/// and created files as root in directories the user cannot write.
#[test]
fn record_output_follows_no_link_and_creates_only_where_the_user_may() {
    require_root();
    let _g = serial();
    let home = users_dir("sec-f1");
    let vault = TempDir::new("sec-f1-root");
    let target = vault.path("shadow");
    roots_file(&target, "root's own file\n");
    std::os::unix::fs::symlink(&target, home.path("rec")).unwrap();

    let out = record_as_nobody(&home.0, &home.path("rec"), &["--quiet"], &["true"]);
    assert_untouched(&target, "root's own file\n");
    assert!(!out.status.success(), "a link at -o is refused");
    assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));

    // As `-o /etc/ld.so.preload`: a directory only root may write.
    let preload = vault.path("ld.so.preload");
    let out = record_as_nobody(&home.0, &preload, &["--quiet"], &["true"]);
    assert!(
        !preload.exists(),
        "no file is created where the user could not create one"
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("as uid 65534") && stderr(&out).contains("ermission denied"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_dir(&vault.0).unwrap().count(), 1);
}

/// Five processes filling and freeing 8 MiB every 5 ms (about 160 KB of
/// memory records a second) until the recording `rec` is replaced by its
/// compaction (a new inode at the name), or argv[1] seconds.
const CHURN: &str = r#"
import mmap, os, sys, time
dur = float(sys.argv[1])
start = time.time()
first = os.lstat("rec").st_ino
fill = b"x" * (8 << 20)
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        kids = []
        break
    kids.append(pid)
while time.time() - start < dur and os.lstat("rec").st_ino == first:
    m = mmap.mmap(-1, 8 << 20)
    m[:] = fill
    m.close()
    time.sleep(0.005)
for k in kids:
    os.waitpid(k, 0)
"#;

/// The compaction file `PATH.compacting-N` was opened
/// like the output: the job itself planted links there while the recording
/// ran, and root truncated and chowned their targets.
#[test]
fn compaction_files_follow_no_link_the_job_planted() {
    require_root();
    let _g = serial();
    let home = users_dir("sec-f2");
    let vault = TempDir::new("sec-f2-root");
    let mut plant = String::new();
    for n in 0..8 {
        let t = vault.path(&format!("file{n}"));
        roots_file(&t, &format!("root's file {n}\n"));
        plant.push_str(&format!("ln -s {} rec.compacting-{n}; ", t.display()));
    }
    let script = format!("{plant}exec {} -c \"$0\" 60", python());
    let out = record_as_nobody(
        &home.0,
        &home.path("rec"),
        &["--quiet", "--max-size", "1M", "--full-span", "2s"],
        &["/bin/sh", "-c", &script, CHURN],
    );
    for n in 0..8 {
        assert_untouched(
            &vault.path(&format!("file{n}")),
            &format!("root's file {n}\n"),
        );
    }
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("recording compacted"),
        "a compaction ran: {}",
        stderr(&out)
    );
    let m = std::fs::symlink_metadata(home.path("rec")).unwrap();
    assert!(
        m.is_file() && m.uid() == NOBODY,
        "the recording is nobody's file"
    );
    report_json(&home.path("rec"));
}

/// An existing output file was reused in place. A
/// user who pre-created the default `trainbpf.rec` in a shared directory
/// and held it open read the whole recording, command line included.
#[test]
fn a_precreated_output_is_never_written_in_place() {
    require_root();
    let _g = serial();
    let shared = TempDir::new("sec-f3");
    std::fs::set_permissions(&shared.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
    // Another local user (uid 4242) plants the default name and keeps it open.
    let planted = shared.path("trainbpf.rec");
    std::fs::write(&planted, b"").unwrap();
    std::os::unix::fs::chown(&planted, Some(4242), Some(4242)).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut spy = std::fs::File::open(&planted).unwrap();

    let mut args: Vec<&OsStr> = vec!["record".as_ref(), "--quiet".as_ref(), "--".as_ref()];
    args.extend(
        ["/bin/sh", "-c", "exit 0", "sh", "--token=hunter2-secret"]
            .iter()
            .map(OsStr::new),
    );
    let out = output(as_nobody(&shared.0, &args), "record in a shared directory");
    let mut seen = Vec::new();
    spy.read_to_end(&mut seen).unwrap();
    let seen = String::from_utf8_lossy(&seen);
    assert!(
        !seen.contains("hunter2"),
        "the planted file's holder reads {} bytes of the recording",
        seen.len()
    );
    let m = std::fs::symlink_metadata(&planted).unwrap();
    assert_eq!(m.uid(), 4242, "the planted file stays its owner's");
    assert!(!out.status.success(), "refused: not the user's file");
    assert!(
        stderr(&out).contains("belongs to uid 4242"),
        "{}",
        stderr(&out)
    );
}

/// `report --html/--perfetto PATH` wrote `PATH.tmp`
/// through a planted link (root overwrote its target) and renamed a new
/// file over a device node (`--perfetto /dev/null` replaced /dev/null).
#[test]
fn report_outputs_follow_no_link_and_write_through_devices() {
    require_root();
    let _g = serial();
    let home = users_dir("sec-f4");
    let vault = TempDir::new("sec-f4-root");
    let rec = home.path("r.rec");
    let out = record_as_nobody(&home.0, &rec, &["--quiet"], &["true"]);
    assert!(out.status.success());

    let target = vault.path("passwd");
    roots_file(&target, "root's own file\n");
    std::os::unix::fs::symlink(&target, home.path("out.html.tmp")).unwrap();
    // A null device, as /dev/null (which the old code replaced).
    let null = home.path("null");
    let c = std::ffi::CString::new(null.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; makedev(1, 3) is the null device.
    assert_eq!(
        unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) },
        0
    );
    std::fs::set_permissions(&null, std::fs::Permissions::from_mode(0o666)).unwrap();
    let args: Vec<&OsStr> = vec![
        "report".as_ref(),
        rec.as_os_str(),
        "--html".as_ref(),
        "out.html".as_ref(),
        "--perfetto".as_ref(),
        null.as_os_str(),
    ];
    let out = output(as_nobody(&home.0, &args), "report --html --perfetto");
    assert_untouched(&target, "root's own file\n");
    let m = std::fs::symlink_metadata(&null).unwrap();
    assert!(
        m.file_type().is_char_device() && m.rdev() == libc::makedev(1, 3),
        "the device stays a device: {:?}",
        m.file_type()
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let html = std::fs::symlink_metadata(home.path("out.html")).unwrap();
    assert!(
        html.is_file() && html.uid() == NOBODY,
        "the page is the user's"
    );
}

/// A recording whose job's process is named `tbpfsecret`, readable by
/// root alone.
fn secret_recording(vault: &TempDir) -> PathBuf {
    let exe = vault.path("tbpfsecret");
    std::fs::copy("/bin/sh", &exe).unwrap();
    let rec = vault.path("secret.rec");
    let out = record(&rec, &["--quiet"], &[exe.to_str().unwrap(), "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tbpfsecret"),
        "the verdict names the secret job"
    );
    std::fs::set_permissions(&vault.0, std::fs::Permissions::from_mode(0o700)).unwrap();
    rec
}

/// The end-of-run verdict re-read the recording by
/// its path, as root. A job that swapped it for a link made root print
/// another file's content; a FIFO there hung the recorder forever.
#[test]
fn the_verdict_reads_the_recorders_own_file_not_the_path() {
    require_root();
    let _g = serial();
    let home = users_dir("sec-f5");
    let vault = TempDir::new("sec-f5-root");
    let secret = secret_recording(&vault);

    let swap = format!("rm -f rec; ln -s {} rec; exit 5", secret.display());
    let out = record_as_nobody(
        &home.0,
        &home.path("rec"),
        &["--quiet"],
        &["/bin/sh", "-c", &swap],
    );
    assert!(
        !stderr(&out).contains("tbpfsecret"),
        "root printed another file's verdict: {}",
        stderr(&out)
    );
    assert_eq!(out.status.code(), Some(5));
    assert!(
        stderr(&out).contains("exited with code 5"),
        "the verdict is the job's own"
    );

    // A FIFO in its place: the recorder still ends, with its verdict.
    let mut args: Vec<&OsStr> = vec!["record".as_ref(), "--quiet".as_ref(), "-o".as_ref()];
    args.extend(
        [
            "fifo.rec",
            "--",
            "/bin/sh",
            "-c",
            "rm -f fifo.rec; mkfifo fifo.rec; exit 6",
        ]
        .map(OsStr::new),
    );
    let mut c = as_nobody(&home.0, &args);
    let mut child = c.stderr(Stdio::piped()).spawn().unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("the recorder hung on a FIFO at its output path for 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    eprintln!("--- record with a FIFO swapped in: {status}\n{err}");
    assert_eq!(status.code(), Some(6));
    assert!(
        err.contains("trainbpf: job"),
        "the verdict is printed: {err}"
    );
}

/// Two recorders given the same `-o` interleaved into
/// one file, and one printed the other's verdict.
#[test]
fn a_second_recorder_on_the_same_output_refuses() {
    require_root();
    let _g = serial();
    let home = users_dir("sec-f6");
    let rec = home.path("rec");
    let mut first = spawn_until(
        &[
            "record".as_ref(),
            "--quiet".as_ref(),
            "-o".as_ref(),
            rec.as_os_str(),
            "--".as_ref(),
            "sleep".as_ref(),
            "4".as_ref(),
        ],
        "trainbpf: recording to",
    );
    let second = record(&rec, &["--quiet"], &["true"]);
    let st = first.wait().unwrap();
    assert!(st.success(), "the first recorder ends as its job: {st}");
    assert!(!second.status.success(), "the second recorder refuses");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("another trainbpf record is writing"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let r = report_json(&rec);
    let argv = r["job"]["argv"].to_string();
    assert!(argv.contains("sleep"), "the first job's recording: {argv}");
}
