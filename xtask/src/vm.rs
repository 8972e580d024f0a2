//! `cargo xtask vm`: records a real memory-cgroup OOM kill on a stock Debian
//! kernel that has kprobes, booted under qemu, and checks that trainbpf's
//! `oom_kill_process` probe (fentry or kprobe) gave the kernel's own figures.
//!
//! The machines this project is built on have no kprobes and deny fentry, so
//! without this the `oom_kill_process` path (points, totalpages, the trigger)
//! would never run. qemu with TCG boots a kernel in seconds and needs no KVM.
//!
//! Steps: install qemu and the musl target if missing; fetch the kernel and
//! busybox-static packages from Debian with a one-off apt set-up (nothing is
//! installed system-wide; all of it is cached under `target/vm`); build
//! trainbpf statically and the grower (`xtask/vm/grow.c`); pack an initramfs
//! around `xtask/vm/init`; boot; parse the report the guest prints between
//! markers on its serial console (kept in `target/vm/console-<line>.log`).
//! `--kernel all` does the last four steps for each kernel line in turn.

use std::{
    fs::{self, File},
    io::{self, BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    privilege,
    setup::setup,
    util::{cargo, probe, run, target_dir, workspace_root},
};

mod apt_sources;
mod archive;
mod check;

use archive::Archive;
use check::{PASSES, REPORT_BEGIN, REPORT_END, check, pass_output};

pub(crate) const MUSL: &str = "x86_64-unknown-linux-musl";
/// The Debian suite whose `linux-image-amd64` is each kernel line.
const SUITES: &[(&str, &str)] = &[
    ("5.10", "bullseye"),
    ("6.1", "bookworm"),
    ("6.12", "trixie"),
];

/// The guest's /init and job; see those files.
const INIT: &str = include_str!("../vm/init");
const GROW_C: &str = "xtask/vm/grow.c";

pub struct Options {
    /// Kernel line, e.g. "6.1", or "all" for each line in SUITES; picks the
    /// suite unless `suite` is given.
    pub kernel: String,
    pub suite: Option<String>,
    /// A Debian archive's URI; by default the machine's own (apt sources).
    pub mirror: Option<String>,
    pub timeout: Duration,
}

pub fn vm(opts: &Options) -> Result<()> {
    let started = Instant::now();
    let runs: Vec<(String, String)> = if opts.kernel == "all" {
        ensure!(
            opts.suite.is_none(),
            "--suite names the suite of one kernel line: give --kernel too, not `all`"
        );
        SUITES
            .iter()
            .map(|(k, s)| (k.to_string(), s.to_string()))
            .collect()
    } else {
        ensure!(
            !opts.kernel.is_empty() && opts.kernel.chars().all(|c| c.is_ascii_digit() || c == '.'),
            "--kernel {:?}: give a kernel line such as 6.1, or `all`",
            opts.kernel
        );
        let suite = match &opts.suite {
            Some(s) => s.clone(),
            None => suite_of(&opts.kernel)?,
        };
        vec![(opts.kernel.clone(), suite)]
    };
    let dir = target_dir()?.join("vm");
    fs::create_dir_all(&dir)?;

    let mirror = mirror(opts)?;
    ensure_qemu()?;
    ensure_musl_target()?;
    // One static trainbpf and one grower for every kernel: a guest binary
    // cannot depend on the kernel it runs on.
    let trainbpf = build_trainbpf()?;
    let grow = build_grower(&dir)?;
    let built = started.elapsed();

    let mut results = Vec::new();
    let mut failed = Vec::new();
    for (line, suite) in &runs {
        let t = Instant::now();
        let run = one_kernel(&dir, line, suite, &mirror, &trainbpf, &grow, opts.timeout);
        let took = t.elapsed().as_secs_f64();
        match run {
            Ok(boot) => results.push(format!(
                "vm: {line} ({suite}): passed in {took:.1} s, {:.1} s of it from boot to power-off",
                boot.as_secs_f64()
            )),
            // A single kernel's error is the task's; with `all`, every
            // kernel runs, so that one CI log shows all that is broken.
            Err(e) if runs.len() == 1 => return Err(e),
            Err(e) => {
                eprintln!("vm: kernel {line} FAILED: {e:#}");
                results.push(format!("vm: {line} ({suite}): FAILED after {took:.1} s"));
                failed.push(line.as_str());
            }
        }
    }
    for r in &results {
        println!("{r}");
    }
    println!(
        "vm: took {:.1} s in all, {:.1} s of it to build trainbpf and the grower",
        started.elapsed().as_secs_f64(),
        built.as_secs_f64()
    );
    ensure!(
        failed.is_empty(),
        "the VM run failed on kernel {} (above)",
        failed.join(", ")
    );
    Ok(())
}

/// Fetches one kernel line, boots it and checks every pass; returns the
/// time from boot to power-off.
fn one_kernel(
    dir: &Path,
    line: &str,
    suite: &str,
    mirror: &str,
    trainbpf: &Path,
    grow: &Path,
    timeout: Duration,
) -> Result<Duration> {
    let archive = Archive::new(dir, suite, mirror)?;
    let kernel = archive.kernel(line)?;
    let busybox = archive.busybox()?;
    let initrd = dir.join(format!("initrd-{line}.cpio"));
    write_initramfs(&initrd, &busybox, trainbpf, grow)?;

    eprintln!(
        "vm: booting {} ({} {}) under qemu TCG",
        kernel.package, kernel.version, suite
    );
    let console_log = dir.join(format!("console-{line}.log"));
    let booted = Instant::now();
    let console = boot(&kernel.vmlinuz, &initrd, &console_log, timeout)?;
    let boot_time = booted.elapsed();

    for pass in PASSES {
        let summary = check(pass_output(&console, pass), pass).with_context(|| {
            format!(
                "the VM run on {} failed its checks (pass {pass}); the whole console is in {}",
                kernel.package,
                console_log.display()
            )
        })?;
        println!("{summary}");
    }
    Ok(boot_time)
}

fn suite_of(kernel: &str) -> Result<String> {
    SUITES
        .iter()
        .find(|(k, _)| *k == kernel)
        .map(|(_, s)| s.to_string())
        .with_context(|| {
            let known: Vec<_> = SUITES.iter().map(|(k, s)| format!("{k} ({s})")).collect();
            format!(
                "no Debian suite known for kernel {kernel}: known are {}; name one with --suite",
                known.join(", ")
            )
        })
}

/// `--mirror`, or the Debian archive this machine's apt already uses: the
/// project names no mirror of its own.
fn mirror(opts: &Options) -> Result<String> {
    if let Some(m) = &opts.mirror {
        return Ok(m.trim_end_matches('/').to_string());
    }
    let sources = apt_sources::machine_sources()?;
    let (mirror, origin) = apt_sources::debian_mirror(&sources).context(
        "no Debian archive in this machine's apt sources (/etc/apt/sources.list, \
         /etc/apt/sources.list.d/*.list and *.sources): name one with --mirror URL",
    )?;
    eprintln!("vm: Debian archive {mirror} (from {origin})");
    Ok(mirror)
}

/// qemu from the distribution, installed once; the package lists are only
/// refreshed when the install fails without them (a fresh container).
fn ensure_qemu() -> Result<()> {
    if probe(Command::new("qemu-system-x86_64").arg("--version")).is_some() {
        return Ok(());
    }
    let why = "installing qemu-system-x86";
    let install = || -> Result<()> {
        run(privilege::as_root("apt-get", why)?
            .args([
                "install",
                "-y",
                "--no-install-recommends",
                "qemu-system-x86",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive"))
    };
    if install().is_err() {
        eprintln!("vm: installing qemu failed; updating the package lists and trying again");
        run(privilege::as_root("apt-get", why)?.arg("update"))?;
        install()?;
    }
    Ok(())
}

/// The guest has no libc: trainbpf is linked statically against musl.
pub(crate) fn ensure_musl_target() -> Result<()> {
    let installed = probe(Command::new("rustup").args(["target", "list", "--installed"]))
        .is_some_and(|out| out.lines().any(|l| l.trim() == MUSL));
    if !installed {
        run(Command::new("rustup").args(["target", "add", MUSL]))?;
    }
    Ok(())
}

/// trainbpf for the guest, static (musl). Its build.rs builds the eBPF
/// object the same way for any host target, so setup() is needed as for a
/// normal build.
fn build_trainbpf() -> Result<PathBuf> {
    setup()?;
    run(cargo().args([
        "build",
        "--release",
        "--package",
        "trainbpf",
        "--target",
        MUSL,
    ]))?;
    let bin = target_dir()?.join(MUSL).join("release/trainbpf");
    ensure!(bin.is_file(), "the build produced no {}", bin.display());
    Ok(bin)
}

fn build_grower(vm_dir: &Path) -> Result<PathBuf> {
    let out = vm_dir.join("grow");
    run(Command::new("gcc")
        .args(["-static", "-O2", "-Wall", "-o"])
        .arg(&out)
        .arg(workspace_root().join(GROW_C)))
    .context("building the guest's grower needs gcc and a static libc (libc6-dev)")?;
    Ok(out)
}

/// The initramfs, an uncompressed cpio archive (the kernel takes one as is).
/// Written here rather than with cpio(1) so that it can hold /dev/console,
/// which the kernel opens for /init's output before anything is mounted, and
/// which mknod would need root for.
fn write_initramfs(path: &Path, busybox: &Path, trainbpf: &Path, grow: &Path) -> Result<()> {
    let read = |p: &Path| fs::read(p).with_context(|| format!("reading {}", p.display()));
    let mut cpio = Cpio::default();
    for dir in ["bin", "dev", "etc", "proc", "sys", "tmp"] {
        cpio.dir(dir);
    }
    cpio.char_device("dev/console", 5, 1);
    cpio.file("bin/busybox", 0o755, &read(busybox)?);
    cpio.symlink("bin/sh", "busybox");
    cpio.file("bin/trainbpf", 0o755, &read(trainbpf)?);
    cpio.file("grow", 0o755, &read(grow)?);
    cpio.file("init", 0o755, INIT.as_bytes());
    // The job runs as the invoking user, looked up by uid.
    cpio.file("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\n");
    cpio.file("etc/group", 0o644, b"root:x:0:\n");
    fs::write(path, cpio.finish()).with_context(|| format!("writing {}", path.display()))
}

/// A cpio archive in the "newc" format, the one the kernel unpacks.
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    inode: u32,
}

impl Cpio {
    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, (0, 0), b"");
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, (0, 0), data);
    }

    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120_777, (0, 0), target.as_bytes());
    }

    fn char_device(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020_600, (major, minor), b"");
    }

    /// A 110-byte header of 8-digit hex fields, the NUL-terminated name,
    /// the data; name and data each padded to 4 bytes. Owner root, time 0.
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.inode += 1;
        let fields = [
            self.inode,
            mode,
            0, // uid
            0, // gid
            1, // nlink
            0, // mtime
            data.len() as u32,
            0, // dev major
            0, // dev minor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0, // check
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), b"");
        self.out
    }
}

