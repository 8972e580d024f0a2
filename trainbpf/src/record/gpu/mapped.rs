//! The kernel's reports of a job process mapping a driver library not
//! probed yet ([`super::late`]): the file is probed through the mapping
//! thread's descriptor, the process continued, and each mapping recorded
//! as held or as an uncovered window. A mapping through a descriptor not
//! open for reading is only said: nothing of its file is read.

use std::path::Path;

use aya::Ebpf;
use trainbpf_common::{
    CudaMapEvent, MAP_HELD, MAP_NOT_HELD_BUSY, MAP_NOT_HELD_FULL, MAP_NOT_HELD_OFF,
    MAP_NOT_HELD_SIGNAL, MAP_NOT_READABLE,
};
use trainbpf_report::{
    decode::gpu::{GpuAttach, GpuLate, GpuUserBody},
    units::human_ms,
};

use crate::record::samplers::procfs::guard::Stall;

use super::{
    GpuProbes, Records,
    late::{ENV_FORCE_WINDOW_MS, forced_window, kernel_dev, user_dev},
    maps::mapped_libcuda,
    mono_ns,
    pinned::Pinned,
    probe::{NotOpened, Tried},
    rec,
};

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
        MAP_NOT_HELD_BUSY => {
            "not held: it was held already (another thread's mapping, or as torchelastic's agent)"
                .into()
        }
        other => format!("not held ({other})"),
    })
}

/// The path of the descriptor mapped, as the kernel names it now (or,
/// where a fault found the mapping, the path the process's maps give
/// it), or `name`, the file's own: shown only.
fn fd_path(ev: &CudaMapEvent, name: String) -> String {
    if ev.fd < 0 {
        let dev = user_dev(ev.dev);
        return mapped_libcuda(ev.hdr.tgid)
            .into_iter()
            .find(|m| (m.dev, m.ino) == (dev, ev.ino))
            .map_or(name, |m| m.name.display().to_string());
    }
    std::fs::read_link(format!("/proc/{}/fd/{}", ev.tid, ev.fd))
        .map(|p| p.display().to_string())
        .unwrap_or(name)
}

/// `O_PATH` and the access mode, from the `flags:` line of
/// `/proc/PID/fdinfo/FD` (octal): why a descriptor is not open for
/// reading, or `None` when it is.
pub(super) fn not_readable(fdinfo: &str) -> Option<&'static str> {
    let flags = fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| i32::from_str_radix(v.trim(), 8).ok())?;
    if flags & libc::O_PATH != 0 {
        Some("opened O_PATH")
    } else if flags & libc::O_ACCMODE == libc::O_WRONLY {
        Some("opened write-only")
    } else {
        None
    }
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

    /// The file a thread maps, held by a descriptor ([`open_mapped`]),
    /// read on a worker: a job can make its `/proc` reads wait. `Err`: the
    /// read did not come back, which says nothing of the file.
    fn mapped_file(
        &self,
        ev: &CudaMapEvent,
        name: &str,
    ) -> Result<Result<(Pinned, String), NotOpened>, Stall> {
        let (ev, name) = (*ev, name.to_string());
        self.read_job(ev.hdr.tgid, "the libcuda it mapped", move || {
            open_mapped(&ev, &name)
        })
    }

    fn mapped(&mut self, ebpf: &mut Ebpf, ev: &CudaMapEvent, out: &mut Records) {
        let tgid = ev.hdr.tgid;
        let dev = user_dev(ev.dev);
        let name =
            String::from_utf8_lossy(ev.name.split(|&b| b == 0).next().unwrap_or(&[])).into_owned();
        if ev.held == MAP_NOT_READABLE {
            // The kernel neither held it nor will again for this file:
            // nothing of it is opened, only said.
            self.late_lost.unreadable += 1;
            let a = GpuAttach {
                path: {
                    let (e, n) = (*ev, name.clone());
                    self.read_job(tgid, "the path of the libcuda it mapped", move || {
                        fd_path(&e, n)
                    })
                    .unwrap_or(name)
                },
                dev,
                ino: ev.ino,
                found_by: "mmap".into(),
                pid: Some(tgid),
                error: Some(format!(
                    "refused: pid {tgid} mapped it through descriptor {}, which is not open for reading (O_PATH or write-only): the mapping fails, and the job's user may not be able to read the file, so the recorder neither reads nor probes it",
                    ev.fd
                )),
                ..GpuAttach::default()
            };
            rec(out, mono_ns(), GpuUserBody::GpuAttach(a));
            return;
        }
        let mut shown = name.clone();
        let probed = match self.tried_as(dev, ev.ino) {
            Tried::Probed => true,
            Tried::NotProbed => false,
            Tried::No if self.at_cap() => {
                // Shown in the first one's message only.
                if !self.over_cap_said {
                    let (e, n) = (*ev, name.clone());
                    shown = self
                        .read_job(tgid, "the path of the libcuda it mapped", move || {
                            fd_path(&e, n)
                        })
                        .unwrap_or(shown);
                }
                self.over_cap(out, dev, ev.ino, &shown, tgid);
                false
            }
            Tried::No => match self.mapped_file(ev, &name) {
                // Not marked tried: the next process to map it is looked
                // at afresh (this one's calls are a window).
                Err(stall) => {
                    let a = GpuAttach {
                        path: shown.clone(),
                        dev,
                        ino: ev.ino,
                        found_by: "mmap".into(),
                        pid: Some(tgid),
                        error: Some(format!("its mapping was not read: {stall}")),
                        ..GpuAttach::default()
                    };
                    rec(out, mono_ns(), GpuUserBody::GpuAttach(a));
                    false
                }
                Ok(Ok((file, path))) => {
                    shown = path;
                    self.attach_library(ebpf, &file, Path::new(&shown), "mmap", Some(tgid))
                        .is_some_and(|a| {
                            let ok = !a.attached.is_empty();
                            rec(out, mono_ns(), GpuUserBody::GpuAttach(a));
                            ok
                        })
                }
                Ok(Err(e)) => {
                    self.not_opened(out, dev, ev.ino, &shown, tgid, e);
                    false
                }
            },
        };
        let attached = mono_ns();
        let mut note = why_not_held(ev.held);
        if ev.held == MAP_HELD
            && let Some(l) = &mut self.late
        {
            let r = l.release(ev);
            if let Some(ns) = r.timed_out_ns {
                self.late_lost.hold_timeouts += 1;
                note = Some(format!(
                    "held {}, the hold's limit: the hold's watchdog continued it before its probes were on",
                    human_ms(ns)
                ));
            } else if probed || !r.lives {
                // Held until probed, or until it died: no call missed.
                if probed {
                    self.late_lost.held += 1;
                    self.late_lost.held_ns += attached.saturating_sub(ev.hdr.ts_ns);
                }
                let h = GpuLate {
                    pid: tgid,
                    tid: ev.tid,
                    path: shown.clone(),
                    mapped_ns: ev.hdr.ts_ns,
                    attached_ns: probed.then_some(attached),
                    held: true,
                    note: r.note,
                    calls: 0,
                };
                rec(out, attached, GpuUserBody::GpuLate(h));
            } else {
                // It runs on with its library unprobed.
                l.open_window(ev);
            }
        }
        if probed {
            let hint = (tgid, ev.tid, shown, note);
            self.close_windows_hinted(out, Some((dev, ev.ino)), Some(hint), attached);
        }
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
            if !l.counts_calls() {
                let not = "its calls into the driver were not counted (a recording that holds attaches no system call tracepoint)";
                w.note = Some(match w.note.take() {
                    Some(n) => format!("{n}; {not}"),
                    None => not.to_string(),
                });
            }
            self.late_lost.windows += 1;
            self.late_lost.window_calls += w.calls;
            self.late_lost.window_ns += w.attached_ns.unwrap_or(now).saturating_sub(w.mapped_ns);
            rec(out, now, GpuUserBody::GpuLate(w));
        }
    }
}

