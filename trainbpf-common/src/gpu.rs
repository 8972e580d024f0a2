//! Kinds 20-29 belong to the GPU probes (CUDA driver uprobes, the NVIDIA
//! driver's Xid tracepoint and its page allocator).

use crate::{COMM_LEN, Header, KIND_MAX};

/// A CUDA driver API call of a job process returned. [`CudaEvent`].
pub const KIND_CUDA: u16 = 20;
/// `nvidia:nvidia_dev_xid`: the driver reported an Xid error. [`XidEvent`].
pub const KIND_XID: u16 = 21;
/// The NVIDIA driver allocated or freed host pages for a job process
/// (`nv_alloc_pages`/`nv_free_pages` kprobes). [`NvPagesEvent`].
pub const KIND_NV_PAGES: u16 = 22;
/// A job thread mapped a `libcuda.so*` file whose inode is not probed yet
/// (`syscalls:sys_enter_mmap`): held with SIGSTOP until the collector has
/// attached the uprobes, or, where it could not be held, the start of a
/// window in which its calls go unrecorded. Precious ring. [`CudaMapEvent`].
pub const KIND_CUDA_MAP: u16 = 23;

/// `CudaMapEvent::held`: the thread was sent SIGSTOP and waits for the
/// collector's SIGCONT.
pub const MAP_HELD: u32 = 1;
/// Not held: the loader turned holding off (the test switch).
pub const MAP_NOT_HELD_OFF: u32 = 2;
/// Not held: `bpf_send_signal_thread` failed.
pub const MAP_NOT_HELD_SIGNAL: u32 = 3;
/// Not held: the held-process map was full.
pub const MAP_NOT_HELD_FULL: u32 = 4;
/// Neither held nor probed: the descriptor mapped is not open for reading
/// (`O_PATH`, write-only), so the mapping fails and the job could not read
/// the file; said once per file.
pub const MAP_NOT_READABLE: u32 = 5;
/// Not held: the process was held already, by another thread's mapping or
/// as torchelastic's agent; a second hold would take the first one's stop
/// for someone else's and leave the process stopped.
pub const MAP_NOT_HELD_BUSY: u32 = 6;

/// `file.f_mode` bits (include/linux/fs.h, the same from 5.10 to 6.18):
/// open for reading, and opened with `O_PATH`.
pub const FMODE_READ: u32 = 0x1;
pub const FMODE_PATH: u32 = 0x4000;

/// `LIBCUDA_SEEN`'s values: the file was probed or tried (userspace), or
/// a mapping through a descriptor not open for reading was said (the
/// kernel); a readable mapping of the latter is still held.
pub const SEEN_TRIED: u32 = 1;
pub const SEEN_UNREADABLE: u32 = 2;

/// Bytes of a mapped file's name kept.
pub const MAP_NAME_LEN: usize = 64;

/// `CudaEvent::op`: which CUDA driver call returned. Explicit and never
/// reused, like the record kinds; `_ptsz` variants share their base op.
pub const CU_INIT: u32 = 1;
pub const CU_PRIMARY_CTX_RETAIN: u32 = 2;
pub const CU_CTX_CREATE_V2: u32 = 3;
pub const CU_CTX_CREATE_V3: u32 = 4;
pub const CU_CTX_CREATE_V4: u32 = 5;
pub const CU_MEM_ALLOC: u32 = 10;
pub const CU_MEM_FREE: u32 = 11;
pub const CU_MEM_ALLOC_ASYNC: u32 = 12;
pub const CU_MEM_FREE_ASYNC: u32 = 13;
pub const CU_MEM_ALLOC_FROM_POOL: u32 = 14;
pub const CU_MEM_ALLOC_MANAGED: u32 = 15;
pub const CU_MEM_ALLOC_HOST: u32 = 20;
pub const CU_MEM_HOST_ALLOC: u32 = 21;
pub const CU_MEM_FREE_HOST: u32 = 22;
pub const CU_MEM_HOST_REGISTER: u32 = 23;
pub const CU_MEM_HOST_UNREGISTER: u32 = 24;
pub const CU_MEM_CREATE: u32 = 30;
pub const CU_MEM_RELEASE: u32 = 31;
pub const CU_MEM_MAP: u32 = 32;
pub const CU_MEM_UNMAP: u32 = 33;