/// Boots the guest and returns its serial console, also written to
/// `console_log` as it comes and echoed (less the report's JSON) to stderr.
fn boot(vmlinuz: &Path, initrd: &Path, console_log: &Path, timeout: Duration) -> Result<String> {
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(["-accel", "tcg", "-cpu", "max", "-m", "1024", "-smp", "2"])
        .args(["-nographic", "-no-reboot"])
        // No network: the guest needs none, and the NIC's boot ROM only adds
        // noise to the console.
        .args(["-nic", "none"])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        // panic=-1 with -no-reboot: a guest panic ends qemu at once instead
        // of running out the timeout.
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = qemu.spawn().context("cannot run qemu-system-x86_64")?;

    let mut log =
        File::create(console_log).with_context(|| format!("creating {}", console_log.display()))?;
    let stdout = child.stdout.take().expect("piped");
    let reader = thread::spawn(move || -> io::Result<String> {
        let mut console = String::new();
        let mut in_report = false;
        for line in BufReader::new(stdout).split(b'\n') {
            let line = printable(&String::from_utf8_lossy(&line?));
            writeln!(log, "{line}")?;
            if line.starts_with(REPORT_BEGIN) {
                in_report = true;
            }
            if !in_report {
                eprintln!("guest| {line}");
            }
            if line.starts_with(REPORT_END) {
                in_report = false;
            }
            console.push_str(&line);
            console.push('\n');
        }
        Ok(console)
    });
    let mut stderr = child.stderr.take().expect("piped");
    let errors = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(100));
    };
    let console = reader
        .join()
        .expect("console reader panicked")
        .context("reading the guest's console")?;
    let qemu_errors = errors.join().unwrap_or_default();
    match status {
        None => bail!(
            "the guest did not power off within {} s; its console is in {}",
            timeout.as_secs(),
            console_log.display()
        ),
        Some(s) if !s.success() => bail!("qemu failed ({s}):\n{}", qemu_errors.trim()),
        Some(_) => Ok(console),
    }
}