/// The file a thread maps, held by a descriptor: through the
/// thread's own descriptor, or, once that is closed (or where a fault
/// found the mapping), the mapping. Refused when the descriptor is not
/// open for reading. The path is the job's to choose: shown only,
/// escaped when printed.
fn open_mapped(ev: &CudaMapEvent, name: &str) -> Result<(Pinned, String), NotOpened> {
    let (tgid, dev) = (ev.hdr.tgid, user_dev(ev.dev));
    let fdinfo = (ev.fd >= 0)
        .then(|| std::fs::read_to_string(format!("/proc/{}/fdinfo/{}", ev.tid, ev.fd)).ok())
        .flatten();
    let by_fd = match fdinfo.as_deref().and_then(not_readable) {
        _ if ev.fd < 0 => Err(NotOpened {
            why: format!("pid {tgid} maps it, and no mapping of it was found"),
            unreadable: false,
        }),
        Some(how) => Err(NotOpened {
            why: format!("descriptor {} is not open for reading ({how})", ev.fd),
            unreadable: true,
        }),
        None => Pinned::descriptor(ev.tid, ev.fd, dev, ev.ino)
            .map(|f| (f, fd_path(ev, name.to_string())))
            .map_err(|why| NotOpened {
                why,
                unreadable: false,
            }),
    };
    // A mapping of the file proves it was open for reading then.
    by_fd.or_else(|e| {
        let m = mapped_libcuda(tgid)
            .into_iter()
            .find(|m| (m.dev, m.ino) == (dev, ev.ino))
            .ok_or(e)?;
        let f = Pinned::mapped(tgid, m.range, m.dev, m.ino).map_err(|why| NotOpened {
            why,
            unreadable: false,
        })?;
        Ok((f, m.name.display().to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_not_open_for_reading() {
        let info = |flags: &str| format!("pos:\t0\nflags:\t{flags}\nmnt_id:\t25\nino:\t42\n");
        assert_eq!(not_readable(&info("012100000")), Some("opened O_PATH"));
        assert_eq!(not_readable(&info("0100001")), Some("opened write-only"));
        assert_eq!(not_readable(&info("02100000")), None);
        assert_eq!(not_readable(&info("0100002")), None);
        assert_eq!(not_readable("pos:\t0\n"), None);
    }
}
