//! Files the root recorder writes, made so that no one can turn it against
//! the machine.
//!
//! - Directory work runs with the invoking user's filesystem credentials
//!   (fsuid, fsgid, supplementary groups), on a short-lived thread: Linux
//!   keeps credentials per thread, and the raw syscalls change only the
//!   calling one. The kernel then checks every lookup, creation and rename
//!   as if the user did it, and what is created is theirs: `sudo trainbpf
//!   record -o /etc/x` fails as `touch /etc/x` would.
//! - A file is created new, under a random name in the target directory
//!   (`O_CREAT|O_EXCL|O_NOFOLLOW`), and renamed into place. The last
//!   component of a path is never followed; an existing file is never
//!   opened for writing, truncated or chowned.
//! - An existing recording moves aside to `PATH.old`, as perf does. A link,
//!   device or FIFO at the path is refused, and so is a file of another
//!   user. The recording is locked (`flock`) while it is written: a second
//!   recorder on the same path refuses.
//! - What was written is read back through the recorder's own descriptor
//!   ([`ReadAt`]), never by its path.
//! - Report outputs (`--html`, `--perfetto`, `--pprof`) go the same way, except that
//!   a device or FIFO already at the path is written through, never
//!   replaced.

use std::{
    ffi::{CString, OsStr, OsString},
    fs::File,
    io::{self, Read},
    os::{
        fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::{ffi::OsStrExt, fs::FileExt},
    },
    path::{Path, PathBuf},
    sync::Arc,
};

use sys::{
    check, cstr, fstat, is_regular, kind_of, lstat_at, open_at, random_suffix, rename_at,
    rename_noreplace, try_lock, unlink_at,
};

mod append;
mod new_file;
mod ready;
mod sys;

pub use append::open_append;
pub use new_file::{create_new, create_new_here};
pub use ready::{NewFile, Ready};

/// Whose credentials create the files: the user who ran `sudo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    /// Our own effective ids (files made as whoever runs us).
    pub fn current() -> Owner {
        // SAFETY: no preconditions.
        unsafe {
            Owner {
                uid: libc::geteuid(),
                gid: libc::getegid(),
            }
        }
    }
}

impl From<&crate::util::invoker::Invoker> for Owner {
    fn from(i: &crate::util::invoker::Invoker) -> Owner {
        Owner {
            uid: i.uid,
            gid: i.gid,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(
        "{path} is {what}: trainbpf writes only files it creates itself and follows no link there; remove it or choose another path"
    )]
    NotRegular { path: String, what: &'static str },
    #[error(
        "{path} belongs to uid {uid}, not to uid {owner} who runs trainbpf: it is not moved aside; remove it or choose another path"
    )]
    Foreign { path: String, uid: u32, owner: u32 },
    #[error(
        "{path} is {what} that belongs to uid {uid}: a report is written through only to a device or FIFO of uid {owner}, who runs trainbpf, or of root; choose another path"
    )]
    ForeignNode {
        path: String,
        what: &'static str,
        uid: u32,
        owner: u32,
    },
    #[error("another trainbpf record is writing {path}; choose another -o")]
    Busy { path: String },
    /// The OS error is in the message, not a source: it is said once.
    #[error("{what}: {err}")]
    Io { what: String, err: io::Error },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> FileError {
    let what = what.into();
    move |err| FileError::Io { what, err }
}

