//! A CUDA driver library mapped after recording started: no call missed.
//!
//! The uprobes go on a library's inode, and a library found only when a job
//! process maps it (a conda or container path, a `dlopen` at first use)
//! would otherwise be probed a scan later, its first calls unseen. So the
//! job's first touch of a mapped file named `libcuda.so*` whose inode is
//! not probed yet (`LIBCUDA_SEEN`), seen by the file fault tracepoints
//! (`late_fault`, `late_map_pages`), stops the touching thread's process
//! with SIGSTOP, sent here, in its own context: the stop takes effect on
//! the way back to user mode, before another user instruction runs, and
//! every other thread of the process stops with it. The dynamic linker
//! reads a library's dynamic section and relocates it through its mapping
//! before running any of it, so the first touch comes before the first
//! call. The collector, woken by the record on the precious ring, attaches
//! the probes to that file (uprobes registered after a mapping are
//! installed into it) and continues the process, unless someone else
//! stopped it meanwhile (`HELD`, kept by `signal_generate`).
//!
//! On kernels without those tracepoints, the `mmap` system call's
//! (`late_mmap`) holds at the mapping itself, through the descriptor
//! mapped.
//!
//! Where the process could not be held (the test switch, a full map, a
//! refused signal, a full ring) the window until the attach is kept
//! instead, per process, in `WINDOWS`, with its calls into the NVIDIA
//! driver (ioctls on `/dev/nvidia*`) where `late_ioctl` is attached.
//!
//! At `mmap`, only a mapping of a descriptor open for reading holds anyone:
//! that program runs before `mmap` checks the descriptor, and
//! one opened `O_PATH` (no read permission needed) or write-only makes the
//! mapping fail, on a file the job's user may not be able to read. Such a
//! mapping is said once per file (`SEEN_UNREADABLE`) and nothing else.
//!
//! A hold ends within a bound whatever the recorder does: its
//! entry carries when it began and the process's start time, the hold's
//! watchdog (trainbpf/src/gpu/watchdog.rs) continues a process held past
//! its limit, and every held one if the recorder dies, through a pidfd
//! checked against that start time; a live hold's entry goes at the
//! process's exit (`lifecycle.rs`), so that a pid reused later names no
//! hold. No BPF
//! program can do this itself: one can signal only the task it runs in,
//! and a stopped task runs nothing.
//!
//! Cost: the fault programs run at every file fault on the machine and end
//! at the job map's lookup for a process outside the job. A classic syscall
//! tracepoint sets every task's syscall-trace flag, so each system call
//! takes the slow path: `late_mmap`, and `late_ioctl` (a window's driver
//! calls), are attached only where the fault tracepoints are missing, or
//! where windows are the rule (an attached recorder). BENCHMARKS.md has
//! the figures.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::{addr_of, addr_of_mut},
};

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns,
        bpf_probe_read_kernel_str_bytes, bpf_send_signal_thread,
    },
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use trainbpf_common::*;

use crate::{
    count_lost, header, leader_start_ns,
    maps::{HELD, JOB, LIBCUDA_SEEN, PRECIOUS, WINDOWS},
    rd,
};

const MAP_ANONYMOUS: u64 = 0x20;
const SIGSTOP: u32 = 19;
const BPF_NOEXIST: u64 = 1;
/// `-EEXIST`, as map updates return it.
const EEXIST: i32 = -17;
const BPF_RB_FORCE_WAKEUP: u64 = 2;

#[inline(always)]
fn late_conf(p: *const i64) -> i64 {
    // SAFETY: `p` points into GPU_CONFIG, which lives for the program's life.
    unsafe { core::ptr::read_volatile(p) }
}

macro_rules! lc {
    ($f:ident) => {
        late_conf(addr_of!(crate::gpu::GPU_CONFIG.$f))
    };
}

/// `current->files->fdt->fd[fd]`, or 0.
#[inline(always)]
fn fd_file(fd: u64) -> u64 {
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let Ok(files) = rd::<u64>(task, conf!(task_files)) else {
        return 0;
    };
    let Ok(fdt) = rd::<u64>(files, conf!(files_fdt)) else {
        return 0;
    };
    let max: u32 = rd(fdt, conf!(fdt_max_fds)).unwrap_or(0);
    if fd >= max as u64 {
        return 0;
    }
    let Ok(arr) = rd::<u64>(fdt, conf!(fdt_fd)) else {
        return 0;
    };
    rd::<u64>(arr, (fd & 0xffff_ffff) as i64 * 8).unwrap_or(0)
}

