//! One look at shared memory as the job sees it: the files in each of its
//! /dev/shm filesystems (a job in a container or a private mount namespace
//! has its own), with the filesystem's size and free space, the SysV
//! segments, and the memfds and deleted files its processes still map.
//! Each object once, with the first job process seen with it.
//!
//! The job's /dev/shm is reached through `/proc/PID/root`, and the rest of
//! the path is resolved with `openat2(RESOLVE_IN_ROOT)`: a link the job
//! planted at its /dev/shm resolves inside the job's root, never to the
//! recorder's files. Files in it are read with `fstatat(AT_SYMLINK_NOFOLLOW)`
//! relative to that directory, so no path the job controls is followed.

use std::{
    collections::{HashMap, HashSet},
    fs,
    os::{
        fd::{AsFd, OwnedFd},
        unix::fs::MetadataExt,
    },
};

use nix::{
    fcntl::{OFlag, OpenHow, ResolveFlag, openat2},
    sys::stat::{FileStat, Mode},
};
use trainbpf_report::decode::samples::{ShmFs, ShmKind, ShmObject};

use crate::record::samplers::procfs::{maps_line, parse_sysvipc, shm_mappings};

/// Mount namespaces and roots followed at once: a job has one or a few.
const MAX_NAMESPACES: usize = 16;
/// Files listed per /dev/shm: a job that makes millions of them must not
/// make each look take seconds.
const MAX_FILES: usize = 4096;

type Key = (ShmKind, u64, u64);

/// Remembers owners across looks, so an object keeps the first process
/// seen with it after that process exits, and the job's /dev/shm
/// directories, so that a look taken just after the job's last process in
/// a namespace died (a bus error) still finds its filesystem.
#[derive(Default)]
pub struct ShmLooker {
    owners: HashMap<Key, u32>,
    /// By where a process stands ([`View`]): the /dev/shm directory last
    /// opened from there.
    dirs: HashMap<View, OwnedFd>,
}

impl ShmLooker {
    /// The objects, biggest first, and the /dev/shm filesystems: the
    /// recorder's own and each the job's processes (`job`) see.
    pub fn look(&mut self, job: &[u32]) -> (Vec<ShmObject>, Vec<ShmFs>) {
        let mut objs: HashMap<Key, ShmObject> = HashMap::new();
        let mut pids: Vec<u32> = job.to_vec();
        pids.sort_unstable();
        pids.dedup();
        let fs = self.filesystems(&pids, &mut objs);
        if let Ok(t) = fs::read_to_string("/proc/sysvipc/shm") {
            for o in parse_sysvipc(&t) {
                if let Some(p) = o.owner_tgid {
                    self.owners.entry((o.kind, 0, o.id)).or_insert(p);
                }
                objs.insert((o.kind, 0, o.id), o);
            }
        }
        // Sorted so that "first seen" means the lowest pid, the likeliest
        // creator, when several appear in one look.
        for &pid in &pids {
            for key in mapped_or_held(pid, &mut objs) {
                if let Some(o) = objs.get_mut(&key) {
                    o.mappers += 1;
                }
                self.owners.entry(key).or_insert(pid);
            }
        }
        let mut out: Vec<ShmObject> = objs
            .into_iter()
            .map(|(key, mut o)| {
                o.owner_tgid = self.owners.get(&key).copied().or(o.owner_tgid);
                o
            })
            .collect();
        out.sort_by(|a, b| b.resident_kb.cmp(&a.resident_kb).then(a.id.cmp(&b.id)));
        // Forget objects that are gone, so the map stays bounded.
        let live: HashSet<Key> = out.iter().map(|o| (o.kind, o.dev, o.id)).collect();
        self.owners.retain(|k, _| live.contains(k));
        (out, fs)
    }

