//! A driver library a job process maps after recording started: the
//! kernel holds the mapping thread's process (trainbpf-ebpf/src/gpu_late.rs)
//! and says so on the precious ring; here the probes go on that very file,
//! reached through the thread's own descriptor, and the process is
//! continued. Only a process the hold stopped is continued, and not one
//! that someone else stopped meanwhile.
//!
//! Where it could not be held, the window from the mapping to the attach
//! is reported with the calls into the NVIDIA driver the kernel counted in
//! it. [`ENV_FORCE_WINDOW_MS`] forces such a window, for tests.

use std::{path::Path, time::Duration};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData},
    programs::TracePoint,
};
use trainbpf_common::{
    CudaMapEvent, FileKey, Held, LateWindow, MAP_HELD, MAP_NOT_HELD_FULL, MAP_NOT_HELD_OFF,
    MAP_NOT_HELD_SIGNAL,
};

use super::{GpuProbes, Records, maps::mapped_libcuda, pinned::Pinned, rec, why};
use crate::decode::gpu::{GpuAttach, GpuLate, GpuUserBody};

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
}

impl Late {
    /// Takes the maps and attaches the two syscall tracepoints; `Err` says
    /// why a late library would be found only by the maps scan.
    pub fn start(ebpf: &mut Ebpf) -> (Late, Result<String, String>) {
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
        };
        let r = (|| -> Result<(), String> {
            if l.seen.is_none() || l.held.is_none() || l.windows.is_none() {
                return Err("the late-library maps are missing from the object".into());
            }
            for (prog, tp) in [
                ("late_ioctl", "sys_enter_ioctl"),
                ("late_mmap", "sys_enter_mmap"),
            ] {
                let p: &mut TracePoint = ebpf
                    .program_mut(prog)
                    .ok_or_else(|| format!("program {prog} missing from the object"))?
                    .try_into()
                    .map_err(|e| why(&e))?;
                p.load().map_err(|e| format!("{prog}: {}", why(&e)))?;
                p.attach("syscalls", tp)
                    .map_err(|e| format!("syscalls:{tp}: {}", why(&e)))?;
            }
            Ok(())
        })();
        let r = match r {
            Err(e) => {
                l.seen = None;
                Err(e)
            }
            Ok(()) => Ok(match l.forced {
                Some(d) => format!(
                    "syscalls:sys_enter_mmap; test switch {ENV_FORCE_WINDOW_MS}: not held, probed {} ms after the mapping",
                    d.as_millis()
                ),
                None => "syscalls:sys_enter_mmap: a job process that maps an unprobed libcuda.so* is held (SIGSTOP) until its probes are on".into(),
            }),
        };
        (l, r)
    }

    /// How long a test switch puts off this mapping's attach.
    fn delay(&self, ev: &CudaMapEvent) -> Option<Duration> {
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
                1,
                0,
            );
        }
    }

    /// The probes are on (or could not be put on): continues the process
    /// the hold stopped, unless someone else stopped it too. Returns the
    /// note for the record.
    pub fn release(&mut self, ev: &CudaMapEvent) -> Option<String> {
        let tgid = ev.hdr.tgid;
        let h = self.held.as_mut().and_then(|m| {
            let h = m.get(&tgid, 0).ok();
            let _ = m.remove(&tgid);
            h
        });
        let Some(h) = h else {
            return Some("the hold's entry was gone: not continued".into());
        };
        let mut note = None;
        if h.other_cont != 0 {
            note = Some("another process continued it before the probes were on".into());
        }
        if h.other_stop != 0 {
            return Some("another stop signal reached it while held: left stopped".into());
        }
        // Only the job's process the kernel held: its tgid came from the
        // hold's own record, and HELD had it.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(tgid as i32),
            nix::sys::signal::Signal::SIGCONT,
        );
        note
    }

    /// The recording ends: every process still held (its record not
    /// handled) is continued, unless someone else stopped it too.
    pub fn release_all(&mut self) {
        let Some(m) = &mut self.held else { return };
        let held: Vec<(u32, Held)> = m.iter().filter_map(Result::ok).collect();
        for (tgid, h) in held {
            let _ = m.remove(&tgid);
            if h.other_stop == 0 {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(tgid as i32),
                    nix::sys::signal::Signal::SIGCONT,
                );
            }
        }
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

fn mono_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

fn why_not_held(held: u32) -> Option<String> {
    Some(match held {
        MAP_HELD => return None,
        MAP_NOT_HELD_OFF if forced_window().is_some() => {
            format!("not held: the test switch {ENV_FORCE_WINDOW_MS} is set")
        }
        MAP_NOT_HELD_OFF => {
            "not held: an attached recorder (--pid, --cgroup, --all) only watches".into()
        }
        MAP_NOT_HELD_SIGNAL => "not held: the stop signal could not be sent".into(),
        MAP_NOT_HELD_FULL => "not held: too many processes held at once".into(),
        other => format!("not held ({other})"),
    })
}

impl GpuProbes {
    /// The kernel's reports of job processes mapping a driver library not
    /// yet probed: probes the file, continues what was held, and records
    /// each as held or as an uncovered window.
    pub fn on_mapped(&mut self, ebpf: &mut Ebpf, evs: Vec<CudaMapEvent>, now: u64) -> Records {
        let mut out = Vec::new();
        for ev in evs {
            if let Some(d) = self.late.as_ref().and_then(|l| l.delay(&ev))
                && now < ev.hdr.ts_ns.saturating_add(d.as_nanos() as u64)
            {
                if let Some(l) = &mut self.late {
                    l.deferred.push(ev);
                }
                continue;
            }
            self.mapped(ebpf, &ev, &mut out);
        }
        out
    }

