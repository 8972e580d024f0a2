//! The `libcuda.so*` files a job process maps, from `/proc/PID/maps`: what
//! the recorder then pins through `/proc/PID/map_files` ([`super::pinned`]).

use std::{fs, path::PathBuf};

use super::is_libcuda;

/// A `libcuda.so*` mapping of a job process.
pub(super) struct Mapped {
    /// The name maps shows: the job's to choose, shown only.
    pub name: PathBuf,
    pub range: (u64, u64),
    pub dev: u64,
    pub ino: u64,
}

/// `libcuda.so*` files a process maps, one entry per file.
pub(super) fn mapped_libcuda(pid: u32) -> Vec<Mapped> {
    let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let mut out: Vec<Mapped> = Vec::new();
    for line in maps.lines() {
        let Some(m) = parse_maps_line(line) else {
            continue;
        };
        if is_libcuda(m.name.file_name().unwrap_or_default())
            && !out.iter().any(|o| (o.dev, o.ino) == (m.dev, m.ino))
        {
            out.push(m);
        }
    }
    out
}

/// `start-end perms offset major:minor inode   /path`; `None` for an
/// anonymous mapping or a line that is not one.
/// A maps line naming a file (`crate::record::samplers::procfs::maps_line`, which keeps a
/// path's blanks).
fn parse_maps_line(line: &str) -> Option<Mapped> {
    let m = crate::record::samplers::procfs::maps_line(line)?;
    if !m.path.starts_with('/') {
        return None;
    }
    Some(Mapped {
        name: PathBuf::from(m.path),
        range: (m.start, m.end),
        dev: m.dev,
        ino: m.inode,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn maps_lines() {
        let m = parse_maps_line(
            "7f1c2a000000-7f1c2a021000 r-xp 00001000 fd:01 2621519    /tmp/a b/libcuda.so.1 (deleted)",
        )
        .unwrap();
        assert_eq!(m.range, (0x7f1c2a000000, 0x7f1c2a021000));
        assert_eq!(m.dev, libc::makedev(0xfd, 1));
        assert_eq!(m.ino, 2621519);
        assert_eq!(m.name, Path::new("/tmp/a b/libcuda.so.1 (deleted)"));
        assert!(parse_maps_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0    [stack]").is_none());
        assert!(parse_maps_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0").is_none());
    }
}