/// `NvPagesEvent::op`.
pub const NV_PAGES_ALLOC: u32 = 1;
pub const NV_PAGES_FREE: u32 = 2;

/// Bytes of an Xid's PCI device name (`0000:3b:00.0`) kept.
pub const XID_DEV_LEN: usize = 32;
/// Bytes of an Xid's message kept.
pub const XID_MSG_LEN: usize = 192;

/// One CUDA driver call, written when it returns: the entry's arguments are
/// paired with the result, so a pointer or handle is recorded only when the
/// call succeeded (`result` 0) and a failed allocation keeps its requested
/// size and error (CUDA_ERROR_OUT_OF_MEMORY is 2).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaEvent {
    /// `ts_ns` is the return.
    pub hdr: Header,
    /// `CU_*`.
    pub op: u32,
    /// `CUresult`.
    pub result: u32,
    /// The calling thread.
    pub tid: u32,
    /// `CUdevice` of a context call, location id of `cuMemCreate`; -1 when
    /// the call names none (`cuMemAlloc` uses the current context's).
    pub device: i32,
    /// Bytes requested (allocations, registers, map/unmap); `cuInit` flags.
    pub size: u64,
    /// What the call returned through its out-pointer (device pointer, host
    /// pointer, allocation handle, context) or the pointer/handle it was
    /// given (frees, unmaps, releases, `cuMemHostRegister`, `cuMemMap`'s VA).
    pub ptr: u64,
    /// `cuMemMap`'s allocation handle; `cuMemAllocFromPoolAsync`'s pool.
    pub handle: u64,
    /// Flags (managed, host alloc, register), stream, `cuMemMap`'s offset,
    /// or `cuMemCreate`'s location type (1 device, 2+ host).
    pub aux: u64,
    /// When the call entered (CLOCK_MONOTONIC ns).
    pub entry_ns: u64,
    pub comm: [u8; COMM_LEN],
}

/// An Xid error from the driver's own tracepoint (driver 575 and later).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XidEvent {
    /// `tgid` is `current`, usually not the process the Xid is about: the
    /// message names that one (`pid=…, name=…`).
    pub hdr: Header,
    pub code: u32,
    /// Bytes of `msg` that hold text.
    pub msg_len: u32,
    /// PCI name of the GPU.
    pub dev: [u8; XID_DEV_LEN],
    pub msg: [u8; XID_MSG_LEN],
}

/// The NVIDIA driver's own host-page allocations for a job process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvPagesEvent {
    pub hdr: Header,
    /// `NV_PAGES_*`.
    pub op: u32,
    /// `page_count` as the driver passed it (OS pages).
    pub page_count: u32,
    pub tid: u32,
    pub _pad: u32,
}

/// A job thread's `mmap` of a `libcuda.so*` file not yet probed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaMapEvent {
    /// `ts_ns`: the mmap's entry.
    pub hdr: Header,
    pub tid: u32,
    /// The descriptor mapped: the collector opens the file through it
    /// (`/proc/TID/fd/FD`) while the thread is held.
    pub fd: i32,
    /// `MAP_HELD` or why not (`MAP_NOT_HELD_*`).
    pub held: u32,
    pub _pad: u32,
    /// The file's `super_block.s_dev` (the kernel's dev_t: major << 20 |
    /// minor) and inode number.
    pub dev: u64,
    pub ino: u64,
    /// The dentry's name, NUL-padded.
    pub name: [u8; MAP_NAME_LEN],
}

/// A library file already probed or tried, as the kernel names it
/// (`LIBCUDA_SEEN`'s key): its mmap holds no one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileKey {
    /// `super_block.s_dev`, the kernel's encoding.
    pub dev: u64,
    pub ino: u64,
}

/// A job process mapped a driver library it could not be held at: the
/// window lasts until the collector has attached, and the process's calls
/// into the NVIDIA driver (ioctls on `/dev/nvidia*`, the path every device
/// allocation takes) are counted meanwhile. `WINDOWS`' value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LateWindow {
    pub start_ns: u64,
    pub dev: u64,
    pub ino: u64,
    /// Driver ioctls in the window.
    pub calls: u64,
}