    /// The forced windows that have run their length (`now` `u64::MAX`:
    /// all of them).
    pub fn due(&mut self, ebpf: &mut Ebpf, now: u64) -> Records {
        let Some(l) = &mut self.late else {
            return Vec::new();
        };
        let deferred = std::mem::take(&mut l.deferred);
        let (due, wait): (Vec<_>, Vec<_>) = deferred.into_iter().partition(|e| {
            let d = l.delay(e).unwrap_or_default().as_nanos() as u64;
            now >= e.hdr.ts_ns.saturating_add(d)
        });
        l.deferred = wait;
        let mut out = Vec::new();
        for ev in due {
            self.mapped(ebpf, &ev, &mut out);
        }
        out
    }

    fn mapped(&mut self, ebpf: &mut Ebpf, ev: &CudaMapEvent, out: &mut Records) {
        let tgid = ev.hdr.tgid;
        let dev = user_dev(ev.dev);
        let name =
            String::from_utf8_lossy(ev.name.split(|&b| b == 0).next().unwrap_or(&[])).into_owned();
        // The descriptor the thread maps, or, once closed, the mapping. The
        // path is the job's to choose: shown only, escaped when printed.
        let by_fd = Pinned::descriptor(ev.tid, ev.fd, dev, ev.ino).map(|f| {
            let p = std::fs::read_link(format!("/proc/{}/fd/{}", ev.tid, ev.fd));
            (
                f,
                p.map(|p| p.display().to_string()).unwrap_or(name.clone()),
            )
        });
        let file = by_fd.or_else(|e| -> Result<(Pinned, String), String> {
            let m = mapped_libcuda(tgid)
                .into_iter()
                .find(|m| (m.dev, m.ino) == (dev, ev.ino))
                .ok_or(e)?;
            let f = Pinned::mapped(tgid, m.range, m.dev, m.ino)?;
            Ok((f, m.name.display().to_string()))
        });
        let shown = match &file {
            Ok((_, p)) => p.clone(),
            Err(_) => name,
        };
        if !self.tried.contains(&(dev, ev.ino)) {
            match file {
                Ok((file, _)) => {
                    if let Some(a) =
                        self.attach_library(ebpf, &file, Path::new(&shown), "mmap", Some(tgid))
                    {
                        eprintln!(
                            "trainbpf: GPU: probed {} as pid {tgid} mapped it: {} calls{}",
                            crate::term::escape(&a.path),
                            a.attached.len(),
                            a.error
                                .as_deref()
                                .map(|e| format!(" ({})", crate::term::escape(e)))
                                .unwrap_or_default()
                        );
                        rec(out, mono_ns(), GpuUserBody::GpuAttach(a));
                    }
                }
                Err(e) => {
                    // Tried once: it holds no one again.
                    self.tried.insert((dev, ev.ino));
                    if let Some(l) = &mut self.late {
                        l.seen(dev, ev.ino);
                    }
                    self.lost.attach_failed += 1;
                    let a = GpuAttach {
                        path: shown.clone(),
                        dev,
                        ino: ev.ino,
                        found_by: "mmap".into(),
                        pid: Some(tgid),
                        error: Some(format!("could not be opened: {e}")),
                        ..GpuAttach::default()
                    };
                    rec(out, mono_ns(), GpuUserBody::GpuAttach(a));
                }
            }
        }
        let attached = mono_ns();
        if ev.held == MAP_HELD {
            let note = self.late.as_mut().and_then(|l| l.release(ev));
            let ns = attached.saturating_sub(ev.hdr.ts_ns);
            self.late_lost.held += 1;
            self.late_lost.held_ns += ns;
            let l = GpuLate {
                pid: tgid,
                tid: ev.tid,
                path: shown.clone(),
                mapped_ns: ev.hdr.ts_ns,
                attached_ns: Some(attached),
                held: true,
                note,
                calls: 0,
            };
            rec(out, attached, GpuUserBody::GpuLate(l));
        }
        let hint = (tgid, ev.tid, shown, why_not_held(ev.held));
        self.close_windows_hinted(out, Some((dev, ev.ino)), Some(hint), attached);
    }

    /// Closes the uncovered windows on a file now probed (`file`: `stat`'s
    /// dev and inode), or all that are left (`None`: never probed).
    pub(super) fn close_windows(
        &mut self,
        out: &mut Records,
        file: Option<(u64, u64)>,
        pid: u32,
        now: u64,
    ) {
        let note = file.map(|_| format!("probed when the maps scan found it in pid {pid}"));
        let hint = note.map(|n| (0, 0, String::new(), Some(n)));
        self.close_windows_hinted(out, file, hint, now);
    }

    fn close_windows_hinted(
        &mut self,
        out: &mut Records,
        file: Option<(u64, u64)>,
        hint: Option<(u32, u32, String, Option<String>)>,
        now: u64,
    ) {
        let Some(l) = &mut self.late else { return };
        let kfile = file.map(|(dev, ino)| (kernel_dev(dev), ino));
        for mut w in l.close_windows(kfile, now) {
            if let Some((pid, tid, path, note)) = &hint {
                if *pid == w.pid || *pid == 0 {
                    w.tid = *tid;
                    w.note = note.clone();
                }
                w.path = path.clone();
            }
            if file.is_none() {
                w.note = Some(
                    "the probes never went on: every call after the mapping unrecorded".into(),
                );
            }
            self.late_lost.windows += 1;
            self.late_lost.window_calls += w.calls;
            self.late_lost.window_ns += w.attached_ns.unwrap_or(now).saturating_sub(w.mapped_ns);
            rec(out, now, GpuUserBody::GpuLate(w));
        }
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