/// The first bytes of a dentry's name, NUL-padded.
#[inline(always)]
fn dentry_name(dentry: u64, buf: &mut [u8]) -> bool {
    let Ok(name) = rd::<u64>(dentry, conf!(dentry_name)) else {
        return false;
    };
    // SAFETY: the read is bounded by the buffer and fails cleanly.
    unsafe { bpf_probe_read_kernel_str_bytes(name as *const u8, buf) }.is_ok()
}

/// A descriptor's file's dentry, or 0.
#[inline(always)]
fn file_dentry(file: u64) -> u64 {
    rd::<u64>(file, conf!(file_dentry)).unwrap_or(0)
}

/// Whether `dentry`'s name starts `libcuda.so`.
#[inline(always)]
fn names_libcuda(dentry: u64) -> bool {
    let mut head = [0u8; 16];
    dentry_name(dentry, &mut head) && starts_with(&head, b"libcuda.so")
}

/// An inode's device and number, as `LIBCUDA_SEEN` and the records key
/// a file.
#[inline(always)]
fn inode_key(inode: u64) -> Result<FileKey, u32> {
    let ino: u64 = rd(inode, conf!(inode_ino))?;
    let sb: u64 = rd(inode, conf!(inode_sb))?;
    let dev: u32 = rd(sb, conf!(sb_dev))?;
    Ok(FileKey {
        dev: dev as u64,
        ino,
    })
}

