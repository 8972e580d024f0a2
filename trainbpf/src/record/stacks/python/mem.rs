//! Another process's memory, read through `/proc/PID/mem`.
//!
//! The descriptor is bound to the address space it was opened on: if the
//! process exits and its pid is reused, reads fail rather than land in the
//! new process.
//!
//! The process can make such a read wait for good: a page of a file on a
//! FUSE filesystem whose server never answers (and the read then waits
//! past a kill). What backs each page is looked at first, by the recorder
//! (`procfs::backing`), and a page on FUSE is not read; the recorder asks
//! for reads from a `procfs::guard` worker, whose deadline covers a
//! mapping made since the look, and the namer's own deadline ends a
//! reader that hangs.

use std::{fs::File, os::unix::fs::FileExt as _};

use super::PyError;
use crate::record::samplers::procfs::{
    backing::Backing,
    guard::{Count, STATS},
};

/// Opens `pid`'s memory: as root, in the recorder, which hands the
/// descriptor to the namer.
pub fn open(pid: u32) -> Result<File, PyError> {
    File::open(format!("/proc/{pid}/mem")).map_err(|source| PyError::Process {
        pid,
        what: "open its memory",
        source,
    })
}

pub struct Mem {
    pid: u32,
    file: File,
    backing: Backing,
}

impl Mem {
    /// On a descriptor the recorder opened (`/proc/PID/mem`, checked for
    /// access when opened, bound to that address space), with what backs
    /// the memory as the recorder looked at it. The namer reads with it,
    /// and never looks itself: the recorder's next request brings a new
    /// look (`set_backing`).
    pub fn from_file(pid: u32, file: File, backing: Backing) -> Mem {
        Mem { pid, file, backing }
    }

    pub fn set_backing(&mut self, backing: Backing) {
        self.backing = backing;
    }

    /// Fills `buf` from `addr`; `what` names the field, for the error.
    pub fn read(&self, addr: u64, buf: &mut [u8], what: &'static str) -> Result<(), PyError> {
        if addr == 0 {
            return Err(PyError::Null { what });
        }
        if let Some(fs) = self.backing.at(addr, buf.len() as u64) {
            STATS.add(Count::FuseSkipped, 1);
            let pid = self.pid;
            STATS.note(|| {
                format!("pid {pid}: its CPython state lies on a {fs} filesystem: not read")
            });
            return Err(PyError::Stalls {
                what,
                addr,
                fs: fs.to_string(),
            });
        }
        self.file
            .read_exact_at(buf, addr)
            .map_err(|source| PyError::Read { what, addr, source })
    }

    pub fn bytes(&self, addr: u64, len: usize, what: &'static str) -> Result<Vec<u8>, PyError> {
        let mut v = vec![0; len];
        self.read(addr, &mut v, what)?;
        Ok(v)
    }

    pub fn u64(&self, addr: u64, what: &'static str) -> Result<u64, PyError> {
        let mut b = [0; 8];
        self.read(addr, &mut b, what)?;
        Ok(u64::from_ne_bytes(b))
    }

    pub fn u32(&self, addr: u64, what: &'static str) -> Result<u32, PyError> {
        let mut b = [0; 4];
        self.read(addr, &mut b, what)?;
        Ok(u32::from_ne_bytes(b))
    }

    pub fn i32(&self, addr: u64, what: &'static str) -> Result<i32, PyError> {
        Ok(self.u32(addr, what)? as i32)
    }

    pub fn u8(&self, addr: u64, what: &'static str) -> Result<u8, PyError> {
        let mut b = [0; 1];
        self.read(addr, &mut b, what)?;
        Ok(b[0])
    }

    /// A NUL-terminated string of at most `max` bytes.
    pub fn c_string(&self, addr: u64, max: usize, what: &'static str) -> Result<String, PyError> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 64];
        while out.len() < max {
            // A chunk may cross into an unmapped page: read byte by byte
            // when a whole chunk fails.
            let at = addr.wrapping_add(out.len() as u64);
            let got = match self.read(at, &mut chunk, what) {
                Ok(()) => &chunk[..],
                Err(_) => {
                    self.read(at, &mut chunk[..1], what)?;
                    &chunk[..1]
                }
            };
            if let Some(end) = got.iter().position(|&b| b == 0) {
                out.extend_from_slice(&got[..end]);
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(got);
        }
        Err(PyError::BadObject {
            what,
            addr,
            reason: format!("no NUL in its first {max} bytes"),
        })
    }
}
