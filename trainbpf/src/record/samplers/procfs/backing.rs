//! What backs a job process's memory: whether an address, or a mapped
//! file, lies on a filesystem whose server can keep a reader waiting as
//! long as it likes. FUSE is such a filesystem, and its server may be the
//! job itself (`fusermount`, or a user namespace, lets any user mount
//! one): a read of such a page waits for the server, past a kill once the
//! server has the request. The recorder skips those pages and files, and
//! says so (`procfs::guard`); the deadline on every read covers a mapping
//! made after this look.
//!
//! Network filesystems (NFS, CIFS, Ceph, Lustre) are not skipped: root
//! mounts them, not the job, and a cluster's Python often lives on one;
//! a hung server is caught by the deadline.
//!
//! Read from `/proc/PID/maps` (each mapping's device) and the process's
//! own `/proc/PID/mountinfo` (each device's filesystem type, in its mount
//! namespace): neither asks the filesystem anything, where `statfs(2)` of
//! a FUSE file would ask its server.

use std::{collections::HashMap, fs::File, io::Read};

/// The most of a maps or mountinfo file read (65,530 mappings of about
/// 100 bytes each is 6.5 MB).
const MAX_READ: u64 = 8 << 20;

/// Whether a filesystem type is one whose reads a user's server answers.
pub fn stalls(fstype: &str) -> bool {
    fstype == "fuse" || fstype == "fuseblk" || fstype.starts_with("fuse.")
}

/// A process's mappings on such filesystems.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Backing {
    /// `[start, end)` and the filesystem type.
    ranges: Vec<(u64, u64, String)>,
    /// Devices of such filesystems (a file mapped is one of theirs).
    devs: HashMap<u64, String>,
    /// Where the maps file was cut short: past it nothing is known.
    cut_at: Option<u64>,
}

impl Backing {
    /// Looks at `pid` now.
    pub fn of(pid: u32) -> std::io::Result<Backing> {
        let (maps, cut) = read_capped(&format!("/proc/{pid}/maps"))?;
        let (mounts, _) = read_capped(&format!("/proc/{pid}/mountinfo"))?;
        Ok(Backing::build(&maps, &mounts, cut))
    }

    /// From a maps text and a mountinfo text, both whole.
    pub fn parse(maps: &str, mountinfo: &str) -> Backing {
        Backing::build(maps, mountinfo, false)
    }

    /// `cut`: the maps text was cut short by the read's bound, and what
    /// lies past its last line is unknown.
    fn build(maps: &str, mountinfo: &str, cut: bool) -> Backing {
        let devs: HashMap<u64, String> = crate::util::mounts::fs_types_by_dev(mountinfo)
            .into_iter()
            .filter(|(_, t)| stalls(t))
            .collect();
        let mut ranges = Vec::new();
        let mut last_end = 0;
        for line in maps.lines() {
            let Some(m) = super::maps_line(line) else {
                continue;
            };
            last_end = last_end.max(m.end);
            // Anonymous memory has device 0:0; a file's pages are read from
            // its filesystem.
            if m.inode != 0
                && let Some(t) = devs.get(&m.dev)
            {
                ranges.push((m.start, m.end, t.clone()));
            }
        }
        Backing {
            ranges,
            devs,
            cut_at: cut.then_some(last_end),
        }
    }

    /// Why `[addr, addr + len)` must not be read: the filesystem type of
    /// a mapping it overlaps, or that it lies past what the look saw.
    pub fn at(&self, addr: u64, len: u64) -> Option<&str> {
        let end = addr.saturating_add(len.max(1));
        if self.cut_at.is_some_and(|c| end > c) {
            return Some("unknown (the process's maps were too long to read whole)");
        }
        self.ranges
            .iter()
            .find(|(s, e, _)| addr < *e && *s < end)
            .map(|(_, _, t)| t.as_str())
    }

    /// The filesystem type of device `dev`, where it is one to skip.
    pub fn dev(&self, dev: u64) -> Option<&str> {
        self.devs.get(&dev).map(String::as_str)
    }
}

/// Reads at most `MAX_READ` bytes; says whether the file was longer.
fn read_capped(path: &str) -> std::io::Result<(String, bool)> {
    let mut buf = Vec::new();
    File::open(path)?.take(MAX_READ + 1).read_to_end(&mut buf)?;
    let cut = buf.len() as u64 > MAX_READ;
    if cut {
        buf.truncate(MAX_READ as usize);
        // Only whole lines.
        let end = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        buf.truncate(end);
    }
    Ok((String::from_utf8_lossy(&buf).into_owned(), cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
41 22 0:41 / /mnt/sshfs rw,nosuid,nodev,relatime shared:20 - fuse.sshfs me@host:/ rw,user_id=1000
42 22 0:42 / /tmp/stall rw,nosuid,nodev,relatime - fuse trainbpf-stall rw,user_id=0
43 22 0:43 / /dev/shm rw shared:5 - tmpfs tmpfs rw
44 22 0:44 / /nfs rw shared:6 - nfs4 server:/export rw
";

    const MAPS: &str = "\
55d0c0a00000-55d0c0a20000 r--p 00000000 fe:01 1234                       /usr/bin/python3.11
7f0000000000-7f0000001000 r--p 00000000 00:2a 2                          /tmp/stall/f
7f0000001000-7f0000100000 rw-p 00000000 00:00 0 
7f0000100000-7f0000200000 r-xp 00000000 00:29 77                         /mnt/sshfs/lib/libpython3.11.so.1.0
7f0000200000-7f0000300000 rw-s 00000000 00:2b 9                          /dev/shm/x
7f0000300000-7f0000400000 r--p 00000000 00:2c 5                          /nfs/lib.so
";

    #[test]
    fn fuse_mappings_are_found_by_their_device() {
        let b = Backing::parse(MAPS, MOUNTINFO);
        assert_eq!(b.at(0x7f0000000010, 8), Some("fuse"));
        // A read that starts before and runs into it.
        assert_eq!(b.at(0x7effffffffff, 2), Some("fuse"));
        assert_eq!(b.at(0x7f0000100800, 64), Some("fuse.sshfs"));
        // Anonymous memory, ext4, tmpfs, NFS: read.
        assert_eq!(b.at(0x7f0000001000, 4096), None);
        assert_eq!(b.at(0x55d0c0a00100, 8), None);
        assert_eq!(b.at(0x7f0000200000, 8), None);
        assert_eq!(b.at(0x7f0000300000, 8), None);
        assert_eq!(b.dev(libc::makedev(0, 0x29)), Some("fuse.sshfs"));
        assert_eq!(b.dev(libc::makedev(0, 0x2b)), None);
    }

    #[test]
    fn what_a_cut_maps_file_did_not_show_is_unknown() {
        let b = Backing::build(
            &MAPS[..MAPS.find("7f0000001000-").unwrap()],
            MOUNTINFO,
            true,
        );
        assert!(b.at(0x7f0000001000, 8).unwrap().starts_with("unknown"));
        assert_eq!(b.at(0x55d0c0a00100, 8), None);
    }

    #[test]
    fn fuse_types() {
        for t in ["fuse", "fuseblk", "fuse.sshfs", "fuse.gcsfuse"] {
            assert!(stalls(t), "{t}");
        }
        for t in ["ext4", "nfs4", "tmpfs", "overlay", "fusectl", "virtiofs"] {
            assert!(!stalls(t), "{t}");
        }
    }

    #[test]
    fn looks_at_its_own_process() {
        let b = Backing::of(std::process::id()).unwrap();
        let here = &b as *const Backing as u64;
        assert_eq!(b.at(here, 8), None);
    }
}