#[inline(always)]
fn starts_with(buf: &[u8], prefix: &[u8]) -> bool {
    if buf.len() < prefix.len() {
        return false;
    }
    let mut i = 0;
    while i < prefix.len() {
        if buf[i] != prefix[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// `syscalls:sys_enter_mmap`: a job thread maps a file.
#[tracepoint]
pub fn late_mmap(ctx: TracePointContext) -> u32 {
    match try_late_mmap(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

fn try_late_mmap(ctx: &TracePointContext) -> Result<u32, u32> {
    let flags_off = lc!(mmap_flags);
    let fd_off = lc!(mmap_fd);
    if flags_off < 0 || fd_off < 0 {
        return Ok(0);
    }
    // SAFETY: offsets from this kernel's format file.
    let flags: u64 = unsafe { ctx.read_at(flags_off as usize) }.map_err(|_| 0u32)?;
    // SAFETY: as above.
    let fd: u64 = unsafe { ctx.read_at(fd_off as usize) }.map_err(|_| 0u32)?;
    if flags & MAP_ANONYMOUS != 0 || (fd as i64) < 0 {
        return Ok(0);
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // The job's tree only, never `record --all`'s every process: a process
    // outside it is never stopped.
    // SAFETY: tested for presence only.
    if unsafe { JOB.get(&tgid) }.is_none() {
        return Ok(0);
    }
    let file = fd_file(fd);
    if file == 0 {
        return Ok(0);
    }
    let dentry = file_dentry(file);
    if !names_libcuda(dentry) {
        return Ok(0);
    }
    let key = inode_key(rd(file, conf!(file_inode))?)?;
    // SAFETY: the value is copied out at once.
    let seen = unsafe { LIBCUDA_SEEN.get(&key) }.copied();
    if seen == Some(SEEN_TRIED) {
        return Ok(0);
    }
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // A descriptor not open for reading (O_PATH needs no read permission;
    // a write-only one) fails this mmap, and its file may be one the
    // job's user cannot read: never held, never a reason to probe. Said
    // once per file, so that a job looping on such mappings costs one
    // record.
    let mode: u32 = rd(file, conf!(file_f_mode))?;
    if mode & FMODE_READ == 0 || mode & FMODE_PATH != 0 {
        if seen.is_some() {
            return Ok(0);
        }
        match LIBCUDA_SEEN.insert(&key, &SEEN_UNREADABLE, BPF_NOEXIST) {
            Ok(()) => {}
            Err(EEXIST) => return Ok(0),
            Err(_) => {
                count_lost(KIND_CUDA_MAP, "late_mmap");
                return Ok(0);
            }
        }
        let Some(mut entry) = PRECIOUS.reserve::<CudaMapEvent>(0) else {
            count_lost(KIND_CUDA_MAP, "late_mmap");
            return Ok(0);
        };
        fill(
            entry.as_mut_ptr(),
            now,
            fd as i32,
            MAP_NOT_READABLE,
            &key,
            dentry,
        );
        entry.submit(BPF_RB_FORCE_WAKEUP);
        return Ok(0);
    }
    Ok(hold(tgid, &key, dentry, fd as i32, now, "late_mmap"))
}

/// `mm_filemap_fault(struct address_space *mapping, pgoff_t index)`: a
/// page of a mapped file faulted in, where fault-around did not map it.
/// With [`late_map_pages`], the first touch of any page of a mapping, in
/// the touching thread's context: the dynamic linker reads a library's
/// dynamic section and relocates it through its mapping before any of
/// its code runs, so a hold here still comes before the library's first
/// instruction. Unlike the `mmap` system call's tracepoint, these cost a
/// process outside the job only its file faults, never its system calls.
#[btf_tracepoint(function = "mm_filemap_fault")]
pub fn late_fault(ctx: BtfTracePointContext) -> u32 {
    try_late_fault(ctx.arg(0), "late_fault").unwrap_or(0)
}

/// `mm_filemap_map_pages(struct address_space *mapping, pgoff_t first,
/// pgoff_t last)`: fault-around mapped pages already in the page cache.
#[btf_tracepoint(function = "mm_filemap_map_pages")]
pub fn late_map_pages(ctx: BtfTracePointContext) -> u32 {
    try_late_fault(ctx.arg(0), "late_map_pages").unwrap_or(0)
}

fn try_late_fault(mapping: u64, prog: &'static str) -> Result<u32, u32> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // As for `mmap`: the job's tree only.
    // SAFETY: tested for presence only.
    if unsafe { JOB.get(&tgid) }.is_none() {
        return Ok(0);
    }
    let inode: u64 = rd(mapping, conf!(mapping_host))?;
    // A name of the file: its inode's first dentry. A mapped file has one
    // (the one it was opened by, or another hard link of it).
    let first: u64 = rd(inode, conf!(inode_dentry))?;
    if first == 0 || conf!(dentry_alias) < 0 {
        return Ok(0);
    }
    let dentry = first.wrapping_sub(conf!(dentry_alias) as u64);
    if !names_libcuda(dentry) {
        return Ok(0);
    }
    let key = inode_key(inode)?;
    // SAFETY: the value is copied out at once.
    if unsafe { LIBCUDA_SEEN.get(&key) }.copied() == Some(SEEN_TRIED) {
        return Ok(0);
    }
    // Every page of the mapping faults here, not once per mapping as the
    // system call does: a process already held or in a window for this
    // file (faults from the kernel's side before its stop takes effect, or
    // from its other threads while it runs unheld) adds nothing.
    // SAFETY: the values are read at once.
    if unsafe { HELD.get(&tgid) }
        .is_some_and(|h| h.dev == key.dev && h.ino == key.ino && h.timed_out_ns == 0)
        // SAFETY: as above.
        || unsafe { WINDOWS.get(&tgid) }.is_some_and(|w| w.dev == key.dev && w.ino == key.ino)
    {
        return Ok(0);
    }
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    Ok(hold(tgid, &key, dentry, -1, now, prog))
}

/// A job process maps `key`, a driver library not probed yet (`dentry`:
/// a name of it; `fd`: the descriptor mapped, or -1 where a fault found
/// the mapping): its process is stopped until the collector probes the
/// file, or, where it can't be, its window opened. The record goes on the
/// precious ring either way.
#[inline(always)]
fn hold(tgid: u32, key: &FileKey, dentry: u64, fd: i32, now: u64, prog: &'static str) -> u32 {
    let (dev, ino) = (key.dev, key.ino);
    let window = LateWindow {
        start_ns: now,
        dev,
        ino,
        calls: 0,
    };
    // The record first: a process held with no record would wait for the
    // watchdog's limit.
    let Some(mut entry) = PRECIOUS.reserve::<CudaMapEvent>(0) else {
        count_lost(KIND_CUDA_MAP, prog);
        let _ = WINDOWS.insert(&tgid, &window, BPF_NOEXIST);
        return 0;
    };
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let leader: u64 = rd(task, conf!(task_group_leader)).unwrap_or(task);
    let hold = Held {
        sending: 1,
        since_ns: now,
        start_ns: leader_start_ns(task),
        start_boottime_ns: rd(leader, conf!(task_start_boottime)).unwrap_or(0),
        dev,
        ino,
        ..Held::default()
    };
    let held = if lc!(late_hold) == 0 {
        MAP_NOT_HELD_OFF
    } else if let Err(why) = claim(tgid, &hold) {
        why
        // SAFETY: the signal goes to the current thread, a job thread.
    } else if unsafe { bpf_send_signal_thread(SIGSTOP) } == 0 {
        if let Some(h) = HELD.get_ptr_mut(&tgid) {
            // SAFETY: the entry is this process's; signal_generate may
            // have cleared it already.
            unsafe { (*h).sending = 0 };
        }
        MAP_HELD
    } else {
        let _ = HELD.remove(&tgid);
        MAP_NOT_HELD_SIGNAL
    };
    if held != MAP_HELD {
        let _ = WINDOWS.insert(&tgid, &window, BPF_NOEXIST);
    }
    fill(entry.as_mut_ptr(), now, fd, held, key, dentry);
    entry.submit(BPF_RB_FORCE_WAKEUP);
    0
}

/// Makes `tgid`'s hold. A live hold stands (another thread's mapping, or
/// torchelastic's agent held at its wait): two holds in flight share one
/// `sending` flag, and the second stop would be counted as someone
/// else's, leaving the process stopped for good. An entry the watchdog
/// timed out, kept for the collector to count, is replaced.
#[inline(always)]
pub(crate) fn claim(tgid: u32, hold: &Held) -> Result<(), u32> {
    match HELD.insert(&tgid, hold, BPF_NOEXIST) {
        Ok(()) => Ok(()),
        // SAFETY: the value is read at once.
        Err(EEXIST) if unsafe { HELD.get(&tgid) }.is_some_and(|h| h.timed_out_ns != 0) => {
            HELD.insert(&tgid, hold, 0).map_err(|_| MAP_NOT_HELD_FULL)
        }
        Err(EEXIST) => Err(MAP_NOT_HELD_BUSY),
        Err(_) => Err(MAP_NOT_HELD_FULL),
    }
}

/// Writes the record of the current thread's mapping of the file `key`,
/// named by `dentry`.
#[inline(always)]
fn fill(ev: *mut CudaMapEvent, now: u64, fd: i32, held: u32, key: &FileKey, dentry: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    // SAFETY: `ev` points at a reserved slot of the right size.
    unsafe {
        (*ev).hdr = header(
            KIND_CUDA_MAP,
            FLAG_IN_JOB,
            (pid_tgid >> 32) as u32,
            leader_start_ns(task),
        );
        (*ev).hdr.ts_ns = now;
        (*ev).tid = pid_tgid as u32;
        (*ev).fd = fd;
        (*ev).held = held;
        (*ev)._pad = 0;
        (*ev).dev = key.dev;
        (*ev).ino = key.ino;
        let name = &mut *core::ptr::addr_of_mut!((*ev).name);
        *name = [0; MAP_NAME_LEN];
        dentry_name(dentry, name);
    }
}

/// `syscalls:sys_enter_ioctl`: in an uncovered window, a call into the
/// NVIDIA driver (`/dev/nvidiactl`, `/dev/nvidia0`, `/dev/nvidia-uvm`) is
/// counted: what the window's CUDA calls asked of the device.
#[tracepoint]
pub fn late_ioctl(ctx: TracePointContext) -> u32 {
    match try_late_ioctl(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

fn try_late_ioctl(ctx: &TracePointContext) -> Result<u32, u32> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let Some(w) = WINDOWS.get_ptr_mut(&tgid) else {
        return Ok(0);
    };
    let fd_off = lc!(ioctl_fd);
    if fd_off < 0 {
        return Ok(0);
    }
    // SAFETY: offset from this kernel's format file.
    let fd: u64 = unsafe { ctx.read_at(fd_off as usize) }.map_err(|_| 0u32)?;
    let file = fd_file(fd & 0xffff_ffff);
    if file == 0 {
        return Ok(0);
    }
    let mut head = [0u8; 8];
    if !dentry_name(file_dentry(file), &mut head) || !starts_with(&head, b"nvidia") {
        return Ok(0);
    }
    // SAFETY: `w` points at the map's value; the add is atomic.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(addr_of_mut!((*w).calls), 1) };
    Ok(0)
}

/// From `signal_generate`: a stop or continue sent to a held process.
/// The hold's own SIGSTOP clears `sending`; any other stop is someone
/// else's (the collector then leaves the process stopped), and a SIGCONT
/// before the collector's ends the hold early. True for the hold's own.
#[inline(always)]
pub(crate) fn on_signal(sig: i32, tgid: u32) -> bool {
    let Some(h) = HELD.get_ptr_mut(&tgid) else {
        return false;
    };
    // SAFETY: the map's value; racing writers only set flags.
    unsafe {
        if sig == 18 {
            (*h).other_cont = 1;
        } else if (*h).sending != 0 {
            (*h).sending = 0;
            return true;
        } else {
            (*h).other_stop = 1;
        }
    }
    false
}