/// [`Held::reason`]: at its mapping of an unprobed driver library.
pub const HOLD_LIBRARY: u32 = 0;
/// [`Held::reason`]: torchelastic's agent, waiting on a worker killed by
/// the OOM killer, until the worker's error file is written.
pub const HOLD_AGENT: u32 = 1;

/// A process held at its mapping of a driver library, or an agent at its
/// wait on a killed worker (`HELD`'s value):
/// what the collector, or the hold's watchdog, must know before it sends
/// SIGCONT. The entry goes at the process's exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Set while the hold's own SIGSTOP is being sent: `signal_generate`
    /// clears it instead of counting that stop as someone else's.
    pub sending: u32,
    /// Someone else stopped the process while it was held: it stays
    /// stopped (the collector does not continue it).
    pub other_stop: u32,
    /// Someone else continued it before the probes were on.
    pub other_cont: u32,
    /// Why it is held: [`HOLD_LIBRARY`] or [`HOLD_AGENT`].
    pub reason: u32,
    /// When the hold began (CLOCK_MONOTONIC ns).
    pub since_ns: u64,
    /// The group leader's `start_time`, as in the record headers.
    pub start_ns: u64,
    /// The group leader's `start_boottime`, ns: `/proc/PID/stat`'s start
    /// time, in clock ticks there.
    pub start_boottime_ns: u64,
    /// The file mapped (the kernel's dev_t, inode): the window the
    /// watchdog opens when it ends the hold.
    pub dev: u64,
    pub ino: u64,
    /// When the hold's watchdog continued the process, the hold having run
    /// past its limit (0: it did not).
    pub timed_out_ns: u64,
}

/// Per-CPU counters of the GPU probes, besides the ring-buffer losses kept
/// in [`Counters::lost`]: nothing is dropped silently.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuCounters {
    /// Calls not recorded because the map pairing entries with returns was
    /// full.
    pub pending_full: u64,
    /// Successful calls whose returned pointer or handle could not be read
    /// from the caller's memory (recorded with `ptr` 0).
    pub read_failed: u64,
}

/// Offsets of the `nvidia:nvidia_dev_xid` record, from its tracefs format
/// file when the driver has the tracepoint; -1 otherwise. Then what the
/// late-library probe reads: the `syscalls:sys_enter_mmap` and
/// `sys_enter_ioctl` fields (tracefs); the path from a descriptor to its
/// file's name and inode is in [`crate::Config`] (BTF).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuConfig {
    /// `__data_loc char[] dev`.
    pub xid_dev: i64,
    /// `u32 error_code`.
    pub xid_code: i64,
    /// `__data_loc char[] msg`.
    pub xid_msg: i64,
    pub mmap_flags: i64,
    pub mmap_fd: i64,
    pub ioctl_fd: i64,
    /// 1: hold a thread that maps an unprobed driver library; 0: don't
    /// (the test switch that forces a window).
    pub late_hold: i64,
}

impl GpuConfig {
    pub const UNSET: GpuConfig = GpuConfig {
        xid_dev: -1,
        xid_code: -1,
        xid_msg: -1,
        mmap_flags: -1,
        mmap_fd: -1,
        ioctl_fd: -1,
        late_hold: 1,
    };
}

const _: () = assert!(core::mem::size_of::<CudaEvent>() == 96);
const _: () = assert!(core::mem::size_of::<XidEvent>() == 256);
const _: () = assert!(core::mem::size_of::<NvPagesEvent>() == 40);
const _: () = assert!(core::mem::size_of::<GpuCounters>() == 16);
const _: () = assert!(core::mem::size_of::<GpuConfig>() == 7 * 8);
const _: () = assert!(core::mem::size_of::<CudaMapEvent>() == 24 + 16 + 16 + MAP_NAME_LEN);
const _: () = assert!(core::mem::size_of::<Held>() == 16 + 6 * 8);
const _: () = assert!(KIND_CUDA_MAP < KIND_MAX);

#[cfg(feature = "user")]
mod gpu_pod {
    use super::*;
    // SAFETY: plain-old-data: #[repr(C)], integers only, no implicit padding.
    unsafe impl aya::Pod for GpuConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for GpuCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for FileKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for LateWindow {}
    // SAFETY: as above.
    unsafe impl aya::Pod for Held {}
}
