//! Signals the recorder receives: who really sent them, and passing them on
//! to the job. The kernel sees the recorder as the sender of what it passes
//! on; the record written here (`ssi_pid`, `ssi_uid`, or the terminal for
//! a Ctrl-C) lets the report name the one who asked.

use std::fs;

use nix::{libc::signalfd_siginfo, sys::signal::Signal};

use trainbpf_report::decode::{SignalReceived, Terminal};

/// `si_code` of a signal the kernel generated (a terminal's Ctrl-C, a
/// hangup).
const SI_KERNEL: i32 = 0x80;

/// Whether a signal the recorder read goes on to the job. One the terminal
/// generated (Ctrl-C: SI_KERNEL) reached the job's process group already;
/// sending it again would interrupt twice.
pub fn should_forward(info: &signalfd_siginfo) -> bool {
    info.ssi_code != SI_KERNEL
}

/// Sends the signal on to the job's main process.
pub fn forward(pid: u32, info: &signalfd_siginfo) {
    if let Ok(sig) = Signal::try_from(info.ssi_signo as i32) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
    }
}

/// The record of a signal the recorder read, written before it is passed
/// on (to `forwarded_to`), so that it precedes the kernel's record of the
/// forwarded kill. The sender is looked up at once: a `kill` exits right
/// after sending, and the kernel's own record fills in its name then.
pub fn received(info: &signalfd_siginfo, forwarded_to: Option<u32>) -> SignalReceived {
    let code = info.ssi_code;
    let pid = info.ssi_pid;
    let (sender_comm, sender_exe) = if pid == 0 {
        (String::new(), String::new())
    } else {
        (
            fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim_end_matches('\n').to_string())
                .unwrap_or_default(),
            fs::read_link(format!("/proc/{pid}/exe"))
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        )
    };
    SignalReceived {
        sig: info.ssi_signo as i32,
        code,
        sender_pid: pid,
        sender_uid: info.ssi_uid,
        sender_comm,
        sender_exe,
        recorder_pid: std::process::id(),
        forwarded_to,
        terminal: if code == SI_KERNEL && pid == 0 {
            own_terminal()
        } else {
            None
        },
    }
}

/// The recorder's controlling terminal, its session and foreground group,
/// from /proc/self/stat: a Ctrl-C came from there.
fn own_terminal() -> Option<Terminal> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    let (tty_nr, session, tpgid) = parse_stat_tty(&stat)?;
    Some(Terminal {
        tty: tty_name(tty_nr),
        session,
        foreground_pgrp: tpgid,
    })
}

/// `tty_nr`, `session` and `tpgid` of a /proc/PID/stat line; None without a
/// controlling terminal.
fn parse_stat_tty(stat: &str) -> Option<(u32, u32, u32)> {
    // The comm is in parentheses and may hold anything: fields resume
    // after the last ')'. Then: state ppid pgrp session tty_nr tpgid.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let session = f.get(3)?.parse().ok()?;
    let tty_nr: i64 = f.get(4)?.parse().ok()?;
    let tpgid: i64 = f.get(5)?.parse().ok()?;
    if tty_nr == 0 {
        return None;
    }
    Some((tty_nr as u32, session, tpgid.max(0) as u32))
}

/// The device path of a `tty_nr` (major in bits 8-15 and 20-31, minor in
/// bits 0-7 and 12-19).
fn tty_name(tty_nr: u32) -> String {
    let major = (tty_nr >> 8) & 0xfff;
    let minor = (tty_nr & 0xff) | ((tty_nr >> 12) & 0xfff00);
    match major {
        // Unix98 pty slaves: /dev/pts/N.
        136..=143 => format!("/dev/pts/{}", (major - 136) * 256 + minor),
        4 if minor < 64 => format!("/dev/tty{minor}"),
        4 => format!("/dev/ttyS{}", minor - 64),
        _ => format!("tty {major}:{minor}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_terminal_from_stat() {
        // A comm with spaces and a ')' must not shift the fields.
        let stat = "1240 (py th) on) S 1234 1240 1234 34819 1240 4194560 0 0";
        let (nr, session, tpgid) = parse_stat_tty(stat).unwrap();
        assert_eq!((session, tpgid), (1234, 1240));
        assert_eq!(tty_name(nr), "/dev/pts/3");
        assert_eq!(tty_name((4 << 8) | 1), "/dev/tty1");
        assert_eq!(tty_name((4 << 8) | 64), "/dev/ttyS0");
        // pts minors past 255 use the next major.
        assert_eq!(tty_name((137 << 8) | 2), "/dev/pts/258");
        assert_eq!(parse_stat_tty("9 (x) S 1 9 9 0 -1 0"), None);
    }
}
