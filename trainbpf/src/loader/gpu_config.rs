//! The GPU programs' offsets, from tracefs: the driver's Xid tracepoint
//! and the syscall tracepoints the late-library hold reads.

use trainbpf_common::GpuConfig;

use super::kernel;

/// The offsets for the object's `GPU_CONFIG`; all -1 where a tracepoint is
/// missing (tracefs must be mounted).
pub(super) fn gpu_config() -> GpuConfig {
    let mut c = GpuConfig::UNSET;
    if let Some(f) = kernel::tp_format("nvidia", "nvidia_dev_xid") {
        c.xid_dev = kernel::field(&f, "dev");
        c.xid_code = kernel::field(&f, "error_code");
        c.xid_msg = kernel::field(&f, "msg");
    }
    if let Some(f) = kernel::tp_format("syscalls", "sys_enter_mmap") {
        c.mmap_flags = kernel::field(&f, "flags");
        c.mmap_fd = kernel::field(&f, "fd");
    }
    if let Some(f) = kernel::tp_format("syscalls", "sys_enter_ioctl") {
        c.ioctl_fd = kernel::field(&f, "fd");
    }
    c
}
