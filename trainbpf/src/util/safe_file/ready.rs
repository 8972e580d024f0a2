//! A new file made ready ahead of its contents: created empty under a
//! random name beside its target, as the user, and later written and
//! renamed into place with `RENAME_NOREPLACE` in two system calls through
//! the descriptors held (no path is looked up again). torchelastic's error
//! file is prepared when a worker starts, so that at its kill the write
//! lands before the dying worker can be reaped.

use std::{
    ffi::OsString,
    fs::File,
    io::Write as _,
    os::fd::{AsFd as _, AsRawFd as _},
};

use super::{
    FileError, Owner, Place, io_err,
    sys::{fstat, lstat_at, rename_noreplace, unlink_at},
};

/// File systems whose rename of a name in a directory already open never
/// waits on anything but the local disk: the write may be finished on a
/// thread that must not block (the collector's). On any other (FUSE, NFS)
/// it is finished on the writer's thread.
const LOCAL: [i64; 5] = [
    0xEF53,      // ext2/3/4
    0x5846_5342, // xfs
    0x9123_683E, // btrfs
    0x0102_1994, // tmpfs
    0x794C_7630, // overlayfs
];

/// What became of the write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewFile {
    Written,
    /// Something was there already, or took the name meanwhile: left
    /// alone.
    Exists,
}

/// See the module docs.
#[derive(Debug)]
pub struct Ready {
    place: Place,
    file: File,
    tmp: OsString,
    /// On a local file system ([`LOCAL`]).
    pub local: bool,
}

impl Ready {
    /// Creates the empty file beside `path`; on a thread holding `owner`'s
    /// credentials (`safe_file::assume`). The directory must be `owner`'s;
    /// `Ok(None)`: something is at `path` already.
    pub fn prepare(path: &std::path::Path, owner: Owner) -> Result<Option<Ready>, FileError> {
        let shown = path.display().to_string();
        let place = Place::open(path, owner)?;
        let dir =
            fstat(place.dir()).map_err(io_err(format!("reading the directory of {shown}")))?;
        if dir.st_mode & libc::S_IFMT != libc::S_IFDIR || dir.st_uid != owner.uid {
            return Err(FileError::Foreign {
                path: path
                    .parent()
                    .map_or_else(|| ".".into(), |p| p.display().to_string()),
                uid: dir.st_uid,
                owner: owner.uid,
            });
        }
        if lstat_at(place.dir(), &place.name)
            .map_err(io_err(format!("reading {shown}")))?
            .is_some()
        {
            return Ok(None);
        }
        let (file, tmp) = place.create_temp(".trainbpf-", 0o644)?;
        // SAFETY: a zeroed statfs is valid to fill; the fd is open.
        let local = unsafe {
            let mut st: libc::statfs = std::mem::zeroed();
            libc::fstatfs(place.dir().as_raw_fd(), &mut st) == 0
                && LOCAL.contains(&(st.f_type as i64))
        };
        Ok(Some(Ready {
            place,
            file,
            tmp,
            local,
        }))
    }

    /// Writes `bytes` and renames the file into place, unless something
    /// took the name meanwhile (then the file is removed). Through the
    /// descriptors held: any thread, any credentials.
    pub fn finish(mut self, bytes: &[u8]) -> Result<NewFile, FileError> {
        let shown = self.place.path().display().to_string();
        let done = self
            .file
            .write_all(bytes)
            .map_err(io_err(format!("writing {shown}")))
            .and_then(
                |()| match rename_noreplace(self.place.dir(), &self.tmp, &self.place.name) {
                    Ok(()) => Ok(NewFile::Written),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(NewFile::Exists),
                    Err(e) => Err(io_err(format!("renaming into {shown}"))(e)),
                },
            );
        if !matches!(done, Ok(NewFile::Written)) {
            self.discard();
        }
        done
    }

    /// Removes the unused file (the process ended without a kill).
    pub fn discard(&self) {
        // Only if the name is still the file made: the user may have moved
        // it and put something else there.
        let ours = fstat(self.file.as_fd()).ok();
        let there = lstat_at(self.place.dir(), &self.tmp).ok().flatten();
        if let (Some(a), Some(b)) = (ours, there)
            && (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
        {
            let _ = unlink_at(self.place.dir(), &self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_then_written_whole_and_never_over_anything() {
        let d = std::env::temp_dir().join(format!("trainbpf-ready-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let me = Owner::current();
        let f = d.join("error.json");
        let r = Ready::prepare(&f, me).unwrap().expect("nothing there");
        assert!(r.local, "a temporary directory is local");
        assert!(!f.exists(), "nothing at the name until it is written");
        assert_eq!(r.finish(b"{}").unwrap(), NewFile::Written);
        assert_eq!(std::fs::read(&f).unwrap(), b"{}");
        // Something there: not prepared. Something there by the time of
        // the write: left alone, and the prepared file removed.
        assert!(Ready::prepare(&f, me).unwrap().is_none());
        let g = d.join("g.json");
        let r = Ready::prepare(&g, me).unwrap().unwrap();
        std::fs::write(&g, b"the job's own").unwrap();
        assert_eq!(r.finish(b"ours").unwrap(), NewFile::Exists);
        assert_eq!(std::fs::read(&g).unwrap(), b"the job's own");
        // Discarded: gone.
        let h = d.join("h.json");
        Ready::prepare(&h, me).unwrap().unwrap().discard();
        let mut names: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["error.json", "g.json"]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
