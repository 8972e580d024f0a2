//! Files the root recorder writes, made so that no one can turn it against
//! the machine (issue 12, "files written as root").
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
//! - Report outputs (`--html`, `--perfetto`) go the same way, except that
//!   a device or FIFO already at the path is written through, never
//!   replaced.

use std::{
    ffi::{CString, OsStr, OsString},
    fs::File,
    io::{self, Read},
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::{ffi::OsStrExt, fs::FileExt},
    },
    path::{Path, PathBuf},
    sync::Arc,
};

/// Whose credentials create the files: the user who ran `sudo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

impl From<&crate::job::Invoker> for Owner {
    fn from(i: &crate::job::Invoker) -> Owner {
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
    if owner == Owner::current() {
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
    if owner == Owner::current() {
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

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `lstat` of a name in a directory; `None` when there is none.
fn lstat_at(dir: BorrowedFd, name: &OsStr) -> io::Result<Option<libc::stat>> {
    let c = cstr(name)?;
    // SAFETY: a zeroed stat is valid; fstatat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, C string and out pointer.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match check(r) {
        Ok(_) => Ok(Some(st)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn fstat(fd: BorrowedFd) -> io::Result<libc::stat> {
    // SAFETY: as above.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

fn open_at(dir: BorrowedFd, name: &OsStr, flags: libc::c_int, mode: u32) -> io::Result<File> {
    let c = cstr(name)?;
    // SAFETY: valid fd and C string; the fd returned is ours.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: fd was just opened and is owned by no one else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn rename_at(dir: BorrowedFd, from: &OsStr, to: &OsStr, flags: libc::c_uint) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    let d = dir.as_raw_fd();
    // SAFETY: valid fds and C strings.
    check(unsafe { libc::renameat2(d, f.as_ptr(), d, t.as_ptr(), flags) }).map(drop)
}

/// Renames `from` to `to` unless `to` exists (`EEXIST` then). A file
/// system without `RENAME_NOREPLACE` gets a hard link and an unlink, which
/// refuse an existing name just the same.
fn rename_noreplace(dir: BorrowedFd, from: &OsStr, to: &OsStr) -> io::Result<()> {
    match rename_at(dir, from, to, libc::RENAME_NOREPLACE) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let (f, t) = (cstr(from)?, cstr(to)?);
            let d = dir.as_raw_fd();
            // SAFETY: valid fds and C strings; no AT_SYMLINK_FOLLOW.
            check(unsafe { libc::linkat(d, f.as_ptr(), d, t.as_ptr(), 0) })?;
            unlink_at(dir, from)
        }
        r => r,
    }
}

fn unlink_at(dir: BorrowedFd, name: &OsStr) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: valid fd and C string.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) }).map(drop)
}

/// Takes the exclusive lock without waiting; false when another holds it.
fn try_lock(f: &File) -> io::Result<bool> {
    // SAFETY: valid fd.
    match check(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Ten random letters and digits, from the kernel.
fn random_suffix() -> io::Result<String> {
    let mut b = [0u8; 10];
    // SAFETY: the buffer is valid for its length.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(io::Error::last_os_error());
    }
    const ABC: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    Ok(b.iter()
        .map(|&x| ABC[x as usize % ABC.len()] as char)
        .collect())
}

fn kind_of(st: &libc::stat) -> &'static str {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFDIR => "a directory",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        _ => "not a regular file",
    }
}

fn is_regular(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
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

/// Writes a report output (`--html`, `--perfetto`) as `owner`: a regular
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
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("trainbpf-safe-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn an_earlier_recording_moves_aside_and_a_link_is_refused() {
        let d = tmpdir("aside");
        let rec = d.join("r.rec");
        std::fs::write(&rec, b"earlier").unwrap();
        let c = create_recording(&rec, Owner::current()).unwrap();
        assert_eq!(c.moved_aside, Some(d.join("r.rec.old")));
        assert_eq!(std::fs::read(d.join("r.rec.old")).unwrap(), b"earlier");
        assert_eq!(std::fs::metadata(&rec).unwrap().len(), 0);
        assert_eq!(std::fs::metadata(&rec).unwrap().mode() & 0o777, 0o600);
        // Locked while it is written: a second one refuses.
        let second = create_recording(&rec, Owner::current());
        assert!(matches!(second, Err(FileError::Busy { .. })), "{second:?}");
        drop(c);

        let target = d.join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = d.join("l.rec");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = create_recording(&link, Owner::current()).err().unwrap();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        // Nothing is left behind by a refusal.
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn report_outputs_replace_files_write_through_fifos_and_refuse_links() {
        let d = tmpdir("outputs");
        let out = d.join("o.html");
        std::fs::write(&out, b"old").unwrap();
        write_output(&out, b"new", Owner::current()).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"new");

        let target = d.join("target");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, d.join("l.html")).unwrap();
        assert!(write_output(&d.join("l.html"), b"x", Owner::current()).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");

        let fifo = d.join("f");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        write_output(&fifo, b"through", Owner::current()).unwrap();
        assert_eq!(reader.join().unwrap(), b"through");
        let st = std::fs::symlink_metadata(&fifo).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&st.file_type()));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn read_at_leaves_the_writers_offset_alone() {
        use std::io::{Seek, Write};
        let d = tmpdir("readat");
        let mut f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(d.join("f"))
            .unwrap();
        f.write_all(b"hello world").unwrap();
        let mut s = String::new();
        ReadAt::new(&f, 6).read_to_string(&mut s).unwrap();
        assert_eq!(s, "world");
        assert_eq!(f.stream_position().unwrap(), 11);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
