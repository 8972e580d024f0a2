//! The hold's watchdog: a process of its own that
//! ends every hold within [`HOLD_LIMIT`], and all of them at once when the
//! recorder dies, so that neither a stuck nor a dead recorder leaves a job
//! stopped.
//!
//! Why a process, and not the kernel: a BPF program can signal only the
//! task it runs in (`bpf_send_signal`, `bpf_send_signal_thread`), and a
//! stopped task runs nothing. A BPF timer (5.15+) runs in no task at all;
//! the kfunc that signals another task (`bpf_send_signal_task`) came in
//! 6.13, and aya 0.14 can call no kfunc (nor declare the BTF-described map
//! value a timer needs). So on no kernel this recorder supports can a hold
//! end itself; what the kernel does is drop a hold when its process exits
//! (trainbpf-ebpf/src/lifecycle.rs), so that no later process is taken for
//! it.
//!
//! The watchdog is `trainbpf __gpu-hold-watchdog`, the recorder's own
//! binary, started before any hold can begin. It runs only as a child of a
//! trainbpf of its own effective uid (as the job's trampoline does), in a
//! session of its own (no terminal's signals), ignoring the signals that
//! stop or end a process politely, at the recorder's OOM protection. It
//! holds the kernel's `HELD` and `WINDOWS` maps (descriptors passed across
//! exec) and one end of a socket pair whose other end only the recorder
//! holds:
//! - every [`SCAN`] it continues a process held longer than
//!   [`HOLD_LIMIT`], unless someone else stopped it too; it marks the hold
//!   timed out and opens the process's uncovered window, so that the
//!   recorder counts the calls it then misses;
//! - when the recorder's end closes, whatever ended the recorder, it
//!   continues every process still held, at once, and exits.
//!
//! Each process is continued through a pidfd checked against the hold's
//! start time ([`super::held`]), never by a raw pid.

use std::{
    ffi::OsString,
    io::{self, Read as _, Write as _},
    os::{
        fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{net::UnixStream, process::CommandExt as _},
    },
    process::{Child, Command, Stdio},
    time::Duration,
};

use aya::maps::{HashMap as BpfHashMap, IterableMap as _, Map, MapData};
use trainbpf_common::{Held, LateWindow};

use super::{
    held::{Pidfd, continue_held},
    mono_ns,
};

/// How long a process may stay held. The holds measured here last 8 to
/// 40 ms (docs/gpu.md): a healthy recorder, even on a loaded machine,
/// never comes near 3 s, while a job whose recorder is stuck loses at most
/// 3 s once per library, far less than a distributed job's collectives
/// wait before they give up.
pub const HOLD_LIMIT: Duration = Duration::from_secs(3);

/// How often the watchdog looks at the holds: how late past the limit one
/// can end.
const SCAN: Duration = Duration::from_millis(100);

/// The subcommand the watchdog runs as.
pub const SUBCOMMAND: &str = "__gpu-hold-watchdog";

const BPF_NOEXIST: u64 = 1;
const BPF_EXIST: u64 = 2;

/// The recorder's side: the watchdog's process and the end of the socket
/// pair whose closing tells it the recorder is gone.
pub(super) struct Watchdog {
    _recorder_end: UnixStream,
    _child: Child,
}

