//! A FUSE filesystem that never answers a read, served by a thread of the
//! test itself (no libfuse, no fusermount: root mounts it with mount(2)
//! over a `/dev/fuse` descriptor). It holds one file, `f`, of 1 MiB: it
//! can be looked up, opened and mapped, but whoever touches its pages
//! waits until the filesystem goes, which `Drop` makes happen (closing
//! the last descriptor of the connection aborts it, and every waiting
//! read fails).

use std::{
    ffi::CString,
    fs::{File, OpenOptions},
    io::{Read, Write},
    os::{
        fd::AsRawFd,
        unix::{ffi::OsStrExt, fs::OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
};

/// The file's size: a page fault within it asks the server for the page
/// (past its end the kernel answers SIGBUS itself).
const SIZE: u64 = 1 << 20;
/// include/uapi/linux/fuse.h.
const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const OPEN: u32 = 14;
const READ: u32 = 15;
const RELEASE: u32 = 18;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const INTERRUPT: u32 = 36;
const BATCH_FORGET: u32 = 42;
/// `fuse_in_header`'s size.
const IN_HEADER: usize = 40;
const FOPEN_KEEP_CACHE: u32 = 2;

pub struct StallFs {
    mnt: PathBuf,
    stop: Arc<AtomicBool>,
    /// READ requests received, none answered.
    reads: Arc<AtomicU64>,
    thread: Option<JoinHandle<File>>,
}

impl StallFs {
    /// Mounts it on `mnt` (made if missing).
    pub fn mount(mnt: &Path) -> StallFs {
        std::fs::create_dir_all(mnt).unwrap();
        // Close-on-exec: no process the test starts holds the connection,
        // so that closing this one aborts it.
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/fuse")
            .expect("/dev/fuse (the fuse filesystem is needed for this test)");
        let opts = CString::new(format!(
            "fd={},rootmode=40000,user_id=0,group_id=0",
            dev.as_raw_fd()
        ))
        .unwrap();
        let target = CString::new(mnt.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"trainbpf-stall".as_ptr(),
                target.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mounting fuse on {}: {}",
            mnt.display(),
            std::io::Error::last_os_error()
        );
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let (s, r) = (stop.clone(), reads.clone());
        let thread = std::thread::spawn(move || serve(dev, &s, &r));
        StallFs {
            mnt: mnt.to_path_buf(),
            stop,
            reads,
            thread: Some(thread),
        }
    }

    /// The file whose reads are never answered.
    pub fn file(&self) -> PathBuf {
        self.mnt.join("f")
    }

    /// READ requests received so far (none answered).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

impl Drop for StallFs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let dev = self.thread.take().and_then(|t| t.join().ok());
        let target = CString::new(self.mnt.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; a lazy unmount of our own mount.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        // The last descriptor of the connection: its reads fail now.
        drop(dev);
    }
}

/// Answers everything but READ until told to stop; returns the device.
fn serve(mut dev: File, stop: &AtomicBool, reads: &AtomicU64) -> File {
    let mut buf = vec![0u8; 1 << 17];
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd: dev.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
            continue;
        }
        let n = match dev.read(&mut buf) {
            Ok(n) => n,
            // Unmounted, or a request withdrawn before it was read.
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => break,
            Err(_) => continue,
        };
        if n < IN_HEADER {
            continue;
        }
        let word = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().unwrap());
        let (opcode, unique) = (word(4), u64::from_le_bytes(buf[8..16].try_into().unwrap()));
        let nodeid = u64::from_le_bytes(buf[16..24].try_into().unwrap());
        let body: Option<Result<Vec<u8>, i32>> = match opcode {
            INIT => Some(Ok(init_out())),
            LOOKUP => {
                let name = buf[IN_HEADER..n].split(|&b| b == 0).next().unwrap_or(&[]);
                Some(if name == b"f" {
                    Ok(entry_out())
                } else {
                    Err(libc::ENOENT)
                })
            }
            GETATTR => {
                let mut out = vec![0u8; 16];
                out.extend(attr(nodeid));
                Some(Ok(out))
            }
            OPEN => {
                let mut out = 1u64.to_le_bytes().to_vec();
                out.extend(FOPEN_KEEP_CACHE.to_le_bytes());
                out.extend(0u32.to_le_bytes());
                Some(Ok(out))
            }
            READ => {
                reads.fetch_add(1, Ordering::Relaxed);
                None
            }
            FORGET | BATCH_FORGET | INTERRUPT => None,
            RELEASE | FLUSH => Some(Ok(Vec::new())),
            _ => Some(Err(libc::ENOSYS)),
        };
        if let Some(body) = body {
            let (error, body) = match body {
                Ok(b) => (0i32, b),
                Err(e) => (-e, Vec::new()),
            };
            let mut out = ((16 + body.len()) as u32).to_le_bytes().to_vec();
            out.extend(error.to_le_bytes());
            out.extend(unique.to_le_bytes());
            out.extend(body);
            let _ = dev.write_all(&out);
        }
    }
    dev
}

/// `fuse_init_out`, protocol 7.31: no readahead, so that a fault reads
/// its one page in a request of its own.
fn init_out() -> Vec<u8> {
    let mut o = Vec::new();
    for v in [7u32, 31, 0, 0] {
        o.extend(v.to_le_bytes());
    }
    o.extend(16u16.to_le_bytes()); // max_background
    o.extend(12u16.to_le_bytes()); // congestion_threshold
    o.extend(4096u32.to_le_bytes()); // max_write
    o.extend(1u32.to_le_bytes()); // time_gran
    o.extend(32u16.to_le_bytes()); // max_pages
    o.extend(0u16.to_le_bytes()); // map_alignment
    o.extend([0u8; 32]); // flags2, max_stack_depth, unused
    o
}

/// `fuse_attr` of the root (1) or the file (2).
fn attr(nodeid: u64) -> Vec<u8> {
    let (mode, size) = if nodeid == 1 {
        (0o040755u32, 0)
    } else {
        (0o100644, SIZE)
    };
    let mut a = Vec::new();
    for v in [nodeid, size, size.div_ceil(512), 0, 0, 0] {
        a.extend(v.to_le_bytes());
    }
    for v in [0u32, 0, 0, mode, 1, 0, 0, 0, 4096, 0] {
        a.extend(v.to_le_bytes());
    }
    a
}

/// `fuse_entry_out` of `f`: node 2, cached for no time.
fn entry_out() -> Vec<u8> {
    let mut e = Vec::new();
    for v in [2u64, 0, 0, 0] {
        e.extend(v.to_le_bytes());
    }
    e.extend([0u8; 8]);
    e.extend(attr(2));
    e
}
