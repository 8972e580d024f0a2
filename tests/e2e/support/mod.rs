//! What the end-to-end tests share.
//!
//! These tests run the real `trainbpf` binary as root against the real
//! kernel: real child processes, real memory cgroups, real OOM kills. They
//! never skip: without root they fail and say how to run them.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::{Mutex, MutexGuard},
};

use serde_json::Value;

/// The test's own memory cgroup.
mod cgroup;
pub use cgroup::Cg;
/// A FUSE filesystem whose reads are never answered.
mod stall_fs;
pub use stall_fs::StallFs;

/// OOM kills, dmesg and recording sizes are machine-wide: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        panic!(
            "this privileged test needs root (euid is {euid}); run the suite with `cargo xtask test` (it re-runs itself with sudo when not root). It does not skip."
        );
    }
}

/// The trainbpf binary: `TRAINBPF_BIN` (set by `cargo xtask test`), else the
/// workspace's debug build.
pub fn bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TRAINBPF_BIN") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/trainbpf");
    assert!(
        p.exists(),
        "{} not built: run `cargo xtask test` (or set TRAINBPF_BIN)",
        p.display()
    );
    p
}

/// A Python without shims in front (pyenv's shims fork dozens of helpers).
pub fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("trainbpf-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    /// Kept when the test failed: its recording is the evidence of why
    /// (`trainbpf report --format events` on it).
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- kept for the failure: {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `trainbpf record -o REC [extra…] -- cmd…` to completion.
pub fn record(rec: &Path, extra: &[&str], cmd: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.arg("record")
        .arg("-o")
        .arg(rec)
        .args(extra)
        .arg("--")
        .args(cmd)
        // The job runs as root even where the suite was started under sudo:
        // with SUDO_UID, record would run it as that user, and some jobs
        // write root's files or kernel settings.
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID");
    c.stdin(Stdio::null());
    let out = c.output().expect("running trainbpf record");
    eprintln!(
        "--- trainbpf record {extra:?} -- {cmd:?}: {}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Starts `trainbpf ARGS` with stderr piped, and returns once a stderr line
/// contains `marker` (e.g. the start-up line: the probes are loaded), with
/// the rest of stderr copied to the test's. Loading can take seconds on a
/// busy machine: a fixed sleep would race it. A marker that does not come
/// within two minutes fails the test (its recorder killed), rather than
/// hanging it.
pub fn spawn_until(args: &[&std::ffi::OsStr], marker: &str) -> std::process::Child {
    use std::io::BufRead;
    let mut child = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting trainbpf");
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let marker_owned = marker.to_owned();
    // Lines up to the marker go through the channel, the rest straight on.
    std::thread::spawn(move || {
        let mut line = String::new();
        let mut seen = false;
        loop {
            line.clear();
            match err.read_line(&mut line) {
                Ok(n) if n > 0 => {}
                _ => return,
            }
            if seen {
                eprint!("{line}");
                continue;
            }
            seen = line.contains(&marker_owned);
            if tx.send(line.clone()).is_err() {
                return;
            }
        }
    });
    let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                eprint!("{line}");
                if line.contains(marker) {
                    return child;
                }
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("trainbpf did not say {marker:?} ({e:?}: ended, or not within 120 s)");
            }
        }
    }
}

pub fn report_json(rec: &Path) -> Value {
    report_json_args(rec, &[])
}

pub fn report_json_args(rec: &Path, extra: &[&str]) -> Value {
    let out = Command::new(bin())
        .arg("report")
        .arg(rec)
        .arg("--format=json")
        .args(extra)
        .output()
        .expect("running trainbpf report");
    assert!(
        out.status.success(),
        "report failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "report --json is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The kernel's own account of a kill, from its log: an oracle independent
/// of trainbpf's probes.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelKill {
    pub pid: u64,
    pub comm: String,
    pub anon_kb: u64,
    pub file_kb: u64,
    pub shmem_kb: u64,
    pub memcg: bool,
}

/// Parses `...: Killed process N (comm) total-vm:XkB, anon-rss:XkB,
/// file-rss:XkB, shmem-rss:XkB, UID:...` for `pid`, newest first.
pub fn dmesg_kill(pid: u64) -> Option<KernelKill> {
    let out = Command::new("dmesg").output().expect("running dmesg");
    let text = String::from_utf8_lossy(&out.stdout);
    let needle = format!("Killed process {pid} (");
    let line = text.lines().rev().find(|l| l.contains(&needle))?;
    let after = &line[line.find(&needle)? + needle.len()..];
    let comm = after[..after.find(") ")?].to_string();
    let num = |key: &str| -> Option<u64> {
        let i = line.find(key)? + key.len();
        line[i..].split("kB").next()?.trim().parse().ok()
    };
    Some(KernelKill {
        pid,
        comm,
        anon_kb: num("anon-rss:")?,
        file_kb: num("file-rss:")?,
        shmem_kb: num("shmem-rss:")?,
        memcg: line.contains("Memory cgroup out of memory"),
    })
}

pub fn kills(report: &Value) -> &Vec<Value> {
    report["kills"].as_array().expect("kills array")
}

pub fn deaths(report: &Value) -> &Vec<Value> {
    report["deaths"].as_array().expect("deaths array")
}

/// The death of `pid` in the report; panics with every death when missing.
pub fn death_of(report: &Value, pid: u64) -> &Value {
    deaths(report)
        .iter()
        .find(|d| u(&d["pid"]) == pid)
        .unwrap_or_else(|| panic!("no death for pid {pid}: {:#}", report["deaths"]))
}

pub fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an unsigned integer: {v}"))
}

/// A process a test started, directly or below its child: its pid and its
/// start time (field 22 of /proc/PID/stat), so that a pid reused by another
/// process is never taken for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Started {
    pub pid: u32,
    pub start: u64,
}