/// `line` without terminal control sequences: the guest's firmware clears
/// the screen and turns off line wrapping, which must not reach the user's
/// terminal (or the log).
fn printable(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            // ESC [ params final-byte (CSI), or ESC and one character.
            '\x1b' => {
                if chars.next() == Some('[') {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_entries_are_aligned_newc() {
        let mut cpio = Cpio::default();
        cpio.file("init", 0o755, b"#!/bin/sh\n");
        cpio.char_device("dev/console", 5, 1);
        let out = cpio.finish();
        assert!(out.starts_with(b"070701"));
        // Header and "init\0" (115 bytes) padded to 116, 10 bytes of data to 12.
        let second = 110 + 5 + 1 + 12;
        assert_eq!(&out[second..second + 6], b"070701");
        // rdevmajor and rdevminor are the 10th and 11th fields.
        let field = |entry: usize, i: usize| &out[entry + 6 + 8 * i..entry + 14 + 8 * i];
        assert_eq!(field(second, 9), b"00000005");
        assert_eq!(field(second, 10), b"00000001");
        assert_eq!(out.len() % 4, 0);
        assert!(out.windows(10).any(|w| w == b"TRAILER!!!"));
    }

    #[test]
    fn printable_drops_terminal_controls() {
        assert_eq!(
            printable("\x1bc\x1b[?7l\x1b[2JBooting from ROM...\r"),
            "Booting from ROM..."
        );
    }
}
