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
//! markers on its serial console (kept in `target/vm/console.log`).

use std::{
    fs::{self, File},
    io::{self, BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::{
    setup::setup,
    util::{cargo, is_root, probe, run, target_dir, workspace_root},
};

const MUSL: &str = "x86_64-unknown-linux-musl";
const MIRROR: &str = "http://deb.debian.org/debian";
/// The Debian suite whose `linux-image-amd64` is each kernel line.
const SUITES: &[(&str, &str)] = &[
    ("5.10", "bullseye"),
    ("6.1", "bookworm"),
    ("6.12", "trixie"),
];
/// Package lists younger than this are reused, so that a second run needs
/// no network; older ones are refreshed to pick up the suite's newest kernel.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// The guest's /init and job; see those files.
const INIT: &str = include_str!("../vm/init");
const GROW_C: &str = "xtask/vm/grow.c";

const RECORD_BEGIN: &str = "===RECORD-BEGIN===";
const RECORD_END: &str = "===RECORD-END===";
const REPORT_BEGIN: &str = "===REPORT-BEGIN===";
const REPORT_END: &str = "===REPORT-END===";

pub struct Options {
    /// Kernel line, e.g. "6.1"; picks the suite unless `suite` is given.
    pub kernel: String,
    pub suite: Option<String>,
    pub timeout: Duration,
}

pub fn vm(opts: &Options) -> Result<()> {
    let started = Instant::now();
    let suite = match &opts.suite {
        Some(s) => s.clone(),
        None => suite_of(&opts.kernel)?,
    };
    let dir = target_dir()?.join("vm");
    fs::create_dir_all(&dir)?;

    ensure_qemu()?;
    ensure_musl_target()?;
    let archive = Archive::new(&dir, &suite)?;
    let kernel = archive.kernel(&opts.kernel)?;
    let busybox = archive.busybox()?;
    let trainbpf = build_trainbpf()?;
    let grow = build_grower(&dir)?;
    let initrd = dir.join("initrd.cpio");
    write_initramfs(&initrd, &busybox, &trainbpf, &grow)?;
    let prepared = started.elapsed();

    eprintln!(
        "vm: booting {} ({} {}) under qemu TCG",
        kernel.package, kernel.version, suite
    );
    let console_log = dir.join("console.log");
    let booted = Instant::now();
    let console = boot(&kernel.vmlinuz, &initrd, &console_log, opts.timeout)?;
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
    println!(
        "vm: took {:.1} s: {:.1} s to prepare, {:.1} s from boot to power-off",
        started.elapsed().as_secs_f64(),
        prepared.as_secs_f64(),
        boot_time.as_secs_f64()
    );
    Ok(())
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

/// qemu from the distribution, installed once; the package lists are only
/// refreshed when the install fails without them (a fresh container).
fn ensure_qemu() -> Result<()> {
    if probe(Command::new("qemu-system-x86_64").arg("--version")).is_some() {
        return Ok(());
    }
    ensure!(
        is_root(),
        "qemu-system-x86_64 is missing, and installing it needs root: \
         `sudo apt-get install --no-install-recommends qemu-system-x86`"
    );
    let install = || {
        run(Command::new("apt-get")
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
        run(Command::new("apt-get").arg("update"))?;
        install()?;
    }
    Ok(())
}

/// The guest has no libc: trainbpf is linked statically against musl.
fn ensure_musl_target() -> Result<()> {
    let installed = probe(Command::new("rustup").args(["target", "list", "--installed"]))
        .is_some_and(|out| out.lines().any(|l| l.trim() == MUSL));
    if !installed {
        run(Command::new("rustup").args(["target", "add", MUSL]))?;
    }
    Ok(())
}

/// One Debian suite, reached through apt with its own sources list, package
/// lists and cache under `target/vm/apt/<suite>`: the machine's own apt
/// set-up is neither used nor changed.
struct Archive {
    dir: PathBuf,
    suite: String,
    /// Unpacked kernels and busybox, by package and version.
    unpacked: PathBuf,
    debs: PathBuf,
}

struct Kernel {
    package: String,
    version: String,
    vmlinuz: PathBuf,
}

impl Archive {
    fn new(vm_dir: &Path, suite: &str) -> Result<Archive> {
        let dir = vm_dir.join("apt").join(suite);
        fs::create_dir_all(dir.join("lists/partial"))?;
        fs::create_dir_all(dir.join("cache"))?;
        fs::write(
            dir.join("sources.list"),
            format!("deb {MIRROR} {suite} main\n"),
        )?;
        let archive = Archive {
            dir,
            suite: suite.to_string(),
            unpacked: vm_dir.join("unpacked"),
            debs: vm_dir.join("debs"),
        };
        archive.update_if_stale()?;
        Ok(archive)
    }

    fn apt(&self, program: &str) -> Command {
        let d = &self.dir;
        let mut cmd = Command::new(program);
        for (key, value) in [
            ("Dir::Etc::sourcelist", d.join("sources.list")),
            ("Dir::Etc::sourceparts", PathBuf::from("/dev/null")),
            ("Dir::State::Lists", d.join("lists")),
            // Else apt rebuilds the machine's own pkgcache.bin from our lists.
            ("Dir::Cache", d.join("cache")),
            // Downloads go to a directory under target/, which the `_apt`
            // user usually cannot write; say so rather than have apt warn.
            ("APT::Sandbox::User", PathBuf::from("root")),
        ] {
            cmd.arg("-o").arg(format!("{key}={}", value.display()));
        }
        // The output is parsed: no translations.
        cmd.env("LC_ALL", "C");
        cmd
    }

    fn update_if_stale(&self) -> Result<()> {
        let stamp = self.dir.join("lists/.updated");
        let fresh = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < LISTS_MAX_AGE);
        if !fresh {
            eprintln!("vm: fetching the package lists of Debian {}", self.suite);
            run(self.apt("apt-get").arg("update"))?;
            fs::write(&stamp, "")?;
        }
        Ok(())
    }

    /// `apt-cache` output of a successful run, or an error naming the suite.
    fn query(&self, args: &[&str]) -> Result<String> {
        let out = self
            .apt("apt-cache")
            .args(args)
            .stderr(Stdio::inherit())
            .output()
            .context("cannot run apt-cache")?;
        ensure!(
            out.status.success(),
            "`apt-cache {}` failed for Debian {}",
            args.join(" "),
            self.suite
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn version_of(&self, package: &str) -> Result<String> {
        let show = self.query(&["show", "--no-all-versions", package])?;
        show.lines()
            .find_map(|l| l.strip_prefix("Version:"))
            .map(|v| v.trim().to_string())
            .with_context(|| format!("no version of {package} in Debian {}", self.suite))
    }

    /// The suite's newest kernel image: the one its `linux-image-amd64`
    /// depends on (the generic flavour, not cloud or rt), unpacked to its
    /// vmlinuz alone.
    fn kernel(&self, line: &str) -> Result<Kernel> {
        let deps = self.query(&["depends", "linux-image-amd64"])?;
        let package = deps
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Depends:"))
            .map(str::trim)
            .find(|p| p.starts_with("linux-image-"))
            .with_context(|| format!("linux-image-amd64 in Debian {} names no image", self.suite))?
            .to_string();
        ensure!(
            package.starts_with(&format!("linux-image-{line}.")),
            "Debian {}'s kernel is {package}, not a {line} kernel",
            self.suite
        );
        let version = self.version_of(&package)?;
        let dest = self.unpacked.join(format!("{package}_{version}"));
        let vmlinuz = dest.join("vmlinuz");
        if !vmlinuz.is_file() {
            let deb = self.download(&package, &version)?;
            // Only /boot is kept: the modules would be another 400 MB.
            let tmp = self.unpacked.join(format!("{package}_{version}.partial"));
            unpack(&deb, &tmp)?;
            let boot = tmp.join("boot");
            let image = find_prefixed(&boot, "vmlinuz-")?;
            let config = find_prefixed(&boot, "config-")?;
            fs::create_dir_all(&dest)?;
            fs::rename(&config, dest.join("config"))?;
            fs::rename(&image, &vmlinuz)?;
            fs::remove_dir_all(&tmp)?;
        }
        Ok(Kernel {
            package,
            version,
            vmlinuz,
        })
    }

    /// The statically linked busybox, the guest's shell and tools.
    fn busybox(&self) -> Result<PathBuf> {
        let version = self.version_of("busybox-static")?;
        let dest = self.unpacked.join(format!("busybox-static_{version}"));
        // /bin until bookworm, /usr/bin from trixie on (merged /usr).
        let find = || {
            ["bin/busybox", "usr/bin/busybox"]
                .map(|p| dest.join(p))
                .into_iter()
                .find(|p| p.is_file())
        };
        if let Some(busybox) = find() {
            return Ok(busybox);
        }
        let deb = self.download("busybox-static", &version)?;
        unpack(&deb, &dest)?;
        find().with_context(|| format!("{} has no busybox binary", deb.display()))
    }

    /// `apt-get download` into `debs/<package>_<version>/`, reused when there.
    /// It downloads into a `.partial` sibling first, so that an interrupted
    /// download is never taken for a cached one.
    fn download(&self, package: &str, version: &str) -> Result<PathBuf> {
        let dest = self.debs.join(format!("{package}_{version}"));
        if !dest.is_dir() {
            let tmp = self.debs.join(format!("{package}_{version}.partial"));
            let _ = fs::remove_dir_all(&tmp);
            fs::create_dir_all(&tmp)?;
            run(self
                .apt("apt-get")
                .arg("download")
                .arg(format!("{package}={version}"))
                .current_dir(&tmp))?;
            fs::rename(&tmp, &dest)?;
        }
        find_suffixed(&dest, ".deb")
    }
}

/// `dpkg-deb -x`, into a directory emptied first.
fn unpack(deb: &Path, into: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(into);
    fs::create_dir_all(into)?;
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(into))
}

fn find_in(dir: &Path, what: &str, matches: impl Fn(&str) -> bool) -> Result<PathBuf> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(&matches)
        {
            return Ok(path);
        }
    }
    bail!("no {what} in {}", dir.display())
}

fn find_prefixed(dir: &Path, prefix: &str) -> Result<PathBuf> {
    find_in(dir, &format!("{prefix}*"), |n| n.starts_with(prefix))
}

fn find_suffixed(dir: &Path, suffix: &str) -> Result<PathBuf> {
    find_in(dir, &format!("*{suffix}"), |n| n.ends_with(suffix))
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

/// The lines between a begin marker and the next end marker, and the end
/// marker's line (which carries the exit status), if there was one.
fn section<'a>(
    console: &'a str,
    begin: &str,
    end: &str,
) -> Option<(Vec<&'a str>, Option<&'a str>)> {
    let mut lines = console.lines().skip_while(|l| !l.starts_with(begin));
    lines.next()?;
    let mut body = Vec::new();
    for line in lines {
        if line.starts_with(end) {
            return Some((body, Some(line)));
        }
        body.push(line);
    }
    Some((body, None))
}

/// The guest records three times: `--oom-probe auto` (fentry where allowed)
/// and `--oom-probe kprobe` in a 64M memcg, then with no limit, into a
/// global OOM of the guest's 1 GiB.
const PASSES: [&str; 3] = ["auto", "kprobe", "global"];
const PASS: &str = "===PASS===";

/// The console output of one pass: from its `===PASS=== name` line to the
/// next pass; the whole console when there are no pass lines.
fn pass_output<'a>(console: &'a str, pass: &str) -> &'a str {
    let head = format!("{PASS} {pass}\n");
    let Some(start) = console.find(&head) else {
        return if console.contains(PASS) { "" } else { console };
    };
    let rest = &console[start + head.len()..];
    &rest[..rest.find(PASS).unwrap_or(rest.len())]
}

