//! The late-library tests' stand-ins and runs (tests/e2e/gpu/late.rs and
//! tests/e2e/gpu/probing.rs): copies of the stand-in driver each a file
//! of its own, `record` with the machine's GPU settings removed, and a
//! process's state.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use super::{TempDir, bin, cc, gpu_src};

/// The stand-in driver, built once, copied to `n` directories of its own:
/// each copy is a file (inode) the recorder has not probed, as each new
/// environment's driver would be. Returns the copies and the job
/// (tests/gpu/late_job.c).
pub fn late_standins(dir: &TempDir, n: usize) -> (Vec<PathBuf>, PathBuf) {
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let built = dir.path("libcuda-built.so");
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        &s(&built),
        &s(&gpu_src("standin_cuda.c")),
        "-lpthread",
    ]);
    let libs = (0..n)
        .map(|i| {
            let d = dir.path(&format!("env{i}/lib"));
            std::fs::create_dir_all(&d).unwrap();
            let lib = d.join("libcuda.so.1");
            std::fs::copy(&built, &lib).unwrap();
            lib
        })
        .collect();
    let job = dir.path("late_job");
    cc(&["-o", &s(&job), &s(&gpu_src("late_job.c")), "-ldl"]);
    (libs, job)
}

/// `trainbpf record` with the machine's GPU settings removed and `env`
/// added (the job inherits them).
pub fn gpu_record_command(rec: &Path, env: &[(&str, &str)], cmd: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(["record", "-o"]).arg(rec).arg("--").args(cmd);
    c.env_remove("TRAINBPF_LIBCUDA")
        .env_remove("TRAINBPF_LIBNVML")
        .env_remove("TRAINBPF_TEST_FORCE_GPU_WINDOW_MS")
        .env_remove("TRAINBPF_TEST_GPU_HOLD_MS")
        .env_remove("LD_LIBRARY_PATH");
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdin(Stdio::null());
    c
}

/// Runs [`gpu_record_command`] to its end and prints what it said.
pub fn gpu_record(rec: &Path, env: &[(&str, &str)], cmd: &[&str]) -> Output {
    let out = gpu_record_command(rec, env, cmd)
        .output()
        .expect("running trainbpf record");
    print_output(&format!("trainbpf record {env:?} -- {cmd:?}"), &out);
    out
}

pub fn print_output(what: &str, out: &Output) {
    eprintln!(
        "--- {what}: {}\n--- stdout:\n{}--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The text report, 200 columns wide, without colour.
pub fn report_text_wide(rec: &Path) -> String {
    let out = Command::new(bin())
        .args(["report", "--no-color"])
        .arg(rec)
        .env("COLUMNS", "200")
        .output()
        .expect("running trainbpf report");
    assert!(out.status.success(), "report failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The state letter of /proc/PID/stat (`T`: stopped) and the comm; None
/// once the process is gone.
pub fn state_of(pid: u32) -> Option<(char, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_string();
    let state = stat[close + 1..].trim_start().chars().next()?;
    Some((state, comm))
}

/// The file a waiting job starts at, made when dropped: on every way out
/// of a test, a failed assertion's too, the job runs and its recorder ends.
pub struct Go(pub PathBuf);

impl Drop for Go {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, b"");
    }
}

/// Polls `f` every 10 ms until it gives a value, for at most `limit`.
pub fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A memory cgroup of the test's own, removed on drop (v2 where it holds
/// the memory controller, else v1).
pub struct MemCg {
    pub dir: PathBuf,
    v2: bool,
}

impl MemCg {
    pub fn new(tag: &str, limit: &str) -> MemCg {
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|s| s.contains("memory"));
        let (root, file) = if v2 {
            ("/sys/fs/cgroup", "memory.max")
        } else {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        };
        let dir = Path::new(root).join(format!("trainbpf-test-{tag}-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        std::fs::write(dir.join(file), limit).expect("set the cgroup's limit");
        MemCg { dir, v2 }
    }

    /// The most memory it held at once, bytes.
    pub fn peak(&self) -> u64 {
        let f = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(f))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The OOM kills in it so far.
    pub fn oom_kills(&self) -> u64 {
        let f = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(self.dir.join(f))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemCg {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
