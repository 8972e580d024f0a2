//! One Debian suite's packages, fetched with apt through a one-off set-up
//! under `target/vm/apt/<suite>`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result, bail, ensure};

use crate::util::run;

/// Package lists younger than this are reused, so that a second run needs
/// no network; older ones are refreshed to pick up the suite's newest kernel.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// One Debian suite, reached through apt with its own sources list, package
/// lists and cache under `target/vm/apt/<suite>`: the machine's own apt
/// set-up is neither used nor changed.
pub struct Archive {
    dir: PathBuf,
    suite: String,
    mirror: String,
    /// Unpacked kernels and busybox, by package and version.
    unpacked: PathBuf,
    debs: PathBuf,
}

pub struct Kernel {
    pub package: String,
    pub version: String,
    pub vmlinuz: PathBuf,
}

impl Archive {
    /// `mirror` is a Debian archive's URI, as in a sources.list line.
    pub fn new(vm_dir: &Path, suite: &str, mirror: &str) -> Result<Archive> {
        let dir = vm_dir.join("apt").join(suite);
        fs::create_dir_all(dir.join("lists/partial"))?;
        fs::create_dir_all(dir.join("cache"))?;
        fs::write(
            dir.join("sources.list"),
            format!("deb {mirror} {suite} main\n"),
        )?;
        let archive = Archive {
            dir,
            suite: suite.to_string(),
            mirror: mirror.to_string(),
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
        // The stamp holds the mirror the lists came from: apt-cache only
        // reads the lists of the URI in sources.list.
        let stamp = self.dir.join("lists/.updated");
        let same_mirror = fs::read_to_string(&stamp).is_ok_and(|m| m == self.mirror);
        let fresh = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < LISTS_MAX_AGE);
        if !(fresh && same_mirror) {
            eprintln!(
                "vm: fetching the package lists of Debian {} from {}",
                self.suite, self.mirror
            );
            run(self.apt("apt-get").arg("update"))?;
            fs::write(&stamp, &self.mirror)?;
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
    pub fn kernel(&self, line: &str) -> Result<Kernel> {
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
    pub fn busybox(&self) -> Result<PathBuf> {
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