/// Checks the guest's report for one pass; returns the summary to print.
fn check(console: &str, pass: &str) -> Result<String> {
    if let Some(panic) = console.lines().find(|l| l.contains("Kernel panic")) {
        bail!("the guest kernel panicked: {panic}");
    }
    let (record, record_end) = section(console, RECORD_BEGIN, RECORD_END)
        .context("the guest never started the record (no /init output)")?;
    let record_log = record.join("\n");
    // "trainbpf: recording to …; OOM kill via …", then "  fallback:" lines.
    let startup: Vec<&str> = record
        .iter()
        .skip_while(|l| !l.starts_with("trainbpf: recording to"))
        .take_while(|l| l.starts_with("trainbpf: recording to") || l.starts_with("  fallback:"))
        .copied()
        .collect();
    ensure!(
        !startup.is_empty(),
        "`trainbpf record` did not start ({}); its output in the guest:\n{record_log}",
        record_end.unwrap_or("no end marker")
    );

    let (report, report_end) =
        section(console, REPORT_BEGIN, REPORT_END).context("the guest printed no report")?;
    let report: Value = serde_json::from_str(&report.join("\n")).with_context(|| {
        format!(
            "the guest's report is not JSON ({}); the record's output:\n{record_log}",
            report_end.unwrap_or("no end marker")
        )
    })?;

    let kills = report["kills"].as_array().cloned().unwrap_or_default();
    let Some(kill) = kills.first() else {
        bail!("the report has no kill; the record's output:\n{record_log}");
    };
    let positive = |key: &str| kill[key].as_i64().filter(|n| *n > 0);
    let victim = &kill["victim"];
    let mut failures = Vec::new();
    let source = kill["source"].as_str().unwrap_or_default();
    if !source.contains("kprobe") && !source.contains("fentry") {
        failures.push(format!(
            "source is {source:?}: no oom_kill_process probe (kprobe or fentry) reported the kill"
        ));
    }
    if pass == "kprobe" && !source.contains("kprobe") {
        failures.push(format!(
            "source is {source:?}: the forced kprobe did not report the kill"
        ));
    }
    // The reconstruction of oom_badness from tracked memory must agree with
    // the kernel's own chosen_points.
    if kill["ranking"]["agrees_with_kernel"] != true {
        failures.push(format!(
            "the reconstructed badness ({}) does not agree with the kernel's points ({})",
            kill["ranking"]["victim_points"], kill["kernel_points"]
        ));
    }
    for key in ["kernel_points", "totalpages"] {
        if positive(key).is_none() {
            failures.push(format!("{key} is {}, not a positive number", kill[key]));
        }
    }
    if kill["trigger"]["pid"].as_i64().is_none_or(|p| p <= 0) {
        failures.push(format!("the trigger's pid is not set: {}", kill["trigger"]));
    }
    if victim["comm"] != "grow" || victim["pid"] != report["job"]["pid"] {
        failures.push(format!(
            "the victim is {} (pid {}), not the grower (the job, pid {})",
            victim["comm"], victim["pid"], report["job"]["pid"]
        ));
    }
    let want = if pass == "global" { "none" } else { "memcg" };
    let death = report["deaths"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["pid"] == victim["pid"]));
    let want_cause = if pass == "global" {
        "oom_global"
    } else {
        "oom_memcg"
    };
    if death.is_none_or(|d| d["cause"] != want_cause) {
        failures.push(format!(
            "the victim's death is {}, not {want_cause}",
            death.map_or("missing".to_string(), |d| d["cause"].to_string())
        ));
    }
    if kill["constraint"] != want {
        failures.push(format!(
            "the constraint is {}, not {want}: the job's 64M limit did not kill it (or, for the global pass, the guest's memory did not run out)",
            kill["constraint"]
        ));
    }
    if kills.len() > 1 {
        failures.push(format!("{} kills, where the grower dies once", kills.len()));
    }
    let attach = &report["recording"]["attach"];
    if !failures.is_empty() {
        bail!(
            "{}\nrecord's start-up line:\n{}\nthe kill: {}",
            failures.join("\n"),
            startup.join("\n"),
            serde_json::to_string_pretty(kill)?
        );
    }

    let mut summary = format!(
        "vm: pass {pass}: kernel {}\n\
         vm: {}\n\
         vm: kill via {source} (oom_kill_process: {}, victim: {}), constraint {} in {}\n\
         vm: victim {} (pid {}), trigger {} (pid {})\n\
         vm: kernel_points {}, totalpages {}",
        text(&report["recording"]["kernel"]),
        startup.join("\nvm: "),
        text(&attach["oom_context"]),
        text(&attach["oom_victim"]),
        text(&kill["constraint"]),
        text(&kill["memcg"]),
        text(&victim["comm"]),
        victim["pid"],
        text(&kill["trigger"]["comm"]),
        kill["trigger"]["pid"],
        kill["kernel_points"],
        kill["totalpages"],
    );
    // Informational: the reconstruction of oom_badness, where this version
    // of trainbpf reports one.
    if let Some(first) = kill["candidates"].as_array().and_then(|c| c.first()) {
        summary.push_str(&format!(
            "\nvm: reconstruction ranks {} (pid {}) first with {} points (agrees with the kernel: {})",
            text(&first["comm"]),
            first["pid"],
            first["points"],
            kill["ranking"]["agrees_with_kernel"]
        ));
    }
    Ok(summary)
}