    /// Lists each /dev/shm once (by device) into `objs`, and says what
    /// each holds. A namespace whose processes are all gone gets this one
    /// last look through the directory kept from before, then is let go:
    /// the open directory would keep its filesystem, and its memory, alive.
    fn filesystems(&mut self, pids: &[u32], objs: &mut HashMap<Key, ShmObject>) -> Vec<ShmFs> {
        let mut now: Vec<(View, bool)> = Vec::new();
        let me = std::process::id();
        for &pid in std::iter::once(&me).chain(pids) {
            let Some(ns) = view(pid) else { continue };
            let job = pid != me;
            if let Some(seen) = now.iter_mut().find(|(n, _)| *n == ns) {
                seen.1 |= job;
                continue;
            }
            if now.len() >= MAX_NAMESPACES {
                continue;
            }
            // Opened again on each look: the job may mount over /dev/shm
            // at any time. A process that cannot be read (exiting) leaves
            // the namespace to the next one in it.
            if let Some(dir) = open_shm_dir(pid) {
                self.dirs.insert(ns, dir);
                now.push((ns, job));
            }
        }
        let mut out: Vec<ShmFs> = Vec::new();
        let gone: Vec<View> = self
            .dirs
            .keys()
            .filter(|ns| !now.iter().any(|(n, _)| n == *ns))
            .copied()
            .collect();
        let order = now.iter().copied().chain(gone.iter().map(|&ns| (ns, true)));
        for (ns, job) in order {
            let Some(dir) = self.dirs.get(&ns) else {
                continue;
            };
            let Ok(st) = nix::sys::stat::fstat(dir) else {
                continue;
            };
            let dev = st.st_dev;
            if let Some(f) = out.iter_mut().find(|f| f.dev == dev) {
                f.job |= job;
                continue;
            }
            let Ok(vfs) = nix::sys::statvfs::fstatvfs(dir) else {
                continue;
            };
            let frsize = vfs.fragment_size();
            out.push(ShmFs {
                dev,
                size_kb: vfs.blocks().saturating_mul(frsize) / 1024,
                free_kb: vfs.blocks_free().saturating_mul(frsize) / 1024,
                job,
            });
            list(dir, dev, objs);
        }
        for ns in gone {
            self.dirs.remove(&ns);
        }
        out
    }
}

/// Where a process stands: its mount namespace (the inode of its ns
/// link) and its root directory (a chroot, a container's pivot_root).
/// Processes that share both see one /dev/shm.
type View = (u64, u64, u64);

fn view(pid: u32) -> Option<View> {
    let ns = fs::metadata(format!("/proc/{pid}/ns/mnt")).ok()?;
    // The kernel's link to its root, followed on purpose.
    let root = fs::metadata(format!("/proc/{pid}/root")).ok()?;
    Some((ns.ino(), root.dev(), root.ino()))
}

/// The process's /dev/shm, resolved inside its own root.
fn open_shm_dir(pid: u32) -> Option<OwnedFd> {
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

/// The regular files in one /dev/shm, at most [`MAX_FILES`].
fn list(dir: &OwnedFd, dev: u64, objs: &mut HashMap<Key, ShmObject>) {
    // A fresh open file description: the kept one's offset stays put.
    let Ok(mut d) = nix::dir::Dir::openat(
        dir.as_fd(),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return;
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
        objs.insert(
            (ShmKind::Posix, dev, st.st_ino),
            object(ShmKind::Posix, name, dev, &st),
        );
    }
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
/// among its fds), each once; adds those no listing found: memfds, and
/// /dev/shm files unlinked while still mapped (their pages live on).
fn mapped_or_held(pid: u32, objs: &mut HashMap<Key, ShmObject>) -> HashSet<Key> {
    let mut seen = HashSet::new();
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
            if !seen.insert(key) || objs.contains_key(&key) || kind == ShmKind::Sysv {
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
            objs.insert(key, o);
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
            objs.insert(key, object(ShmKind::Memfd, name, 0, &st));
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorder's own /dev/shm is listed with its size, and a file
    /// made there is found, once, with the process that maps it.
    #[test]
    fn a_mapped_file_in_dev_shm_is_found_with_its_mapper() {
        use std::os::unix::fs::OpenOptionsExt;
        let name = format!("trainbpf-unit-{}", std::process::id());
        let path = format!("/dev/shm/{name}");
        let Ok(f) = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        else {
            return; // no /dev/shm here: nothing to look at
        };
        f.set_len(1 << 20).unwrap();
        // SAFETY: a fresh shared mapping of a file this test owns.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                1 << 20,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: within the mapping just made.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 1, 1 << 20) };
        let mut l = ShmLooker::default();
        let (objs, fs) = l.look(&[std::process::id()]);
        let _ = fs::remove_file(&path);
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, 1 << 20) };
        let ours: Vec<_> = objs.iter().filter(|o| o.name == path).collect();
        assert_eq!(ours.len(), 1, "{objs:#?}");
        assert_eq!(ours[0].size_kb, 1024);
        assert_eq!(ours[0].resident_kb, 1024);
        assert_eq!(ours[0].mappers, 1);
        assert_eq!(ours[0].owner_tgid, Some(std::process::id()));
        let shm = fs.iter().find(|f| f.dev == ours[0].dev).expect("its fs");
        assert!(shm.size_kb >= shm.free_kb && shm.size_kb >= 1024, "{fs:?}");
    }
}