/// Takes on `owner`'s filesystem credentials on this thread, for good:
/// only for a thread that does nothing else (see [`as_owner`]). Dropping
/// fsuid 0 also drops the capabilities that override file permissions.
pub fn assume(owner: Owner) -> io::Result<()> {
    if !switches_to(owner) {
        return Ok(());
    }
    let groups = supplementary_groups(owner);
    // SAFETY: raw syscalls, which change the calling thread's credentials
    // only (glibc's wrappers would change every thread's).
    unsafe {
        if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        libc::syscall(libc::SYS_setfsgid, owner.gid);
        libc::syscall(libc::SYS_setfsuid, owner.uid);
        // setfs*id return the previous id, never an error: an invalid id
        // (-1) changes nothing and tells the current one.
        let fsgid = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
        let fsuid = libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32;
        if (fsuid, fsgid) != (owner.uid, owner.gid) {
            return Err(io::Error::other(format!(
                "could not take on uid {} gid {} to create files",
                owner.uid, owner.gid
            )));
        }
    }
    Ok(())
}

/// Only root takes on another user's credentials. Anyone else (`sudo -u
/// bob`, whose SUDO_UID names the caller) makes files as themselves: the
/// kernel already holds them to their own rights.
fn switches_to(owner: Owner) -> bool {
    let me = Owner::current();
    me.uid == 0 && owner != me
}

/// The user's groups from the group database; their primary group alone
/// when they have no passwd entry.
fn supplementary_groups(owner: Owner) -> Vec<libc::gid_t> {
    use nix::unistd::{Gid, Uid, User};
    let from_db = User::from_uid(Uid::from_raw(owner.uid))
        .ok()
        .flatten()
        .and_then(|u| {
            let name = CString::new(u.name).ok()?;
            nix::unistd::getgrouplist(&name, Gid::from_raw(owner.gid)).ok()
        });
    match from_db {
        Some(g) => g.into_iter().map(|g| g.as_raw()).collect(),
        None => vec![owner.gid],
    }
}

/// Runs `f` with `owner`'s filesystem credentials, on a thread of its own
/// that ends with it.
pub fn as_owner<T: Send>(
    owner: Owner,
    f: impl FnOnce() -> Result<T, FileError> + Send,
) -> Result<T, FileError> {
    if !switches_to(owner) {
        return f();
    }
    std::thread::scope(|s| {
        let t = std::thread::Builder::new()
            .name("as-user".into())
            .spawn_scoped(s, || {
                assume(owner).map_err(io_err(format!(
                    "taking on uid {} to create files",
                    owner.uid
                )))?;
                f()
            })
            .map_err(io_err("starting a thread"))?;
        t.join().unwrap_or_else(|_| {
            Err(FileError::Io {
                what: "creating a file".into(),
                err: io::Error::other("the thread panicked"),
            })
        })
    })
}

/// A file's place: its directory, held open, and its name there. Every
/// later step (compaction, its rename) goes through the directory
/// descriptor, never the path again.
#[derive(Clone, Debug)]
pub struct Place {
    dir: Arc<OwnedFd>,
    name: OsString,
    path: PathBuf,
    owner: Owner,
}

