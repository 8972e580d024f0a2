//! A driver library a job process maps after recording started: the
//! kernel holds the mapping thread's process (trainbpf-ebpf/src/gpu_late.rs)
//! and says so on the precious ring; the probes go on that very file,
//! reached through the thread's own descriptor ([`super::mapped`]), and the
//! process is continued. Only a process the hold stopped is continued, not
//! one that someone else stopped meanwhile, and only through a pidfd that
//! names the process held ([`super::held`]). The hold's watchdog
//! ([`super::watchdog`]) ends a hold that runs past its limit, and every
//! hold when the recorder dies: no process is held without it.
//!
//! Where it could not be held, the window from the mapping to the attach
//! is reported with the calls into the NVIDIA driver the kernel counted in
//! it. [`ENV_FORCE_WINDOW_MS`] forces such a window, for tests.

use crate::util::phases;
use std::time::Duration;

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData},
    programs::{BtfTracePoint, TracePoint},
};
use trainbpf_common::{
    CudaMapEvent, FileKey, HOLD_AGENT, HOLD_LIBRARY, Held, LateWindow, MAP_HELD, SEEN_TRIED,
};
use trainbpf_report::decode::gpu::GpuLate;

use crate::{loader::LATE_FAULTS, record::links::Links};

use super::{
    held::{Pidfd, continue_held},
    watchdog::{HOLD_LIMIT, Watchdog},
    why,
};

const BPF_NOEXIST: u64 = 1;

/// Looks at a hold whose SIGSTOP is being sent, 50 µs apart, before a
/// SIGCONT: the program sends it a few instructions after making the
/// entry.
const SENDING_TRIES: u32 = 20;

/// Test only: don't hold a process that maps a driver library late, and
/// attach this many milliseconds after its mapping, so that a test can see
/// an uncovered window reported. Never set it for a real recording.
pub const ENV_FORCE_WINDOW_MS: &str = "TRAINBPF_TEST_FORCE_GPU_WINDOW_MS";

/// Test only: keep a held process stopped this many milliseconds before
/// probing and continuing it, so that a test can stop it meanwhile and see
/// that the recorder leaves it stopped. Never set it for a real recording.
pub const ENV_HOLD_MS: &str = "TRAINBPF_TEST_GPU_HOLD_MS";

fn env_ms(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
}

/// The forced window's length, when the test switch is set.
pub fn forced_window() -> Option<Duration> {
    env_ms(ENV_FORCE_WINDOW_MS)
}

/// The kernel's dev_t (`major << 20 | minor`) as `stat` gives it.
pub(super) fn user_dev(kdev: u64) -> u64 {
    libc::makedev((kdev >> 20) as u32, (kdev & 0xf_ffff) as u32)
}

/// `stat`'s dev as the kernel encodes it.
pub(super) fn kernel_dev(dev: u64) -> u64 {
    (u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev))
}

/// The kernel maps of the late-library probe, and what waits on them.
pub(super) struct Late {
    seen: Option<BpfHashMap<MapData, FileKey, u32>>,
    held: Option<BpfHashMap<MapData, u32, Held>>,
    windows: Option<BpfHashMap<MapData, u32, LateWindow>>,
    pub forced: Option<Duration>,
    /// [`ENV_HOLD_MS`].
    pub hold: Option<Duration>,
    /// Mappings whose forced window or hold has not run its length yet.
    pub deferred: Vec<CudaMapEvent>,
    /// Ends holds that run too long, or outlive the recorder; dropped (and
    /// so told to end) with the recorder's GPU state.
    watchdog: Option<Watchdog>,
    /// Whether the `ioctl` tracepoint counts a window's driver calls.
    counts_calls: bool,
    /// What the probe is attached to, once it is.
    point: Option<String>,
    /// Whether it is on the file fault tracepoints, which see every process
    /// that touches an unprobed library's pages, a fork of a process that
    /// mapped it before included (a fork copies no file page tables).
    on_faults: bool,
}

/// `tp_btf:mm_filemap_fault,mm_filemap_map_pages`'s list.
fn faults_named() -> String {
    LATE_FAULTS.map(|(_, tp)| tp).join(",")
}

