//! Signals sent to the job, and `oom_score_adj` changes (`signals.rs`).

use crate::{COMM_LEN, Header};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalEvent {
    /// `tgid` is the target process.
    pub hdr: Header,
    /// The target thread.
    pub target_pid: u32,
    pub sig: u32,
    /// `si_code`: 0 SI_USER (kill), 0x80 SI_KERNEL, negative for
    /// tkill/queue, positive for faults (SEGV_MAPERR...).
    pub code: i32,
    /// `TRACE_SIGNAL_*`: 0 delivered, 1 ignored, 2 already pending...
    pub result: i32,
    /// `current`: who sent it.
    pub sender_pid: u32,
    pub sender_tgid: u32,
    pub sender_uid: u32,
    pub _pad: u32,
    pub sender_comm: [u8; COMM_LEN],
    pub comm: [u8; COMM_LEN],
    // Fields below were added after the first layout (88 bytes); a reader
    // zero-fills them in a shorter record.
    /// With `FLAG_TTY`, for a signal the kernel generated (`SI_KERNEL`):
    /// the target's controlling terminal (`tty->name`, e.g. `pts3`), its
    /// session and its foreground process group when the signal was sent.
    /// A Ctrl-C is sent by whichever kworker ran the line discipline, so
    /// the terminal is the sender worth naming.
    pub tty_name: [u8; COMM_LEN],
    pub tty_session: u32,
    pub tty_pgrp: u32,
}

/// Size of the first `SignalEvent` layout, still accepted by the reader.
pub const SIGNAL_EVENT_V1_SIZE: usize = 88;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdjEvent {
    pub hdr: Header,
    pub oom_score_adj: i32,
    /// Who wrote it (`current`).
    pub writer_tgid: u32,
    pub comm: [u8; COMM_LEN],
}
