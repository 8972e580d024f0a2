//! A file written once, whole, into a directory of the user's own
//! (torchelastic's error file): created under a random name with
//! `O_CREAT|O_EXCL|O_NOFOLLOW` and renamed into place with
//! `RENAME_NOREPLACE`, so that a reader sees either nothing or all of it,
//! and a file already there (the job's own) is never touched.

use std::{ffi::OsStr, io::Write as _, path::Path};

use super::{
    FileError, Owner, Place, as_owner, io_err,
    sys::{fstat, lstat_at, rename_noreplace, unlink_at},
};

/// What became of the write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewFile {
    Written,
    /// Something was there already, or took the name meanwhile: left
    /// alone.
    Exists,
}

/// Writes `bytes` to `path` as `owner`, unless something is there. The
/// directory must be one `owner` owns; every lookup on the way is the
/// kernel's check of `owner`'s rights, and the last name is never
/// followed.
pub fn create_new(path: &Path, bytes: &[u8], owner: Owner) -> Result<NewFile, FileError> {
    as_owner(owner, || create_new_here(path, bytes, owner))
}

/// [`create_new`] on a thread that took on `owner`'s credentials already
/// ([`super::assume`]): a writer that must be quick at a kill does the
/// user lookup and the thread's start once, beforehand.
pub fn create_new_here(path: &Path, bytes: &[u8], owner: Owner) -> Result<NewFile, FileError> {
    let shown = path.display().to_string();
    {
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
            return Ok(NewFile::Exists);
        }
        let (mut f, tmp) = place.create_temp(".trainbpf-", 0o644)?;
        let tmp: &OsStr = &tmp;
        // No fsync: the reader is on this machine, and the write must be
        // there before torchelastic's agent polls (every 0.1 s).
        let written = f
            .write_all(bytes)
            .map_err(io_err(format!("writing {shown}")));
        let done = written.and_then(|()| match rename_noreplace(place.dir(), tmp, &place.name) {
            Ok(()) => Ok(NewFile::Written),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(NewFile::Exists),
            Err(e) => Err(io_err(format!("renaming into {shown}"))(e)),
        });
        if !matches!(done, Ok(NewFile::Written)) {
            let _ = unlink_at(place.dir(), tmp);
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    fn tmpdir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("trainbpf-new-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn written_whole_once_and_never_over_anything() {
        let d = tmpdir("once");
        let me = Owner::current();
        let f = d.join("error.json");
        assert_eq!(create_new(&f, b"{}", me).unwrap(), NewFile::Written);
        assert_eq!(std::fs::read(&f).unwrap(), b"{}");
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o777 & !0o644, 0);
        // The job's own file (or ours, a second time) stays as it is.
        assert_eq!(create_new(&f, b"[]", me).unwrap(), NewFile::Exists);
        assert_eq!(std::fs::read(&f).unwrap(), b"{}");
        // A link at the name is not followed, and not replaced.
        let target = d.join("target");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, d.join("l.json")).unwrap();
        assert_eq!(
            create_new(&d.join("l.json"), b"x", me).unwrap(),
            NewFile::Exists
        );
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        // Nothing left behind under a temporary name.
        assert_eq!(names(&d), ["error.json", "l.json", "target"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn only_in_a_directory_of_the_owner() {
        let d = tmpdir("owned");
        let me = Owner::current();
        // A directory of someone else: refused (as root, the test makes
        // one of uid 65534; as anyone else, / is root's).
        let foreign = if me.uid == 0 {
            let sub = d.join("theirs");
            std::fs::create_dir(&sub).unwrap();
            std::os::unix::fs::chown(&sub, Some(65534), Some(65534)).unwrap();
            sub
        } else {
            std::path::PathBuf::from("/")
        };
        let e = create_new(&foreign.join("error.json"), b"x", me).unwrap_err();
        assert!(matches!(e, FileError::Foreign { .. }), "{e}");
        assert!(!foreign.join("error.json").exists());
        // A missing directory is an error, not a creation.
        assert!(create_new(&d.join("none/error.json"), b"x", me).is_err());
        // A directory reached through a link is the user's own lookup,
        // and its owner is what counts.
        std::os::unix::fs::symlink(&d, d.join("via")).unwrap();
        assert_eq!(
            create_new(&d.join("via/e.json"), b"x", me).unwrap(),
            NewFile::Written
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