/// Attaches the fault programs the loader loaded.
fn attach_faults(ebpf: &mut Ebpf, links: &mut Links) -> Result<(), String> {
    for (prog, tp) in LATE_FAULTS {
        let p: &mut BtfTracePoint = ebpf
            .program_mut(prog)
            .ok_or_else(|| format!("program {prog} missing from the object"))?
            .try_into()
            .map_err(|e| why(&e))?;
        let id = phases::attach(|| p.attach()).map_err(|e| format!("tp_btf:{tp}: {}", why(&e)))?;
        links.keep(p.take_link(id).map_err(|e| why(&e))?);
    }
    Ok(())
}

/// Loads and attaches a system call tracepoint's program.
fn attach_syscall(ebpf: &mut Ebpf, links: &mut Links, prog: &str, tp: &str) -> Result<(), String> {
    let p: &mut TracePoint = ebpf
        .program_mut(prog)
        .ok_or_else(|| format!("program {prog} missing from the object"))?
        .try_into()
        .map_err(|e| why(&e))?;
    phases::verify(|| p.load()).map_err(|e| format!("{prog}: {}", why(&e)))?;
    let id = phases::attach(|| p.attach("syscalls", tp))
        .map_err(|e| format!("syscalls:{tp}: {}", why(&e)))?;
    links.keep(p.take_link(id).map_err(|e| why(&e))?);
    Ok(())
}

/// What came of continuing a held process.
pub(super) struct Release {
    /// Said in its record.
    pub note: Option<String>,
    /// The hold's watchdog had ended it, this long after it began: its
    /// calls since are a window.
    pub timed_out_ns: Option<u64>,
    /// It still lives, continued or left stopped by someone else.
    pub lives: bool,
}

/// `tgid`'s hold once its SIGSTOP is sent: a hold's own SIGSTOP is sent
/// within the program that made the entry, which clears `sending` then,
/// and a SIGCONT must come after it. Waited for 50 µs at a time, up to
/// [`SENDING_TRIES`] times, then as it is; `None`: no hold.
fn sent(m: &BpfHashMap<MapData, u32, Held>, tgid: u32) -> Option<Held> {
    let mut tries = 0;
    loop {
        let h = m.get(&tgid, 0).ok()?;
        if h.sending == 0 || tries >= SENDING_TRIES {
            return Some(h);
        }
        tries += 1;
        std::thread::sleep(Duration::from_micros(50));
    }
}

impl Late {
    /// Takes the maps, starts the hold's watchdog where the kernel holds
    /// (`hold`: the recorder runs the job), and attaches the probe (its
    /// links to `links`): the fault programs where they loaded (`faults`),
    /// else the `mmap` system call's tracepoint. `count_windows`: a recording
    /// whose late libraries all leave windows (an attached recorder of a
    /// process tree or cgroup), whose driver calls are worth counting
    /// through the `ioctl` system call's tracepoint. `Err` says why a late
    /// library would be found only by the maps scan.
    pub fn start(
        ebpf: &mut Ebpf,
        hold: bool,
        count_windows: bool,
        faults: Result<(), String>,
        links: &mut Links,
    ) -> (Late, Result<String, String>) {
        let mut l = Late {
            seen: ebpf
                .take_map("LIBCUDA_SEEN")
                .and_then(|m| BpfHashMap::try_from(m).ok()),
            held: ebpf
                .take_map("HELD")
                .and_then(|m| BpfHashMap::try_from(m).ok()),
            windows: ebpf
                .take_map("WINDOWS")
                .and_then(|m| BpfHashMap::try_from(m).ok()),
            forced: forced_window(),
            hold: env_ms(ENV_HOLD_MS),
            deferred: Vec::new(),
            watchdog: None,
            counts_calls: false,
            point: None,
            on_faults: false,
        };
        let r = (|| -> Result<String, String> {
            let (Some(held), Some(windows), Some(_)) = (&l.held, &l.windows, &l.seen) else {
                return Err("the late-library maps are missing from the object".into());
            };
            // Before the programs: no process is held with no one to end
            // the hold.
            if hold && l.forced.is_none() {
                l.watchdog = Some(Watchdog::start(held, windows)?);
            }
            // Windows are the rule where no one is held: their driver calls
            // are counted, at the price of a system call tracepoint.
            let count = count_windows || l.forced.is_some();
            let (point, why_not) = match faults.and_then(|()| attach_faults(ebpf, links)) {
                Ok(()) => {
                    l.on_faults = true;
                    (format!("tp_btf:{}", faults_named()), None)
                }
                Err(e) => {
                    attach_syscall(ebpf, links, "late_mmap", "sys_enter_mmap")?;
                    ("syscalls:sys_enter_mmap".to_string(), Some(e))
                }
            };
            if count || why_not.is_some() {
                attach_syscall(ebpf, links, "late_ioctl", "sys_enter_ioctl")?;
                l.counts_calls = true;
            }
            let mut detail = point;
            if let Some(e) = why_not {
                detail += &format!(
                    " (the file fault tracepoints: {e}; every system call on the machine takes the slow path while recording)"
                );
            }
            if l.counts_calls {
                detail += ", syscalls:sys_enter_ioctl (a window's driver calls)";
            }
            l.point = Some(detail.clone());
            Ok(detail)
        })();
        let r = match r {
            Err(e) => {
                l.seen = None;
                Err(e)
            }
            Ok(point) => Ok(match l.forced {
                Some(d) => format!(
                    "{point}; test switch {ENV_FORCE_WINDOW_MS}: not held, probed {} ms after the mapping",
                    d.as_millis()
                ),
                None if l.watchdog.is_some() => format!(
                    "{point}: a job process that maps an unprobed libcuda.so* is held (SIGSTOP) until its probes are on, {} s at most (the hold's watchdog ends it then, and every hold if the recorder dies)",
                    HOLD_LIMIT.as_secs()
                ),
                None => format!(
                    "{point}: an attached recorder holds no one; a late libcuda.so*'s calls before its probes are a window"
                ),
            }),
        };
        (l, r)
    }

