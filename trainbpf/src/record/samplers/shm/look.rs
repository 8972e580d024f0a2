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
//!
//! Every read the job can make wait (its maps, behind its memory map's
//! lock; its /dev/shm, which may be a filesystem that does not answer) is
//! made on a worker with a deadline (`read.rs`, `procfs::guard`), and a
//! process or directory whose read stalled once is not read again: a
//! wedged job costs one abandoned read, not the looks that follow.

use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    fs,
    os::fd::OwnedFd,
    sync::Arc,
    time::Duration,
};

use trainbpf_report::decode::samples::{ShmFs, ShmObject};

use super::read::{self, Fs, Key};
use crate::record::samplers::procfs::{
    guard::{DEADLINE, Readers, STATS, Stall, Stalled},
    parse_sysvipc,
};

/// Mount namespaces and roots followed at once: a job has one or a few.
const MAX_NAMESPACES: usize = 16;

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
    /// The looks' own workers: a stalled read here never costs the
    /// identities or the stacks theirs.
    readers: Readers,
    /// Processes whose maps, and places whose /dev/shm, stalled a read.
    stalled: Stalled<u32>,
    stalled_dirs: Stalled<View>,
    /// CPU time the last look's reads took on their workers: with the
    /// looking thread's own, the look's cost, which paces the looks.
    pub read_cpu: Duration,
}

impl ShmLooker {
    /// The objects, biggest first, and the /dev/shm filesystems: the
    /// recorder's own and each the job's processes (`job`) see; the maps
    /// and descriptors read are those of `scan` (`pick.rs`: all of a small
    /// job, a slice of a big one).
    pub fn look(&mut self, job: &[u32], scan: &[u32]) -> (Vec<ShmObject>, Vec<ShmFs>) {
        self.read_cpu = Duration::ZERO;
        let mut objs: HashMap<Key, ShmObject> = HashMap::new();
        let mut pids: Vec<u32> = job.to_vec();
        pids.sort_unstable();
        pids.dedup();
        let fs = self.filesystems(&pids, &mut objs);
        let mut pids: Vec<u32> = scan.to_vec();
        pids.sort_unstable();
        pids.dedup();
        if let Ok(t) = fs::read_to_string("/proc/sysvipc/shm") {
            for o in parse_sysvipc(&t) {
                if let Some(p) = o.owner_tgid {
                    self.owners.entry((o.kind, 0, o.id)).or_insert(p);
                }
                objs.insert((o.kind, 0, o.id), o);
            }
        }
        // What was found so far, for the workers: they stat only objects
        // not in it.
        let known: Arc<HashSet<Key>> = Arc::new(objs.keys().copied().collect());
        // Sorted so that "first seen" means the lowest pid, the likeliest
        // creator, when several appear in one look.
        for pid in pids {
            if self.stalled.contains(&pid) {
                continue;
            }
            let known = known.clone();
            let what = || format!("pid {pid}: its maps and descriptors");
            let r = self.guarded(what, move || read::mapped_or_held(pid, &known));
            let Ok((seen, found)) = self.stalled.note(pid, r) else {
                continue;
            };
            for (key, o) in found {
                objs.insert(key, o);
            }
            for key in seen {
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

    /// `f` on a worker, waited for [`DEADLINE`] at most. `Err` when it
    /// was not made or not waited for, said in the recording's notes
    /// (`what` names it); a stalled read is counted there too.
    fn guarded<T: Send + 'static>(
        &mut self,
        what: impl FnOnce() -> String,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Stall> {
        match self.readers.run_timed(DEADLINE, f) {
            Ok((v, cpu)) => {
                self.read_cpu += cpu;
                Ok(v)
            }
            Err(e) => {
                STATS.note(|| format!("{}, for shared memory: {e}", what()));
                Err(e)
            }
        }
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
            if now.len() >= MAX_NAMESPACES || self.stalled_dirs.contains(&ns) {
                continue;
            }
            // Opened again on each look: the job may mount over /dev/shm
            // at any time. A process that cannot be read (exiting) leaves
            // the namespace to the next one in it.
            let what = || format!("pid {pid}: its /dev/shm");
            match self.guarded(what, move || read::open_shm_dir(pid)) {
                Ok(Some(dir)) => {
                    self.dirs.insert(ns, dir);
                    now.push((ns, job));
                }
                Ok(None) => {}
                Err(e) => self.stall_dir(ns, e),
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
            let Some(dir) = self.dirs.get(&ns).and_then(|d| d.try_clone().ok()) else {
                continue;
            };
            let listed: Vec<u64> = out.iter().map(|f| f.dev).collect();
            let what = || "a /dev/shm of the job".to_string();
            match self.guarded(what, move || read::describe(&dir, &listed)) {
                Ok(Some(Fs::Listed(dev))) => {
                    if let Some(f) = out.iter_mut().find(|f| f.dev == dev) {
                        f.job |= job;
                    }
                }
                Ok(Some(Fs::New(mut f, found))) => {
                    f.job = job;
                    out.push(f);
                    objs.extend(found);
                }
                Ok(None) => {}
                Err(e) => self.stall_dir(ns, e),
            }
        }
        for ns in gone {
            self.dirs.remove(&ns);
        }
        out
    }

    /// A place whose /dev/shm failed a read: its directory let go, and
    /// where the read stalled, not opened again.
    fn stall_dir(&mut self, ns: View, e: Stall) {
        self.dirs.remove(&ns);
        let _ = self.stalled_dirs.note(ns, Err::<(), _>(e));
    }
}

/// Where a process stands: its mount namespace (the inode of its ns
/// link) and its root directory (a chroot, a container's pivot_root).
/// Processes that share both see one /dev/shm.
type View = (u64, u64, u64);

fn view(pid: u32) -> Option<View> {
    let ns = cached_stat(&format!("/proc/{pid}/ns/mnt"))?;
    // The kernel's link to its root, followed on purpose; its attributes
    // as the kernel holds them, so that a root on a filesystem that does
    // not answer is never asked.
    let root = cached_stat(&format!("/proc/{pid}/root"))?;
    Some((ns.1, root.0, root.1))
}

/// `(device, inode)` of `path` without asking its filesystem
/// (`AT_STATX_DONT_SYNC`): the path is the kernel's, under /proc.
fn cached_stat(path: &str) -> Option<(u64, u64)> {
    let c = CString::new(path).ok()?;
    // SAFETY: all-zero is a valid statx buffer.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a buffer of ours.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_INO,
            &mut st,
        )
    };
    (r == 0).then(|| {
        (
            libc::makedev(st.stx_dev_major, st.stx_dev_minor),
            st.stx_ino,
        )
    })
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
        let me = [std::process::id()];
        let (objs, fs) = l.look(&me, &me);
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
