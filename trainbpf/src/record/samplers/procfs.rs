//! What the recorder reads from /proc about the job's processes, beside the
//! kernel programs: command lines and torchrun ranks (for grouping),
//! unique and proportional memory (USS/PSS), and the parsers the
//! shared-memory look (`samplers/shm/look.rs`) reads SysV segments and mappings with.

use std::{collections::HashMap, fs, io::Read as _};

/// Which of a process's mappings lie on FUSE, not to be read.
pub mod backing;
/// Reads of what the job controls, on workers with a deadline.
pub mod guard;
/// A process's rank, run, Slurm step and cgroups, read at its exec.
pub mod identity;

use procfs_core::{FromBufRead, process::MemoryMaps};

/// Defined with the recording's events; re-exported for `smaps.rs`.
use trainbpf_report::decode::samples::{ProcInfo, ShmKind, ShmObject, Smaps};

/// The most of a command line read: the kernel allows a quarter of the
/// stack limit, megabytes, and each process's is recorded.
pub const MAX_CMDLINE_BYTES: u64 = 32 << 10;

/// The command line, and torchrun's rank from the identity variables read
/// at an exec (`identity::read`; a fork's are its parent's, and none are
/// read for it).
pub fn proc_info(
    tgid: u32,
    vars: Option<&std::collections::BTreeMap<String, String>>,
) -> Option<ProcInfo> {
    let mut raw = Vec::new();
    fs::File::open(format!("/proc/{tgid}/cmdline"))
        .ok()?
        .take(MAX_CMDLINE_BYTES + 1)
        .read_to_end(&mut raw)
        .ok()?;
    let cut = raw.len() as u64 > MAX_CMDLINE_BYTES;
    raw.truncate(MAX_CMDLINE_BYTES as usize);
    let mut cmdline: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    // Said where it was cut.
    if cut && let Some(last) = cmdline.last_mut() {
        last.push('…');
    }
    let var = |name: &str| vars?.get(name).and_then(|v| v.parse().ok());
    Some(ProcInfo {
        tgid,
        cmdline,
        rank: var("RANK"),
        local_rank: var("LOCAL_RANK"),
        ppid: ppid(tgid),
    })
}

/// /proc/PID/smaps_rollup's totals. `procfs_core` reads the file: its
/// figures are bytes, ours kB.
pub fn parse_smaps_rollup(tgid: u32, text: &str) -> Smaps {
    let mut s = Smaps {
        tgid,
        ..Default::default()
    };
    let Ok(maps) = MemoryMaps::from_buf_read(text.as_bytes()) else {
        return s;
    };
    let Some(rollup) = maps.iter().next() else {
        return s;
    };
    let kb = |k: &str| rollup.extension.map.get(k).copied().unwrap_or(0) / 1024;
    s.rss_kb = kb("Rss");
    s.pss_kb = kb("Pss");
    s.uss_kb = kb("Private_Clean") + kb("Private_Dirty");
    s.shared_kb = kb("Shared_Clean") + kb("Shared_Dirty");
    s.swap_kb = kb("Swap");
    s
}

pub fn smaps(tgid: u32) -> Option<Smaps> {
    let text = fs::read_to_string(format!("/proc/{tgid}/smaps_rollup")).ok()?;
    Some(parse_smaps_rollup(tgid, &text))
}

/// SysV segments: `key shmid perms size cpid lpid nattch uid gid cuid cgid
/// atime dtime ctime rss swap` (rss/swap since Linux 4.x).
pub fn parse_sysvipc(text: &str) -> Vec<ShmObject> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    let col = |n: &str| header.iter().position(|h| *h == n);
    let (Some(id), Some(size), Some(cpid)) = (col("shmid"), col("size"), col("cpid")) else {
        return out;
    };
    let rss = col("rss");
    let key = col("key");
    for line in lines {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: Option<usize>| i.and_then(|i| f.get(i)?.parse::<u64>().ok());
        let Some(shmid) = num(Some(id)) else { continue };
        let size_kb = num(Some(size)).unwrap_or(0) / 1024;
        out.push(ShmObject {
            kind: ShmKind::Sysv,
            name: format!("key {}", key.and_then(|k| f.get(k)).unwrap_or(&"?")),
            id: shmid,
            size_kb,
            resident_kb: num(rss).map_or(size_kb, |b| b / 1024),
            owner_tgid: num(Some(cpid)).map(|p| p as u32),
            mappers: 0,
            dev: 0,
        });
    }
    out
}

/// The shared-memory mappings in a /proc/PID/maps text: kind, inode (the
/// shmid for SysV) and path. Lines are `start-end perms offset dev inode
/// path`, and the path is the rest of the line, blanks included.
/// (`procfs_core::MemoryMaps` reads this format too, but panics on a path
/// that starts with `/SYSV` and is shorter than a SysV name, which any job
/// can create.)
pub fn shm_mappings(maps: &str) -> Vec<(ShmKind, u64, &str)> {
    let mut out = Vec::new();
    for m in maps.lines().filter_map(maps_line) {
        let path = m.path;
        let kind = if path.starts_with("/dev/shm/") {
            ShmKind::Posix
        } else if path.starts_with("/SYSV") {
            // The maps line's inode is the shmid for SysV.
            ShmKind::Sysv
        } else if path.starts_with("/memfd:") {
            ShmKind::Memfd
        } else {
            continue;
        };
        out.push((kind, m.inode, path));
    }
    out
}