    /// Whether the probe is on the file fault tracepoints: a process that
    /// touches an unprobed library's pages after it was attached is caught
    /// there, so the maps scan is needed only for the processes that
    /// predate it, once each.
    pub fn on_faults(&self) -> bool {
        self.on_faults && self.point.is_some()
    }

    /// What the probe is attached to, and why not the fault tracepoints
    /// where it fell back.
    pub fn point(&self) -> Option<&str> {
        self.point.as_deref()
    }

    /// Whether a window's driver calls are counted (`sys_enter_ioctl`).
    pub fn counts_calls(&self) -> bool {
        self.counts_calls
    }

    /// Whether a hold has its watchdog: only then is anyone held.
    pub fn holds(&self) -> bool {
        self.watchdog.is_some()
    }

    /// How long a test switch puts off this mapping's attach.
    pub fn delay(&self, ev: &CudaMapEvent) -> Option<Duration> {
        if ev.held == MAP_HELD {
            self.hold
        } else {
            self.forced
        }
    }

    /// A file tried (probed or not): its mappings hold no one from now on.
    pub fn seen(&mut self, dev: u64, ino: u64) {
        if let Some(m) = &mut self.seen {
            let _ = m.insert(
                FileKey {
                    dev: kernel_dev(dev),
                    ino,
                },
                SEEN_TRIED,
                0,
            );
        }
    }

    /// The probes are on (or will not go on): continues the process the
    /// hold stopped, unless someone else stopped it too, its hold ended
    /// otherwise, or it is gone.
    pub fn release(&mut self, ev: &CudaMapEvent) -> Release {
        let tgid = ev.hdr.tgid;
        let said = |note: &str, lives| Release {
            note: Some(note.into()),
            timed_out_ns: None,
            lives,
        };
        let Some(m) = self.held.as_mut() else {
            return said("the hold's map is gone: not continued", true);
        };
        // Opened before the entry is looked at: the kernel drops the entry
        // when its process exits, so while the entry is there the pidfd
        // names the process held, whatever the pid names later.
        let pidfd = Pidfd::open(tgid);
        let h = match m.get(&tgid, 0) {
            Ok(h) if h.start_ns == ev.hdr.start_ns && h.reason == HOLD_LIBRARY => h,
            // Another job process took the pid and is held in turn: its
            // own record continues it.
            Ok(_) | Err(_) => {
                return said(
                    "it exited while held (its hold ended with it): nothing to continue",
                    false,
                );
            }
        };
        let _ = m.remove(&tgid);
        if h.timed_out_ns != 0 {
            return Release {
                note: None,
                timed_out_ns: Some(h.timed_out_ns.saturating_sub(h.since_ns)),
                lives: true,
            };
        }
        if h.other_stop != 0 {
            return said(
                "another stop signal reached it while held: left stopped",
                true,
            );
        }
        let note = (h.other_cont != 0)
            .then(|| "another process continued it before the probes were on".to_string());
        let continued = pidfd.and_then(|p| p.signal(libc::SIGCONT));
        match continued {
            Ok(()) => Release {
                note,
                timed_out_ns: None,
                lives: true,
            },
            Err(_) => said("it exited before it could be continued", false),
        }
    }