impl Place {
    /// Opens the directory of `path`; called with the owner's credentials.
    /// Its directories are followed as the user would follow them; the
    /// file's own name never is.
    fn open(path: &Path, owner: Owner) -> Result<Place, FileError> {
        let shown = path.display().to_string();
        let name = match path.file_name() {
            Some(n) if !path.as_os_str().as_bytes().ends_with(b"/") => n.to_os_string(),
            _ => {
                return Err(FileError::NotRegular {
                    path: shown,
                    what: "a directory",
                });
            }
        };
        let dir_path = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let c = cstr(dir_path.as_os_str()).map_err(io_err(format!("opening {shown}")))?;
        // SAFETY: valid C string; the fd returned is ours.
        let fd = check(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })
        .map_err(io_err(format!(
            "opening the directory {} as uid {}",
            dir_path.display(),
            owner.uid
        )))?;
        Ok(Place {
            // SAFETY: just opened, ours alone.
            dir: Arc::new(unsafe { OwnedFd::from_raw_fd(fd) }),
            name,
            path: path.to_path_buf(),
            owner,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn owner(&self) -> Owner {
        self.owner
    }

    fn dir(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// A sibling name: `trainbpf.rec` → `trainbpf.rec.old`.
    fn sibling(&self, suffix: &str) -> OsString {
        let mut n = self.name.clone();
        n.push(suffix);
        n
    }

    fn shown(&self, name: &OsStr) -> String {
        self.path.with_file_name(name).display().to_string()
    }

    /// Creates a new file `PREFIX<random>` beside the target, read-write,
    /// with the calling thread's credentials.
    pub fn create_temp(&self, prefix: &str, mode: u32) -> Result<(File, OsString), FileError> {
        let what = || {
            format!(
                "creating a file in the directory of {} as uid {}",
                self.path.display(),
                self.owner.uid
            )
        };
        for _ in 0..16 {
            let mut name = OsString::from(prefix);
            name.push(random_suffix().map_err(io_err(what()))?);
            let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
            match open_at(self.dir(), &name, flags, mode) {
                Ok(f) => return Ok((f, name)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err(what())(e)),
            }
        }
        Err(io_err(what())(io::ErrorKind::AlreadyExists.into()))
    }

    /// The compaction's file beside the recording:
    /// `.trainbpf.rec.compacting-<random>`.
    pub fn create_compacting(&self) -> Result<(File, OsString), FileError> {
        let prefix = format!(".{}.compacting-", self.name.to_string_lossy());
        self.create_temp(&prefix, 0o600)
    }

    /// Removes a file this place created beside the target.
    pub fn remove(&self, name: &OsStr) {
        let _ = as_owner(self.owner, || {
            unlink_at(self.dir(), name).map_err(io_err("removing"))
        });
    }

    /// Removes what a recorder killed mid-compaction left: the owner's
    /// regular files named like a compaction of this target (this
    /// version's names, and the `PATH.compacting-N` of earlier ones).
    pub fn remove_stale_compactions(&self) {
        let name = self.name.to_string_lossy();
        let prefixes = [
            format!(".{name}.compacting-"),
            format!("{name}.compacting-"),
        ];
        let dir_path = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let _ = as_owner(self.owner, || {
            // Listed by path, but each name is checked and removed through
            // the directory held open, and only when it is the owner's.
            for e in std::fs::read_dir(&dir_path)
                .map_err(io_err("listing"))?
                .flatten()
            {
                let n = e.file_name();
                let s = n.to_string_lossy();
                if !prefixes.iter().any(|p| s.starts_with(p.as_str())) {
                    continue;
                }
                if let Ok(Some(st)) = lstat_at(self.dir(), &n)
                    && is_regular(&st)
                    && st.st_uid == self.owner.uid
                {
                    let _ = unlink_at(self.dir(), &n);
                }
            }
            Ok(())
        });
    }

    /// The target names `file` (the same inode, not through a link).
    fn names(&self, file: &File) -> io::Result<bool> {
        let now = lstat_at(self.dir(), &self.name)?;
        let st = fstat(file.as_fd())?;
        Ok(now.is_some_and(|n| (n.st_dev, n.st_ino) == (st.st_dev, st.st_ino)))
    }

    /// The target still names `file`, as the recorder made it.
    pub fn still_names(&self, file: &File) -> bool {
        as_owner(self.owner, || self.names(file).map_err(io_err("checking"))).unwrap_or(false)
    }

    /// Renames the compacted file `tmp` (`new`, already durable) over the
    /// recording, which must still be `current`: a recording someone moved
    /// or replaced is left alone. `new` is locked first, so that the path
    /// is never an unlocked recording.
    pub fn install(&self, tmp: &OsStr, new: &File, current: &File) -> Result<(), InstallError> {
        as_owner(self.owner, || {
            if !self
                .names(current)
                .map_err(io_err("checking the recording"))?
            {
                return Ok(Err(InstallError::Moved(self.path.display().to_string())));
            }
            try_lock(new).map_err(io_err("locking the compacted recording"))?;
            rename_at(self.dir(), tmp, &self.name, 0)
                .map_err(io_err(format!("renaming over {}", self.path.display())))?;
            // Durable rename, where the directory can be read.
            if let Ok(d) = open_at(
                self.dir(),
                OsStr::new("."),
                libc::O_RDONLY | libc::O_DIRECTORY,
                0,
            ) {
                let _ = d.sync_all();
            }
            Ok(Ok(()))
        })
        .map_err(InstallError::File)?
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(
        "{0} no longer names this recording (moved or replaced while recording): compaction stops"
    )]
    Moved(String),
    #[error(transparent)]
    File(FileError),
}

/// A new recording, locked, in place.
#[derive(Debug)]
pub struct Created {
    pub file: File,
    pub place: Place,
    /// Where an earlier recording at the path went.
    pub moved_aside: Option<PathBuf>,
}

/// Creates the recording at `path` for `owner`: new, locked, owned by
/// them, mode 0600. An earlier recording of theirs moves to `PATH.old`.
pub fn create_recording(path: &Path, owner: Owner) -> Result<Created, FileError> {
    as_owner(owner, || {
        let place = Place::open(path, owner)?;
        let (file, tmp) = place.create_temp(".trainbpf-", 0o600)?;
        let placed = try_lock(&file)
            .map_err(io_err(format!("locking {}", path.display())))
            .and_then(|_| put_in_place(&place, &tmp));
        match placed {
            Ok(moved_aside) => Ok(Created {
                file,
                place,
                moved_aside,
            }),
            Err(e) => {
                let _ = unlink_at(place.dir(), &tmp);
                Err(e)
            }
        }
    })
}

/// Moves an earlier recording aside and renames `tmp` to the target,
/// never over a file that appeared meanwhile.
fn put_in_place(place: &Place, tmp: &OsStr) -> Result<Option<PathBuf>, FileError> {
    let shown = place.path.display().to_string();
    let mut moved_aside = None;
    for _ in 0..8 {
        let st = lstat_at(place.dir(), &place.name).map_err(io_err(format!("reading {shown}")))?;
        // Held (and locked) until ours is in place: a second recorder
        // starting now finds the lock taken.
        let mut _earlier = None;
        if let Some(st) = st {
            if !is_regular(&st) {
                return Err(FileError::NotRegular {
                    path: shown,
                    what: kind_of(&st),
                });
            }
            if st.st_uid != place.owner.uid {
                return Err(FileError::Foreign {
                    path: shown,
                    uid: st.st_uid,
                    owner: place.owner.uid,
                });
            }
            let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
            let f = match open_at(place.dir(), &place.name, flags, 0) {
                Ok(f) => f,
                // Gone or swapped since the lstat: look again.
                Err(_) => continue,
            };
            let now = fstat(f.as_fd()).map_err(io_err(format!("reading {shown}")))?;
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
                continue;
            }
            if !try_lock(&f).map_err(io_err(format!("locking {shown}")))? {
                return Err(FileError::Busy { path: shown });
            }
            let old = place.sibling(".old");
            if let Some(o) = lstat_at(place.dir(), &old)
                .map_err(io_err(format!("reading {}", place.shown(&old))))?
            {
                if !is_regular(&o) {
                    return Err(FileError::NotRegular {
                        path: place.shown(&old),
                        what: kind_of(&o),
                    });
                }
                if o.st_uid != place.owner.uid {
                    return Err(FileError::Foreign {
                        path: place.shown(&old),
                        uid: o.st_uid,
                        owner: place.owner.uid,
                    });
                }
            }
            rename_at(place.dir(), &place.name, &old, 0).map_err(io_err(format!(
                "moving {shown} aside to {}",
                place.shown(&old)
            )))?;
            moved_aside = Some(place.path.with_file_name(&old));
            _earlier = Some(f);
        }
        match rename_noreplace(place.dir(), tmp, &place.name) {
            Ok(()) => return Ok(moved_aside),
            // Another file took the name meanwhile: judge it like the first.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err(format!("creating {shown}"))(e)),
        }
    }
    Err(FileError::Busy { path: shown })
}

/// Writes a report output (`--html`, `--perfetto`, `--pprof`) as `owner`: a regular
/// file is replaced whole (a new file renamed over it), a device or FIFO
/// is written through, and a link is refused.
pub fn write_output(path: &Path, bytes: &[u8], owner: Owner) -> Result<(), FileError> {
    use std::io::Write;
    let shown = path.display().to_string();
    as_owner(owner, || {
        let place = Place::open(path, owner)?;
        let st = lstat_at(place.dir(), &place.name).map_err(io_err(format!("reading {shown}")))?;
        match st {
            Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => Err(FileError::NotRegular {
                path: shown,
                what: kind_of(&st),
            }),
            Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => Err(FileError::NotRegular {
                path: shown,
                what: kind_of(&st),
            }),
            Some(st) if !is_regular(&st) => {
                // Another user's FIFO in a sticky /tmp would receive the
                // report (no O_CREAT, so fs.protected_fifos does not apply):
                // only the user's own nodes and root's (/dev/null, a tty)
                // are written through. Checked before the open, which a
                // device or a FIFO's reader notices, and again after it.
                foreign_node(&shown, &st, owner)?;
                // No O_CREAT, no O_TRUNC: whatever is there is written to,
                // as a shell's `>` would, and stays what it is.
                let flags = libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NOCTTY;
                let mut f = open_at(place.dir(), &place.name, flags, 0)
                    .map_err(io_err(format!("opening {shown}")))?;
                let now = fstat(f.as_fd()).map_err(io_err(format!("opening {shown}")))?;
                if is_regular(&now) {
                    return Err(FileError::Io {
                        what: format!("opening {shown}"),
                        err: io::Error::other("it was replaced by a regular file meanwhile"),
                    });
                }
                foreign_node(&shown, &now, owner)?;
                f.write_all(bytes)
                    .and_then(|()| f.flush())
                    .map_err(io_err(format!("writing {shown}")))
            }
            _ => {
                // Readable by others as before (0666 less the umask).
                let (mut f, tmp) = place.create_temp(".trainbpf-", 0o666)?;
                let done = f
                    .write_all(bytes)
                    .and_then(|()| f.sync_data())
                    .and_then(|()| rename_at(place.dir(), &tmp, &place.name, 0))
                    .map_err(io_err(format!("writing {shown}")));
                if done.is_err() {
                    let _ = unlink_at(place.dir(), &tmp);
                }
                done
            }
        }
    })
}

fn foreign_node(shown: &str, st: &libc::stat, owner: Owner) -> Result<(), FileError> {
    if st.st_uid == owner.uid || st.st_uid == 0 {
        return Ok(());
    }
    Err(FileError::ForeignNode {
        path: shown.to_string(),
        what: kind_of(st),
        uid: st.st_uid,
        owner: owner.uid,
    })
}

/// Opens a file to read (`report`'s recording) with `owner`'s credentials:
/// the kernel applies their own permissions, so `sudo trainbpf report`
/// reads only what the user who ran it could read.
pub fn open_input(path: &Path, owner: Owner) -> Result<File, FileError> {
    let what = if switches_to(owner) {
        format!("opening {} as uid {}", path.display(), owner.uid)
    } else {
        format!("opening {}", path.display())
    };
    as_owner(owner, || File::open(path).map_err(io_err(what)))
}

/// Reads a file from `pos` on with `pread`: the writer's offset, which
/// a duplicated descriptor would share, is never moved.
pub struct ReadAt<'a> {
    file: &'a File,
    pos: u64,
}

impl<'a> ReadAt<'a> {
    pub fn new(file: &'a File, pos: u64) -> ReadAt<'a> {
        ReadAt { file, pos }
    }
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