/// One line of /proc/PID/maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapsLine<'a> {
    pub start: u64,
    pub end: u64,
    /// The file's device (`makedev`), and its inode (a SysV segment's shmid).
    pub dev: u64,
    pub inode: u64,
    /// The rest of the line, blanks included; empty for anonymous memory.
    pub path: &'a str,
}

/// `start-end perms offset major:minor inode path`: the kernel writes the
/// first five fields with one blank between them, then pads before the
/// path, which runs to the end of the line.
pub fn maps_line(line: &str) -> Option<MapsLine<'_>> {
    let mut f = line.splitn(6, ' ');
    let (range, _perms, _offset, dev, inode) =
        (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let path = f.next().unwrap_or("").trim_start();
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    let hex32 = |s: &str| u32::from_str_radix(s, 16).ok();
    Some(MapsLine {
        start: hex(start)?,
        end: hex(end)?,
        dev: libc::makedev(hex32(major)?, hex32(minor)?),
        inode: inode.parse().ok()?,
        path,
    })
}

/// Every process on the machine now (as this pid namespace sees it).
pub fn pids() -> Vec<u32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

/// `pid` and every process descending from it, from the parent links in
/// /proc/*/stat.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(pp) = ppid(p) {
                children.entry(pp).or_default().push(p);
            }
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        if let Some(c) = children.get(&out[i]) {
            out.extend(c);
        }
        i += 1;
    }
    out
}

/// The parent pid, from /proc/PID/stat (the field after the parenthesised
/// comm, which may itself hold spaces and parentheses).
pub fn ppid(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` runs the recorder's own program: the job's first
/// process between its fork from the recorder and its exec. What it runs
/// then is the recorder's code, not the job's, and reading its symbols
/// (a debug build's are hundreds of MB) would only delay the job's own.
pub fn runs_the_recorder(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(theirs), Ok(ours)) = (
        fs::metadata(format!("/proc/{pid}/exe")),
        fs::metadata("/proc/self/exe"),
    ) else {
        return false;
    };
    (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino())
}

/// Whether a process with this pid exists, a zombie included: one
/// `kill(pid, 0)`, no `/proc` path walked. For sweeping a set of pids
/// whose exits might have been missed, where [`alive`]'s read of
/// `/proc/PID/stat` for each of thousands cost `record --all` a third of
/// its CPU.
pub fn exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; it only checks that the pid exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Whether the process still runs: it exists and is not a zombie waiting
/// for its parent to reap it.
pub fn alive(tgid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{tgid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, Some("Z") | Some("X") | None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_exists_until_it_is_reaped() {
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(exists(pid));
        child.kill().unwrap();
        // Killed, not reaped: a zombie exists, and is not alive.
        while alive(pid) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(exists(pid));
        child.wait().unwrap();
        assert!(!exists(pid));
        assert!(!exists(0));
        assert!(!exists(u32::MAX));
    }

    #[test]
    fn the_recorder_knows_its_own_program() {
        assert!(runs_the_recorder(std::process::id()));
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let theirs = runs_the_recorder(child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(!theirs);
    }

    #[test]
    fn smaps_rollup_sums_private_and_shared() {
        let s = parse_smaps_rollup(
            7,
            "55d0c0000000-7ffc00000000 ---p 00000000 00:00 0  [rollup]\n\
             Rss:              300000 kB\nPss:              120000 kB\n\
             Shared_Clean:      10000 kB\nShared_Dirty:     200000 kB\n\
             Private_Clean:      1000 kB\nPrivate_Dirty:     89000 kB\n\
             Swap:                 0 kB\n",
        );
        assert_eq!(
            (s.rss_kb, s.pss_kb, s.uss_kb, s.shared_kb),
            (300_000, 120_000, 90_000, 210_000)
        );
    }

    #[test]
    fn sysvipc_table() {
        let t = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                 \x20        0          3  1600             536870912  4242  4250      4     0     0     0     0 1700000000 0 1700000000 268435456 0\n";
        let o = parse_sysvipc(t);
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].id, 3);
        assert_eq!(o[0].size_kb, 512 * 1024);
        assert_eq!(o[0].resident_kb, 256 * 1024);
        assert_eq!(o[0].owner_tgid, Some(4242));
    }

    /// A maps path with blanks was cut at the first one, so `/dev/shm/a b`
    /// read as `/dev/shm/a`, and a memfd's name lost all after its first
    /// word.
    #[test]
    fn maps_paths_keep_their_blanks() {
        let maps = "\
7f0000000000-7f0000100000 rw-s 00000000 00:1a 4242                       /dev/shm/torch batch 1
7f0000100000-7f0000200000 rw-s 00000000 00:01 1028                       /memfd:torch shm (deleted)
7f0000200000-7f0000300000 rw-s 00000000 00:01 7                          /SYSV00000000 (deleted)
7f0000300000-7f0000400000 r-xp 00000000 fd:01 99                         /usr/lib/my lib.so
7f0000400000-7f0000500000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";
        assert_eq!(
            shm_mappings(maps),
            vec![
                (ShmKind::Posix, 4242, "/dev/shm/torch batch 1"),
                (ShmKind::Memfd, 1028, "/memfd:torch shm (deleted)"),
                (ShmKind::Sysv, 7, "/SYSV00000000 (deleted)"),
            ]
        );
    }
}
