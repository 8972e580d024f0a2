//! The reads of one shared-memory look that the job can make wait, each
//! run on a worker with a deadline (`look.rs`): a process's maps and
//! descriptors, and a /dev/shm directory (its size, its files).

use std::{
    collections::HashSet,
    fs,
    os::fd::{AsFd, OwnedFd},
};

use nix::{
    fcntl::{OFlag, OpenHow, ResolveFlag, openat2},
    sys::stat::{FileStat, Mode},
};
use trainbpf_report::decode::samples::{ShmFs, ShmKind, ShmObject};

use crate::record::samplers::procfs::{maps_line, shm_mappings};

/// Files listed per /dev/shm: a job that makes millions of them must not
/// make each look take seconds.
const MAX_FILES: usize = 4096;

/// An object: its kind, its filesystem's device (0 for SysV and memfds),
/// its id.
pub type Key = (ShmKind, u64, u64);

/// The process's /dev/shm, resolved inside its own root.
pub fn open_shm_dir(pid: u32) -> Option<OwnedFd> {
    // The kernel's link to the process's root: a magic link, followed on
    // purpose; nothing below it is resolved outside that root.
    let root = nix::fcntl::open(
        format!("/proc/{pid}/root").as_str(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(&root, "dev/shm", how).ok()
}

/// What a /dev/shm directory is.
pub enum Fs {
    /// On a filesystem `listed` already (by device).
    Listed(u64),
    /// A filesystem not listed before: its size and free space (`job`
    /// left false), and its files.
    New(ShmFs, Vec<(Key, ShmObject)>),
}

/// The filesystem a /dev/shm directory is on and, where it is not one
/// of `listed`, its size and its regular files.
pub fn describe(dir: &OwnedFd, listed: &[u64]) -> Option<Fs> {
    let st = nix::sys::stat::fstat(dir).ok()?;
    let dev = st.st_dev;
    if listed.contains(&dev) {
        return Some(Fs::Listed(dev));
    }
    let vfs = nix::sys::statvfs::fstatvfs(dir).ok()?;
    let frsize = vfs.fragment_size();
    let fs = ShmFs {
        dev,
        size_kb: vfs.blocks().saturating_mul(frsize) / 1024,
        free_kb: vfs.blocks_free().saturating_mul(frsize) / 1024,
        job: false,
    };
    Some(Fs::New(fs, list(dir, dev)))
}

/// The regular files in one /dev/shm, at most [`MAX_FILES`].
fn list(dir: &OwnedFd, dev: u64) -> Vec<(Key, ShmObject)> {
    let mut out = Vec::new();
    // A fresh open file description: the kept one's offset stays put.
    let Ok(mut d) = nix::dir::Dir::openat(
        dir.as_fd(),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return out;
    };
    let names: Vec<std::ffi::CString> = d
        .iter()
        .flatten()
        .filter(|e| !matches!(e.file_name().to_bytes(), b"." | b".."))
        .take(MAX_FILES)
        .map(|e| e.file_name().to_owned())
        .collect();
    for name in names {
        let Ok(st) = nix::sys::stat::fstatat(
            dir.as_fd(),
            name.as_c_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) else {
            continue;
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            continue;
        }
        let name = format!("/dev/shm/{}", name.to_string_lossy());
        out.push((
            (ShmKind::Posix, dev, st.st_ino),
            object(ShmKind::Posix, name, dev, &st),
        ));
    }
    out
}

fn object(kind: ShmKind, name: String, dev: u64, st: &FileStat) -> ShmObject {
    ShmObject {
        kind,
        name,
        id: st.st_ino,
        size_kb: st.st_size.max(0) as u64 / 1024,
        resident_kb: (st.st_blocks.max(0) as u64).saturating_mul(512) / 1024,
        owner_tgid: None,
        mappers: 0,
        dev,
    }
}

/// The objects one process maps (its /proc/PID/maps) or holds (memfds
/// among its fds), each once; and those not `known` (no listing found
/// them: memfds, and /dev/shm files unlinked while still mapped, whose
/// pages live on), with their sizes.
pub fn mapped_or_held(pid: u32, known: &HashSet<Key>) -> (HashSet<Key>, Vec<(Key, ShmObject)>) {
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    if let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) {
        for (kind, ino, path) in shm_mappings(&maps) {
            let line = maps.lines().find_map(|l| {
                let m = maps_line(l)?;
                (m.inode == ino && m.path == path).then_some(m)
            });
            let dev = match (kind, line) {
                (ShmKind::Posix, Some(m)) => m.dev,
                _ => 0,
            };
            let key = (kind, dev, ino);
            if !seen.insert(key) || known.contains(&key) || kind == ShmKind::Sysv {
                continue;
            }
            let name = path.trim_end_matches(" (deleted)").to_string();
            // Its size from the mapping's own file: the kernel's link,
            // never a path the job named.
            let st = line.and_then(|m| {
                nix::sys::stat::stat(
                    format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end).as_str(),
                )
                .ok()
            });
            let o = match st {
                Some(st) => object(kind, name, dev, &st),
                None => ShmObject {
                    kind,
                    name,
                    id: ino,
                    size_kb: 0,
                    resident_kb: 0,
                    owner_tgid: None,
                    mappers: 0,
                    dev,
                },
            };
            found.push((key, o));
        }
    }
    if let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            let Ok(target) = fs::read_link(fd.path()) else {
                continue;
            };
            let t = target.to_string_lossy();
            if !t.starts_with("/memfd:") {
                continue;
            }
            // The fd's own file, through the kernel's link.
            let Ok(st) = nix::sys::stat::stat(&fd.path()) else {
                continue;
            };
            let key = (ShmKind::Memfd, 0, st.st_ino);
            seen.insert(key);
            let name = t.trim_end_matches(" (deleted)").to_string();
            found.push((key, object(ShmKind::Memfd, name, 0, &st)));
        }
    }
    (seen, found)
}
