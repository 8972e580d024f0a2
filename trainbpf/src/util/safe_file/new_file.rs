//! A file written once, whole, into a directory of the user's own
//! (torchelastic's error file): created under a random name with
//! `O_CREAT|O_EXCL|O_NOFOLLOW` and renamed into place with
//! `RENAME_NOREPLACE`, so that a reader sees either nothing or all of it,
//! and a file already there (the job's own) is never touched.

use std::path::Path;

use super::{
    FileError, Owner, as_owner,
    ready::{NewFile, Ready},
};

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
    // The same steps as a file made ready ahead of its contents, at once.
    match Ready::prepare(path, owner)? {
        Some(r) => r.finish(bytes),
        None => Ok(NewFile::Exists),
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
