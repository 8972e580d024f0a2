//! The `*at` system calls the safe files are made with: relative to a
//! directory held open, never following the last component.

use std::{
    ffi::{CString, OsStr},
    fs::File,
    io,
    os::{
        fd::{AsRawFd, BorrowedFd, FromRawFd},
        unix::ffi::OsStrExt,
    },
};

pub(super) fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

pub(super) fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `lstat` of a name in a directory; `None` when there is none.
pub(super) fn lstat_at(dir: BorrowedFd, name: &OsStr) -> io::Result<Option<libc::stat>> {
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

pub(super) fn fstat(fd: BorrowedFd) -> io::Result<libc::stat> {
    // SAFETY: as above.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

pub(super) fn open_at(
    dir: BorrowedFd,
    name: &OsStr,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<File> {
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

pub(super) fn rename_at(
    dir: BorrowedFd,
    from: &OsStr,
    to: &OsStr,
    flags: libc::c_uint,
) -> io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    let d = dir.as_raw_fd();
    // The raw system call, not libc's wrapper: the static musl build that
    // the VM runner boots has no renameat2 wrapper (the call is in every
    // kernel since 3.15).
    // SAFETY: valid fds and C strings, the arguments renameat2(2) takes.
    let r = unsafe { libc::syscall(libc::SYS_renameat2, d, f.as_ptr(), d, t.as_ptr(), flags) };
    check(r as libc::c_int).map(drop)
}

/// Renames `from` to `to` unless `to` exists (`EEXIST` then). A file
/// system without `RENAME_NOREPLACE` gets a hard link and an unlink, which
/// refuse an existing name just the same.
pub(super) fn rename_noreplace(dir: BorrowedFd, from: &OsStr, to: &OsStr) -> io::Result<()> {
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

pub(super) fn unlink_at(dir: BorrowedFd, name: &OsStr) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: valid fd and C string.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) }).map(drop)
}

/// Takes the exclusive lock without waiting; false when another holds it.
pub(super) fn try_lock(f: &File) -> io::Result<bool> {
    // SAFETY: valid fd.
    match check(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Ten random letters and digits, from the kernel.
pub(super) fn random_suffix() -> io::Result<String> {
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

pub(super) fn kind_of(st: &libc::stat) -> &'static str {
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

pub(super) fn is_regular(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}
