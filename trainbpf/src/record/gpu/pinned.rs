//! A library file to probe, held by a descriptor from the moment it is
//! found.
//!
//! A path is resolved once, by `open(O_PATH)`, and everything after that
//! (the ELF symbol table, the attach) goes through `/proc/self/fd/N` of
//! that descriptor: `perf_event_open`'s uprobe path and the read below both
//! land on the inode the descriptor holds, whatever the path names by
//! then. A library a job maps is reached through `/proc/PID/map_files`,
//! which names the very file mapped, never through the job's path, and its
//! device and inode must be those of the maps line. Only regular files are
//! probed, never one on FUSE: a user's process serves its reads, and could
//! stall the recorder in them.
//!
//! The symbols' offsets are computed here and handed to aya as absolute
//! offsets: aya's own look-up would also open `.gnu_debuglink`, a path the
//! library's author chooses.
//!
//! What is parsed is opened with the job's user's credentials:
//! the recorder reads, and puts its breakpoints on, only a
//! file that user may read. The descriptor's magic link makes the kernel
//! check the file's own permissions for the opener, as an open of its
//! path would. The symbol tables are read within fixed bounds
//! ([`super::elf`]).

use std::{
    fs::File,
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{ffi::OsStrExt as _, fs::MetadataExt as _},
    },
    path::{Path, PathBuf},
};

use crate::util::safe_file::{FileError, Owner, as_owner};

/// `statfs.f_type` of FUSE.
const FUSE_SUPER_MAGIC: u64 = 0x6573_5546;

pub(super) struct Pinned {
    fd: OwnedFd,
    pub dev: u64,
    pub ino: u64,
}

impl Pinned {
    /// The file `path` names now (links followed once, here).
    pub fn open(path: &Path) -> Result<Pinned, String> {
        Self::open_path(path)
    }

    /// The file mapped at `range` (`start-end`, as in maps) of `pid`, which
    /// the maps line said is `dev`/`ino`.
    pub fn mapped(pid: u32, range: (u64, u64), dev: u64, ino: u64) -> Result<Pinned, String> {
        let p = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", range.0, range.1));
        let pinned = Self::open_path(&p)?;
        if (pinned.dev, pinned.ino) != (dev, ino) {
            return Err(format!(
                "the mapping now holds another file (device {} inode {}, maps said {dev} {ino})",
                pinned.dev, pinned.ino
            ));
        }
        Ok(pinned)
    }

    /// The file open as descriptor `fd` of thread `tid` (a job thread the
    /// kernel holds inside its mmap of it), which the kernel said is
    /// `dev`/`ino`.
    pub fn descriptor(tid: u32, fd: i32, dev: u64, ino: u64) -> Result<Pinned, String> {
        let p = PathBuf::from(format!("/proc/{tid}/fd/{fd}"));
        let pinned = Self::open_path(&p)?;
        if (pinned.dev, pinned.ino) != (dev, ino) {
            return Err(format!(
                "descriptor {fd} now holds another file (device {} inode {}, the kernel said {dev} {ino})",
                pinned.dev, pinned.ino
            ));
        }
        Ok(pinned)
    }

    fn open_path(path: &Path) -> Result<Pinned, String> {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| "the path holds a NUL byte".to_string())?;
        // SAFETY: valid C string; the fd returned is ours. O_PATH opens
        // nothing: no device's open, no FIFO's wait.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error().to_string());
        }
        // SAFETY: just opened, ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: zeroed stat/statfs are valid out values; valid fd.
        let (st, fs) = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            let mut fs: libc::statfs = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &mut st) != 0
                || libc::fstatfs(fd.as_raw_fd(), &mut fs) != 0
            {
                return Err(io::Error::last_os_error().to_string());
            }
            (st, fs)
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err("not a regular file".into());
        }
        // Signed on glibc, unsigned on musl.
        if fs.f_type as u64 == FUSE_SUPER_MAGIC {
            return Err("on a FUSE file system, which a user's process may serve".into());
        }
        Ok(Pinned {
            fd,
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }

    /// The descriptor's magic link: resolves to the pinned inode alone.
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// The file offset of each of `symbols` the file exports (`None` for
    /// one it does not), read through the descriptor, opened as `owner`.
    pub fn offsets(&self, owner: Owner, symbols: &[&str]) -> Result<Vec<Option<u64>>, ReadError> {
        let path = self.proc_path();
        let f = as_owner(owner, || {
            File::open(&path).map_err(|err| FileError::Io {
                what: "opening".into(),
                err,
            })
        })
        .map_err(|e| ReadError::Unreadable {
            uid: owner.uid,
            why: match e {
                FileError::Io { err, .. } => err.to_string(),
                e => e.to_string(),
            },
        })?;
        let m = f.metadata().map_err(|e| ReadError::Other(e.to_string()))?;
        if (m.dev(), m.ino()) != (self.dev, self.ino) {
            return Err(ReadError::Other(
                "the descriptor reopened another file".into(),
            ));
        }
        // Read, not mapped (a file truncated meanwhile ends short, where a
        // mapping would kill the recorder with SIGBUS), and only the parts
        // the symbol tables need, within their bounds.
        super::elf::symbol_offsets(&f, symbols).map_err(|e| match e {
            super::elf::ElfError::TooBig(why) => ReadError::TooBig(why),
            super::elf::ElfError::Bad(why) => ReadError::Other(why),
        })
    }
}

/// Why a library's symbols were not read.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    /// The job's user may not read the file: root does not read it either.
    #[error(
        "refused: it could not be opened as uid {uid}, the job's user ({why}); the recorder reads only what that user may"
    )]
    Unreadable { uid: u32, why: String },
    /// Its tables are over the bound or outside the file: not read.
    #[error("refused: {0}")]
    TooBig(String),
    /// Anything else (not an ELF library, a failed read).
    #[error("{0}")]
    Other(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_regular_files_only_and_finds_symbols() {
        // This test binary itself: a regular file with an ELF symbol table.
        let exe = std::env::current_exe().unwrap();
        let p = Pinned::open(&exe).expect("the test binary pins");
        let m = std::fs::metadata(&exe).unwrap();
        assert_eq!((p.dev, p.ino), (m.dev(), m.ino()));
        let offs = p
            .offsets(Owner::current(), &["main", "no_such_symbol_here"])
            .unwrap();
        assert!(offs[0].is_some_and(|o| o > 0 && o < m.len()), "{offs:?}");
        assert_eq!(offs[1], None);
        assert!(Pinned::open(Path::new("/dev/null")).is_err());
        assert!(Pinned::open(Path::new("/")).is_err());
        assert!(super::super::elf::elf_offsets(&b"not an elf"[..], &["x"]).is_err());
    }
}