/// (ppid, start time) of `pid`, from /proc/PID/stat; None once it is gone.
fn stat_of(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The comm in parentheses may hold blanks and parentheses: fields
    // are counted after its last ')'. The rest starts at field 3 (state).
    let rest: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some((rest.get(1)?.parse().ok()?, rest.get(19)?.parse().ok()?))
}

/// Every process below `pid` now (children, their children, …), found by
/// parent pid in /proc: the processes a test started through its child,
/// and nothing else on the machine.
pub fn descendants(pid: u32) -> Vec<Started> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("reading /proc").flatten() {
        let Some(p) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some((ppid, start)) = stat_of(p) {
            all.push((p, ppid, start));
        }
    }
    let mut found: Vec<Started> = Vec::new();
    let mut parents = vec![pid];
    while let Some(parent) = parents.pop() {
        for &(p, ppid, start) in &all {
            if ppid == parent {
                found.push(Started { pid: p, start });
                parents.push(p);
            }
        }
    }
    found
}

/// SIGKILLs each of `procs` that is still the same process (same start
/// time); one already gone, or whose pid now names another, is left alone.
pub fn kill_started(procs: &[Started]) {
    for p in procs {
        if stat_of(p.pid).is_some_and(|(_, start)| start == p.start) {
            // SAFETY: plain kill(2) on a process this test started.
            unsafe { libc::kill(p.pid as i32, libc::SIGKILL) };
        }
    }
}

/// A recorder a test started itself, with its job: killed, with what it
/// started, however the test ends.
pub struct Recorder(pub std::process::Child);

impl Drop for Recorder {
    fn drop(&mut self) {
        kill_started(&descendants(self.0.id()));
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to completion with its output captured, or kills it (by its
/// own pid) once `limit` has passed and returns None: a guard against a
/// hang, not a timing.
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Option<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the command");
    // Drained on threads, so that a full pipe cannot stall the child.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut b).map(|_| b)
    });
    let err = std::thread::spawn(move || {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut b).map(|_| b)
    });
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for the command") {
            break s;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    Some(Output {
        status,
        stdout: out.join().unwrap().unwrap_or_default(),
        stderr: err.join().unwrap().unwrap_or_default(),
    })
}

/// Files on a real disk that no process has cached, and the text report
/// (the attribution tests).
mod disk_files {
    use std::{
        fs::File,
        io::Write,
        os::fd::AsRawFd,
        path::{Path, PathBuf},
        process::Command,
    };

    use super::{TempDir, bin};