/// A JSON string without its quotes; anything else as JSON.
fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
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

    #[test]
    fn a_failed_load_is_quoted_from_the_console() {
        let console = "===RECORD-BEGIN===\n\
                       trainbpf: attaching tp_btf:sched_process_fork: invalid argument\n\
                       ===RECORD-END=== exit=1\n\
                       ===REPORT-BEGIN===\n\
                       trainbpf: reading /rec: no such file\n\
                       ===REPORT-END=== exit=1\n";
        let err = format!("{:#}", check(console, "auto").unwrap_err());
        assert!(
            err.contains("did not start (===RECORD-END=== exit=1)"),
            "{err}"
        );
        assert!(
            err.contains("sched_process_fork: invalid argument"),
            "{err}"
        );
    }

    #[test]
    fn a_kill_without_kernel_figures_fails_each_check() {
        let report = serde_json::json!({
            "recording": {"kernel": "6.1.0-50-amd64", "attach": {}},
            "job": {"pid": 96},
            "kills": [{
                "source": "tracepoint", "kernel_points": null, "totalpages": null,
                "trigger": {"pid": null, "comm": null}, "constraint": "memcg",
                "victim": {"pid": 96, "comm": "grow"},
            }],
        });
        let console = format!(
            "===RECORD-BEGIN===\ntrainbpf: recording to /rec; OOM kill via …\n\
             ===RECORD-END=== exit=137\n===REPORT-BEGIN===\n{report}\n===REPORT-END=== exit=0\n"
        );
        let err = format!("{:#}", check(&console, "auto").unwrap_err());
        for what in [
            "no oom_kill_process probe",
            "kernel_points is null",
            "totalpages is null",
        ] {
            assert!(err.contains(what), "{what}: {err}");
        }
        assert!(err.contains("the trigger's pid is not set"), "{err}");
        assert!(!err.contains("not the grower"), "{err}");
    }
}