impl Watchdog {
    /// Starts the watchdog on the kernel's `HELD` and `WINDOWS` maps and
    /// waits until it runs.
    pub fn start(
        held: &BpfHashMap<MapData, u32, Held>,
        windows: &BpfHashMap<MapData, u32, LateWindow>,
    ) -> Result<Watchdog, String> {
        let dup = |m: &MapData| {
            m.fd()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| format!("duplicating a map's descriptor: {e}"))
        };
        let (held_fd, windows_fd) = (dup(held.map())?, dup(windows.map())?);
        // Both ends close-on-exec: the job, started later, gets neither.
        let (ours, theirs) =
            UnixStream::pair().map_err(|e| format!("making the socket pair: {e}"))?;
        let fds = [
            theirs.as_raw_fd(),
            held_fd.as_raw_fd(),
            windows_fd.as_raw_fd(),
        ];
        // /proc/self/exe in the child is the recorder's own image, as for
        // the job's trampoline.
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg(SUBCOMMAND)
            .args(fds.iter().map(|f| f.to_string()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, setsid) between
        // fork and exec. The three descriptors stay open across the exec
        // in the child alone.
        unsafe {
            cmd.pre_exec(move || {
                for fd in fds {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting the hold's watchdog: {e}"))?;
        drop((theirs, held_fd, windows_fd));
        let mut ours = ours;
        ours.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let mut b = [0u8; 1];
        match ours.read(&mut b) {
            Ok(1) if b[0] == b'R' => Ok(Watchdog {
                _recorder_end: ours,
                _child: child,
            }),
            Ok(_) => Err("the hold's watchdog ended at start".into()),
            Err(e) => Err(format!("the hold's watchdog did not start: {e}")),
        }
    }
}

/// Runs as `trainbpf __gpu-hold-watchdog SOCKET HELD WINDOWS`; returns the
/// exit code, after printing why when it could not start.
pub fn run(args: &[OsString]) -> i32 {
    let fail = |msg: String| {
        eprintln!("trainbpf: {msg}");
        2
    };
    // Before anything else: whoever runs us through sudo gets nothing but
    // this refusal.
    if let Err(why) = crate::record::job::started_by_recorder() {
        return fail(format!(
            "{SUBCOMMAND} is internal to trainbpf record and does nothing otherwise: {why}"
        ));
    }
    let fds: Vec<i32> = args
        .iter()
        .filter_map(|a| a.to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    let [sock, held, windows] = fds[..] else {
        return fail(format!("{SUBCOMMAND}: bad arguments"));
    };
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGPIPE,
    ] {
        // SAFETY: SIG_IGN for a signal that has no handler of ours.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    // SAFETY: the recorder passed these descriptors, open across exec for
    // us, and nothing else here owns them.
    let (sock, held, windows) = unsafe {
        (
            UnixStream::from_raw_fd(sock),
            OwnedFd::from_raw_fd(held),
            OwnedFd::from_raw_fd(windows),
        )
    };
    let open = |fd: OwnedFd| -> Result<Map, String> {
        let data = MapData::from_fd(fd).map_err(|e| e.to_string())?;
        Map::from_map_data(data).map_err(|e| e.to_string())
    };
    let maps = open(held).and_then(|h| Ok((h, open(windows)?)));
    let (held, windows) = match maps.and_then(|(h, w)| {
        Ok((
            BpfHashMap::<MapData, u32, Held>::try_from(h).map_err(|e| e.to_string())?,
            BpfHashMap::<MapData, u32, LateWindow>::try_from(w).map_err(|e| e.to_string())?,
        ))
    }) {
        Ok(m) => m,
        Err(e) => return fail(format!("{SUBCOMMAND}: the maps: {e}")),
    };
    let mut w = Watch {
        held,
        windows,
        limit_ns: HOLD_LIMIT.as_nanos() as u64,
    };
    let mut sock = sock;
    if sock.write_all(b"R").is_err() {
        return 1;
    }
    loop {
        if recorder_gone(&sock) {
            w.release_all();
            return 0;
        }
        w.time_out(mono_ns());
    }
}

/// Waits up to [`SCAN`] for the recorder's end of the socket to close.
fn recorder_gone(sock: &UnixStream) -> bool {
    let mut p = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, SCAN.as_millis() as i32) };
    if n <= 0 {
        return false;
    }
    // The recorder never writes: readable means closed.
    let mut b = [0u8; 1];
    !matches!((&*sock).read(&mut b), Ok(n) if n > 0)
}

struct Watch {
    held: BpfHashMap<MapData, u32, Held>,
    windows: BpfHashMap<MapData, u32, LateWindow>,
    limit_ns: u64,
}

impl Watch {
    fn holds(&self) -> Vec<(u32, Held)> {
        self.held.iter().filter_map(Result::ok).collect()
    }

    /// Continues each process held past the limit, and opens its window.
    fn time_out(&mut self, now: u64) {
        for (tgid, h) in self.holds() {
            if h.timed_out_ns != 0
                || h.other_stop != 0
                || now.saturating_sub(h.since_ns) < self.limit_ns
            {
                continue;
            }
            // Opened while the entry is there: the entry goes at its
            // process's exit, so the pidfd names that process (and its
            // start time says so again).
            let Ok(pidfd) = Pidfd::open(tgid) else {
                continue;
            };
            let same = |n: &Held| (n.since_ns, n.start_ns) == (h.since_ns, h.start_ns);
            if !self.held.get(&tgid, 0).is_ok_and(|n| same(&n))
                || !pidfd.started_at(tgid, h.start_boottime_ns)
            {
                continue;
            }
            // Marked only if the recorder has not released it meanwhile.
            let marked = Held {
                timed_out_ns: now,
                ..h
            };
            if self.held.insert(tgid, marked, BPF_EXIST).is_err() {
                continue;
            }
            // An agent held for an error file maps no library: no window.
            if h.reason == trainbpf_common::HOLD_LIBRARY {
                let window = LateWindow {
                    start_ns: now,
                    dev: h.dev,
                    ino: h.ino,
                    calls: 0,
                };
                let _ = self.windows.insert(tgid, window, BPF_NOEXIST);
            }
            let _ = pidfd.signal(libc::SIGCONT);
        }
    }

    /// The recorder is gone: every process still held is continued
    /// (unless someone else stopped it too). Its probes' programs are
    /// gone with the recorder, so nothing drops an exited process's hold
    /// any more: the start time alone says whether its pid still names
    /// it.
    fn release_all(&mut self) {
        for (tgid, h) in self.holds() {
            if h.timed_out_ns == 0 && h.other_stop == 0 {
                let _ = continue_held(tgid, &h);
            }
        }
    }
}