    /// A data file the test processes did not write: written here, synced, and
    /// dropped from the page cache (fadvise on this file only, not a machine-wide
    /// drop_caches), then checked with mincore(2). Lives under the test's
    /// TempDir, which must be on a real disk: on tmpfs "page cache" is shmem.
    pub fn uncached_file(dir: &TempDir, name: &str, bytes: usize) -> PathBuf {
        let path = dir.path(name);
        assert!(
            !on_tmpfs(&path),
            "{} is on tmpfs: its pages would be shmem, not page cache",
            path.display()
        );
        let mut f = File::create(&path).unwrap();
        let chunk = vec![0x5au8; 1 << 20];
        for _ in 0..bytes / chunk.len() {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
        drop(f);
        evict(&path);
        path
    }

    pub fn on_tmpfs(path: &Path) -> bool {
        let c = std::ffi::CString::new(path.parent().unwrap().to_str().unwrap()).unwrap();
        // SAFETY: statfs(2) into a zeroed struct, a valid NUL-terminated path.
        let mut s: libc::statfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut s) }, 0);
        s.f_type == libc::TMPFS_MAGIC
    }

    /// Drops `path`'s clean pages from the page cache and checks that under 1%
    /// of them stayed resident, so that a reader of it allocates its cache.
    pub fn evict(path: &Path) {
        let f = File::open(path).unwrap();
        // SAFETY: fadvise on an open descriptor.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "fadvise DONTNEED");
        let resident = resident_pages(&f);
        let pages = f.metadata().unwrap().len() as usize / 4096;
        assert!(
            resident * 100 < pages,
            "{} still has {resident} of {pages} pages cached",
            path.display()
        );
    }

    pub fn resident_pages(f: &File) -> usize {
        let len = f.metadata().unwrap().len() as usize;
        // SAFETY: a read-only shared mapping of the whole file, only passed to
        // mincore and unmapped here; nothing reads through it.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let mut vec = vec![0u8; len.div_ceil(4096)];
            assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
            libc::munmap(p, len);
            vec.iter().filter(|b| **b & 1 != 0).count()
        }
    }

    /// The text report of `rec`.
    pub fn report_text(rec: &Path) -> String {
        let out = Command::new(bin())
            .arg("report")
            .arg(rec)
            .output()
            .expect("running trainbpf report");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
pub use disk_files::*;

/// A job process's figures in `report --json` (the attribution tests).
mod process_values {
    use serde_json::Value;

    use super::u;

    pub fn honest(p: &Value) -> i64 {
        p["honest_kb"]
            .as_i64()
            .unwrap_or_else(|| panic!("no honest_kb: {p}"))
    }

    pub fn honest_peak(p: &Value) -> i64 {
        p["honest_peak_kb"]
            .as_i64()
            .unwrap_or_else(|| panic!("no honest_peak_kb: {p}"))
    }

    /// The per-process page-cache figure; `None` while the binary
    /// under test has no such key.
    pub fn page_cache(p: &Value) -> Option<i64> {
        p["page_cache_kb"].as_i64()
    }

    pub fn procs(r: &Value) -> &Vec<Value> {
        r["processes"].as_array().expect("processes")
    }

    pub fn root_proc(r: &Value) -> &Value {
        let root = u(&r["job"]["pid"]);
        procs(r)
            .iter()
            .find(|p| u(&p["pid"]) == root)
            .unwrap_or_else(|| panic!("no job root in {:#}", r["processes"]))
    }

    pub fn children_of(r: &Value, parent: u64) -> Vec<&Value> {
        procs(r)
            .iter()
            .filter(|p| p["parent"].as_u64() == Some(parent))
            .collect()
    }

    pub fn line(p: &Value) -> String {
        format!(
            "pid {} {}: honest_kb {} honest_peak_kb {} page_cache_kb {} peak_rss_kb {}",
            p["pid"],
            p["comm"],
            p["honest_kb"],
            p["honest_peak_kb"],
            p["page_cache_kb"],
            p["peak_rss_kb"]
        )
    }
}
pub use process_values::*;

/// Compiles the C file `src` into the shared library `out` with the system's
/// compiler, by absolute path; panics with the compiler's errors.
pub fn cc_shared(src: &Path, out: &Path) {
    let cc = Command::new("/usr/bin/cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(out)
        .arg(src)
        .output()
        .expect("running /usr/bin/cc");
    assert!(
        cc.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
}

/// Growth stacks' C program (tests/stacks.rs, tests/pprof.rs). It grows
/// through `grow_here()`: takes 1 MiB a step and touches each page in `grow_here` itself (not in
/// a libc memset, which keeps no frame pointer, so its caller would be
/// skipped by frame-pointer unwinding), never freeing.
pub const GROW_C: &str = r#"#include <stdlib.h>
#include <unistd.h>

char *grow_here(size_t n) {
    char *p = malloc(n);
    for (size_t i = 0; i < n; i += 4096)
        p[i] = 1; /* TOUCH */
    return p;
}

void step(void) {
    grow_here(1 << 20);
    usleep(5000);
}

int main(void) {
    for (;;)
        step();
}
"#;

/// The line of the page-touching statement in `GROW_C`.
pub fn grow_c_touch_line() -> u64 {
    GROW_C.lines().position(|l| l.contains("TOUCH")).unwrap() as u64 + 1
}

/// `GROW_C` built with frame pointers and debug information, as `grow`
/// in `dir`.
pub fn build_grow_c(dir: &TempDir) -> PathBuf {
    build_c(dir, "grow", GROW_C, &["-O0", "-fno-omit-frame-pointer"])
}

/// C source `src` built with `flags` and debug information, as `name` in
/// `dir` (its source beside it, `name.c`).
pub fn build_c(dir: &TempDir, name: &str, src_text: &str, flags: &[&str]) -> PathBuf {
    let src = dir.path(&format!("{name}.c"));
    std::fs::write(&src, src_text).unwrap();
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

/// Debian's Chromium, installed if missing (CI runs as root on a fresh
/// machine; `cargo xtask test` installs it first, this is the fallback).
pub fn chromium() -> PathBuf {
    for p in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .expect("running apt-get")
    };
    if !apt(&["install", "-y", "-q", "chromium"]).success() {
        assert!(apt(&["update", "-q"]).success(), "apt-get update failed");
        assert!(
            apt(&["install", "-y", "-q", "chromium"]).success(),
            "apt-get install chromium failed"
        );
    }
    PathBuf::from("/usr/bin/chromium")
}

/// Runs headless Chromium on `page` with `extra` flags (its profile beside
/// the page); its stdout. Killed
/// after two minutes: a hung browser must fail the test, not hang it.
pub fn headless(page: &Path, extra: &[String]) -> String {
    use std::time::{Duration, Instant};
    let profile = page
        .parent()
        .expect("a page in a folder")
        .join(format!("chromium-profile-{}", extra.len()));
    let _ = std::fs::remove_dir_all(&profile);
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting chromium");
    // Drain both pipes while waiting: `--dump-dom` of a big report is more
    // than a pipe holds, and a browser blocked on a full pipe never exits.
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn std::io::Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn std::io::Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("waiting for chromium") {
            break st;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("chromium did not finish in 2 minutes");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = stdout.join().expect("stdout reader");
    let err = stderr.join().expect("stderr reader");
    assert!(
        status.success(),
        "chromium failed: {status}\n{}",
        String::from_utf8_lossy(&err)
    );
    String::from_utf8_lossy(&out).into_owned()
}

/// A new pseudo-terminal: its master, and the slave's path.
pub fn open_pty() -> (std::fs::File, String) {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: plain libc calls on a descriptor this function owns.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(fd >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        assert_eq!(libc::grantpt(fd), 0);
        assert_eq!(libc::unlockpt(fd), 0);
        let mut name = [0 as libc::c_char; 64];
        assert_eq!(libc::ptsname_r(fd, name.as_mut_ptr(), name.len()), 0);
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_string_lossy()
            .into_owned();
        let master = std::fs::File::from_raw_fd(fd);
        assert!(master.as_raw_fd() >= 0);
        (master, path)
    }
}

/// The first kill whose victim was in the job: another test on the machine
/// (another cgroup's OOM kill) can appear in a recording as a kill outside
/// the job, and is not this test's.
pub fn job_kill(report: &Value) -> &Value {
    kills(report)
        .iter()
        .find(|k| k["victim"]["in_job"] == true)
        .unwrap_or_else(|| panic!("no kill of a job process: {}", report["kills"]))
}

/// The late-library tests' stand-ins and runs.
mod gpu;
pub use gpu::*;

/// A GPU test's C source, in `tests/gpu/`.
#[allow(dead_code)]
pub fn gpu_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("gpu").join(name)
}

/// `/usr/bin/cc ARGS`, warnings as errors: the GPU tests build their
/// stand-in driver libraries and jobs with it.
#[allow(dead_code)]
pub fn cc(args: &[&str]) {
    let out = Command::new("/usr/bin/cc")
        .args(["-Wall", "-Wextra", "-Werror", "-O1"])
        .args(args)
        .output()
        .expect("running /usr/bin/cc (the GPU tests build their stand-ins with it)");
    assert!(
        out.status.success(),
        "cc {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

mod bpf_links;
pub use bpf_links::{Link, bpf_links_of};