    /// torchelastic's agent `tgid`, marked at its worker's kill, may be
    /// held at its wait (`HOLD_AGENT`): the file it waited for is in, so
    /// it is continued, unless someone else stopped it too. What came of
    /// it, where it was held.
    pub fn release_agent(&mut self, tgid: u32) -> Option<String> {
        let m = self.held.as_mut()?;
        // Opened first, as in `release`: while the entry is there the
        // pidfd names the process held.
        let pidfd = Pidfd::open(tgid);
        let h = match sent(m, tgid) {
            Some(h) if h.reason == HOLD_AGENT && h.sending == 0 => h,
            // Still sending: its watchdog ends it. Not held, or held at a
            // library's mapping: not ours to end.
            _ => return None,
        };
        let _ = m.remove(&tgid);
        let held_ms = super::mono_ns().saturating_sub(h.since_ns) as f64 / 1e6;
        let what = if h.timed_out_ns != 0 {
            "its hold's watchdog had continued it".to_string()
        } else if h.other_stop != 0 {
            "another stop signal reached it while held: left stopped".to_string()
        } else {
            match pidfd.and_then(|p| p.signal(libc::SIGCONT)) {
                Ok(()) => "continued".to_string(),
                Err(_) => "it exited before it could be continued".to_string(),
            }
        };
        Some(format!(
            "pid {tgid}: held at its wait {held_ms:.1} ms, until its worker's error file was written; {what}"
        ))
    }

    /// The recording ends: every process still held (its record not
    /// handled) is continued, unless someone else stopped it too.
    pub fn release_all(&mut self) {
        let Some(m) = &mut self.held else { return };
        let held: Vec<(u32, Held)> = m.iter().filter_map(Result::ok).collect();
        for (tgid, h) in held {
            // A stop still being sent lands after a SIGCONT sent now, and
            // its entry, removed here, would be the watchdog's no more.
            let h = sent(m, tgid).unwrap_or(h);
            let _ = m.remove(&tgid);
            if h.other_stop == 0 && h.timed_out_ns == 0 {
                let _ = continue_held(tgid, &h);
            }
        }
    }

    /// A held process whose library will not be probed runs on unprobed:
    /// its calls from the mapping on are a window.
    pub fn open_window(&mut self, ev: &CudaMapEvent) {
        if let Some(m) = &mut self.windows {
            let w = LateWindow {
                start_ns: ev.hdr.ts_ns,
                dev: ev.dev,
                ino: ev.ino,
                calls: 0,
            };
            let _ = m.insert(ev.hdr.tgid, w, BPF_NOEXIST);
        }
    }

    /// The processes with an uncovered window open: the kernel opens one
    /// for a process whose mapping's record it could not send, and adds
    /// nothing more for that process and file; a maps scan finds them.
    /// `tried`: whether a file (`stat`'s device, inode) was tried; its
    /// windows are left out.
    pub fn window_pids(&self, tried: impl Fn((u64, u64)) -> bool) -> Vec<u32> {
        self.windows
            .as_ref()
            .map(|m| {
                m.iter()
                    .filter_map(Result::ok)
                    .filter(|(_, w)| !tried((user_dev(w.dev), w.ino)))
                    .map(|(pid, _)| pid)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Closes the uncovered windows on file (`dev`, `ino`) (kernel dev_t),
    /// or every one left when `file` is `None` (the recording ends).
    pub fn close_windows(&mut self, file: Option<(u64, u64)>, now: u64) -> Vec<GpuLate> {
        let Some(m) = &mut self.windows else {
            return Vec::new();
        };
        let open: Vec<(u32, LateWindow)> = m
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, w)| file.is_none_or(|f| f == (w.dev, w.ino)))
            .collect();
        let mut out = Vec::new();
        for (pid, w) in open {
            let _ = m.remove(&pid);
            out.push(GpuLate {
                pid,
                tid: 0,
                path: String::new(),
                mapped_ns: w.start_ns,
                attached_ns: file.map(|_| now),
                held: false,
                note: None,
                calls: w.calls,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_convert_both_ways() {
        // 259:3 (an NVMe partition), 8:1, and a minor above 255.
        for (maj, min) in [(259u32, 3u32), (8, 1), (0, 300)] {
            let st = libc::makedev(maj, min);
            let k = kernel_dev(st);
            assert_eq!(k, (u64::from(maj) << 20) | u64::from(min));
            assert_eq!(user_dev(k), st);
        }
    }
}
