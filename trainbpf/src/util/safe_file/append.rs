//! A log the recorder appends to (`record --events-jsonl`): a shipper
//! follows it by name and offset, so an earlier file is appended to, not
//! moved aside. Opened as the invoking user, never through a link, and
//! only if it is a regular file of theirs; created 0600 when missing.

use std::{fs::File, os::fd::AsFd as _, path::Path};

use super::{
    FileError, Owner, Place, as_owner, io_err,
    sys::{fstat, is_regular, kind_of, lstat_at, open_at},
};

/// Opens `path` for appending, as `owner`.
pub fn open_append(path: &Path, owner: Owner) -> Result<File, FileError> {
    let shown = path.display().to_string();
    as_owner(owner, || {
        let place = Place::open(path, owner)?;
        // A FIFO or device is refused before it is opened: opening one
        // can block or have effects of its own.
        if let Some(st) =
            lstat_at(place.dir(), &place.name).map_err(io_err(format!("reading {shown}")))?
            && !is_regular(&st)
        {
            return Err(FileError::NotRegular {
                path: shown,
                what: kind_of(&st),
            });
        }
        let flags = libc::O_WRONLY
            | libc::O_APPEND
            | libc::O_CREAT
            | libc::O_NOFOLLOW
            | libc::O_NOCTTY
            | libc::O_NONBLOCK;
        let file = open_at(place.dir(), &place.name, flags, 0o600)
            .map_err(io_err(format!("opening {shown}")))?;
        let st = fstat(file.as_fd()).map_err(io_err(format!("reading {shown}")))?;
        if !is_regular(&st) {
            return Err(FileError::NotRegular {
                path: shown,
                what: kind_of(&st),
            });
        }
        if st.st_uid != owner.uid {
            return Err(FileError::Foreign {
                path: shown,
                uid: st.st_uid,
                owner: owner.uid,
            });
        }
        Ok(file)
    })
}
