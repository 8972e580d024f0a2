//! Fork, exec and exit of the job's processes (`lifecycle.rs` in the
//! eBPF crate).

use crate::{COMM_LEN, Header};

/// Bytes of an exec'd filename kept; longer paths are cut (and flagged).
pub const FILENAME_LEN: usize = 128;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForkEvent {
    pub hdr: Header,
    pub parent_tgid: u32,
    pub _pad: u32,
    pub parent_start_ns: u64,
    pub comm: [u8; COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecEvent {
    pub hdr: Header,
    pub comm: [u8; COMM_LEN],
    pub filename: [u8; FILENAME_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitEvent {
    pub hdr: Header,
    /// `task->exit_code` of the last thread (wait-status encoding).
    pub exit_code: u32,
    /// `signal->group_exit_code`, non-zero when the whole group was told to
    /// exit (a fatal signal, `exit_group`).
    pub group_exit_code: u32,
    pub comm: [u8; COMM_LEN],
}
