//! Continuing a held process without naming it by a raw pid.
//!
//!
//! A pid names a process only while that process lives; the one held may
//! have been killed and its pid taken by another. So a held process is
//! continued through a pidfd (Linux 5.3+), which names one process for
//! good, and only once that process is known to be the one held: its
//! start time, read from `/proc/PID/stat` while the pidfd shows it alive
//! (so that the pid named it throughout), is the one the kernel stored
//! with the hold (`Held::start_boottime_ns`).

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use trainbpf_common::Held;

/// One process, by a pidfd.
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// The process `pid` names now.
    pub fn open(pid: u32) -> io::Result<Pidfd> {
        // SAFETY: plain syscall; the descriptor returned is ours.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just returned by the kernel, owned by no one else.
        Ok(Pidfd(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// Sends `sig` (0: only whether it lives) to the process.
    pub fn signal(&self, sig: i32) -> io::Result<()> {
        // SAFETY: plain syscall on our descriptor; no siginfo.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether the process, which `pid` named when it was opened, is the
    /// one that started at `start_boottime_ns`.
    pub fn started_at(&self, pid: u32, start_boottime_ns: u64) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
        // Alive after the read: the pid named it throughout, so the stat
        // read was its own.
        if self.signal(0).is_err() {
            return false;
        }
        let Some(ticks) = stat.ok().as_deref().and_then(stat_start_ticks) else {
            return false;
        };
        start_ticks(start_boottime_ns, boottime_offset_ns(), clock_ticks()) == Some(ticks)
    }
}

/// Continues the process `tgid` held as `h`, unless its pid now names
/// another process. `Ok(false)`: it is gone, or not the one held.
pub(super) fn continue_held(tgid: u32, h: &Held) -> io::Result<bool> {
    let pidfd = match Pidfd::open(tgid) {
        Ok(p) => p,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(false),
        Err(e) => return Err(e),
    };
    if !pidfd.started_at(tgid, h.start_boottime_ns) {
        return Ok(false);
    }
    match pidfd.signal(libc::SIGCONT) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Field 22 of `/proc/PID/stat`, the start time in clock ticks.
fn stat_start_ticks(stat: &str) -> Option<u64> {
    // The comm may hold blanks and parentheses: fields are counted after
    // its last ')'. The rest starts at field 3.
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// The ticks `/proc/PID/stat` shows for a start at `boottime_ns`: the
/// kernel adds the reader's time namespace's boot-time offset, then
/// divides (`nsec_to_clock_t`).
fn start_ticks(boottime_ns: u64, offset_ns: i64, ticks_per_s: u64) -> Option<u64> {
    if ticks_per_s == 0 || 1_000_000_000 % ticks_per_s != 0 {
        return None;
    }
    let ns = boottime_ns.checked_add_signed(offset_ns)?;
    Some(ns / (1_000_000_000 / ticks_per_s))
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).unwrap_or(0)
}

/// The boot-time offset of our time namespace (0 outside one, or on a
/// kernel without time namespaces).
fn boottime_offset_ns() -> i64 {
    std::fs::read_to_string("/proc/self/timens_offsets")
        .ok()
        .as_deref()
        .and_then(parse_boottime_offset)
        .unwrap_or(0)
}

/// The `boottime SECS NSECS` line of `timens_offsets`.
fn parse_boottime_offset(text: &str) -> Option<i64> {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some("boottime"))?;
    let mut f = line.split_whitespace().skip(1);
    let secs: i64 = f.next()?.parse().ok()?;
    let nsecs: i64 = f.next()?.parse().ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(nsecs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_times_convert_as_the_kernel_shows_them() {
        let stat = "4242 (a b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10 18446744073709551615";
        assert_eq!(stat_start_ticks(stat), Some(123456));
        assert_eq!(stat_start_ticks("4242 (x) S 1"), None);
        // 1234.5678 s after boot at USER_HZ 100.
        assert_eq!(start_ticks(1_234_567_800_000, 0, 100), Some(123_456));
        assert_eq!(
            start_ticks(1_234_567_800_000, 10_000_000_000, 100),
            Some(124_456)
        );
        assert_eq!(start_ticks(5, -10, 100), None);
        assert_eq!(start_ticks(5, 0, 0), None);
        assert_eq!(
            parse_boottime_offset("monotonic 0 0\nboottime 10 500\n"),
            Some(10_000_000_500)
        );
        assert_eq!(parse_boottime_offset("monotonic 0 0\n"), None);
    }

    #[test]
    fn this_process_is_named_by_its_start_time() {
        let me = std::process::id();
        let stat = std::fs::read_to_string(format!("/proc/{me}/stat")).unwrap();
        let ticks = stat_start_ticks(&stat).unwrap();
        let per_tick = 1_000_000_000 / clock_ticks();
        let p = Pidfd::open(me).unwrap();
        // Any time in the right tick is our start; the tick after is not.
        assert!(p.started_at(me, ticks * per_tick + per_tick / 2));
        assert!(!p.started_at(me, (ticks + 1) * per_tick));
    }
}
