//! Probing one library file, and how many a run probes.
//!
//!
//! Each file a job's process maps costs the recorder a read of its symbol
//! tables (bounded per file, [`super::elf`]) and two perf events per call
//! probed, for the rest of the run. A job decides how many files it maps,
//! so the files found through it (at a mapping or by the maps scan) are
//! capped at [`MAX_LIBRARIES`]; one past the cap is not read, and each
//! such mapping is counted (`gpu.lost.over_cap`), the first also said.

use std::{path::Path, time::Duration};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData},
};
use trainbpf_report::decode::gpu::{GpuAttach, GpuUserBody};

use crate::record::samplers::procfs::guard::{STATS, Stall};

use super::{
    CUDA_SYMBOLS, GpuProbes, Records,
    pinned::Pinned,
    rec,
    uprobes::{attach_multi, attach_pair},
};

/// Library files found through the job that one run tries, at most. A job
/// maps one driver (two with a forward-compatibility copy, a few across
/// container layers or environments); 16 leaves room for those. Each
/// probed file holds up to 46 perf-event descriptors for the run: 16 of
/// them stay within the usual limit of 1,024 open files, beside the
/// recorder's own.
pub(super) const MAX_LIBRARIES: usize = 16;

/// Job processes whose maps are read per scan: bounds the work on a job
/// with thousands of processes (the rest wait for the next scan).
const MAX_SCAN: usize = 512;

/// How long a read of the job's `/proc` for the GPU probes (a process's
/// maps, a mapped file's descriptor) may take. They run on the thread that
/// drains the rings, and a job can make such a read wait as long as it
/// likes (a thread of its own holding its memory map's lock, behind a
/// filesystem that does not answer: `procfs::guard`). A read takes
/// milliseconds: past this it is abandoned on its worker, counted and said
/// in the recording (`job_reads`), and for the maps scan its process is
/// not read again. Each process stalls the rings' thread once at most, and
/// past `guard::MAX_STUCK` stuck reads none at all.
pub(super) const READ_DEADLINE: Duration = Duration::from_millis(500);

/// Why a mapped file could not be opened: said, and counted as unreadable
/// when its descriptor was not open for reading.
pub(super) struct NotOpened {
    pub why: String,
    pub unreadable: bool,
}

/// What became of a file (by `stat`'s device and inode) this run.
pub(super) enum Tried {
    No,
    Probed,
    NotProbed,
}

impl GpuProbes {
    pub(super) fn tried_as(&self, dev: u64, ino: u64) -> Tried {
        if self.probed.contains(&(dev, ino)) {
            Tried::Probed
        } else if self.tried.contains(&(dev, ino)) {
            Tried::NotProbed
        } else {
            Tried::No
        }
    }

    /// Whether the run has tried as many of the job's files as it probes.
    pub(super) fn at_cap(&self) -> bool {
        self.job_files >= MAX_LIBRARIES
    }

    /// A mapping of a file past the cap: not read; counted, and the first
    /// said. Its mappings hold no one from now on.
    pub(super) fn over_cap(&mut self, out: &mut Records, dev: u64, ino: u64, name: &str, pid: u32) {
        self.late_lost.over_cap += 1;
        if let Some(l) = &mut self.late {
            l.seen(dev, ino);
        }
        if self.over_cap_said {
            return;
        }
        self.over_cap_said = true;
        let a = GpuAttach {
            path: name.into(),
            dev,
            ino,
            found_by: "mmap".into(),
            pid: Some(pid),
            error: Some(format!(
                "not probed: {MAX_LIBRARIES} driver libraries found through the job were already tried in this run, the most one recording reads; this and every later one are counted in gpu.lost.over_cap"
            )),
            ..GpuAttach::default()
        };
        rec(out, super::mono_ns(), GpuUserBody::GpuAttach(a));
    }

    /// A file the mapping thread's descriptor and the process's maps could
    /// not give: tried once, it holds no one again.
    pub(super) fn not_opened(
        &mut self,
        out: &mut Records,
        dev: u64,
        ino: u64,
        shown: &str,
        pid: u32,
        e: NotOpened,
    ) {
        self.tried.insert((dev, ino));
        self.job_files += 1;
        if let Some(l) = &mut self.late {
            l.seen(dev, ino);
        }
        self.lost.attach_failed += 1;
        if e.unreadable {
            self.late_lost.unreadable += 1;
        }
        let why = e.why;
        let a = GpuAttach {
            path: shown.into(),
            dev,
            ino,
            found_by: "mmap".into(),
            pid: Some(pid),
            error: Some(format!("could not be opened: {why}")),
            ..GpuAttach::default()
        };
        rec(out, super::mono_ns(), GpuUserBody::GpuAttach(a));
    }

    /// Probes one library file, held by `file`, unless that file (by
    /// device and inode) was tried before. `None` when it was. `path` is
    /// only shown; `pid`, the job process it was found through.
    pub(super) fn attach_library(
        &mut self,
        ebpf: &mut Ebpf,
        file: &Pinned,
        path: &Path,
        found_by: &str,
        pid: Option<u32>,
    ) -> Option<GpuAttach> {
        if !self.tried.insert((file.dev, file.ino)) {
            return None;
        }
        if pid.is_some() {
            self.job_files += 1;
        }
        if let Some(l) = &mut self.late {
            l.seen(file.dev, file.ino);
        }
        let mut a = GpuAttach {
            path: path.display().to_string(),
            dev: file.dev,
            ino: file.ino,
            found_by: found_by.into(),
            pid,
            ..GpuAttach::default()
        };
        let names: Vec<&str> = CUDA_SYMBOLS.iter().map(|(s, _)| *s).collect();
        let mut errors = Vec::new();
        match file.offsets(self.owner, &names) {
            Err(e) => {
                match e {
                    super::pinned::ReadError::Unreadable { .. } => self.late_lost.unreadable += 1,
                    super::pinned::ReadError::TooBig(_) => self.late_lost.tables_too_big += 1,
                    super::pinned::ReadError::Other(_) => {}
                }
                errors.push(e.to_string());
            }
            Ok(offsets) => {
                let target = file.proc_path();
                let found: Vec<_> = CUDA_SYMBOLS
                    .into_iter()
                    .zip(offsets)
                    .filter_map(|((symbol, prog), offset)| match offset {
                        Some(o) => Some((symbol, prog, o)),
                        None => {
                            a.missing.push(symbol.into());
                            None
                        }
                    })
                    .collect();
                if let Ok(m) = &self.multi {
                    attach_multi(
                        m,
                        &found,
                        &target,
                        &mut a.attached,
                        &mut errors,
                        &mut self.links,
                    );
                } else {
                    for (symbol, prog, offset) in found {
                        match attach_pair(ebpf, prog, offset, &target, &mut self.links) {
                            Ok(()) => a.attached.push(symbol.into()),
                            Err(e) => errors.push(format!("{symbol}: {e}")),
                        }
                    }
                }
            }
        }
        if a.attached.is_empty() {
            a.error = Some(if errors.is_empty() {
                "exports none of the CUDA driver calls".into()
            } else {
                errors.join("; ")
            });
            self.lost.attach_failed += 1;
        } else {
            self.attached_files += 1;
            self.probed.insert((file.dev, file.ino));
            if !errors.is_empty() {
                a.error = Some(errors.join("; "));
            }
        }
        if pid.is_some() && self.verbose {
            // The path is the job's to choose, escapes and all.
            eprintln!(
                "trainbpf: GPU: {} (pid {} maps it): {} calls probed{}",
                trainbpf_report::term::escape(&a.path),
                pid.unwrap_or(0),
                a.attached.len(),
                a.error
                    .as_deref()
                    .map(|e| format!(" ({})", trainbpf_report::term::escape(e)))
                    .unwrap_or_default()
            );
        }
        Some(a)
    }

    /// Once a second: libraries in the job's maps not tried yet, found in
    /// processes that predate the late probe, or whose mapping's record was
    /// lost ([`Self::pids_to_scan`]). Stops at the cap: nothing more would
    /// be probed.
    pub(super) fn scan_maps(
        &mut self,
        ebpf: &mut Ebpf,
        job: &BpfHashMap<MapData, u32, u32>,
        now: u64,
        out: &mut Records,
    ) {
        for pid in self.pids_to_scan(job) {
            if self.scan_stalled.contains(&pid) {
                continue;
            }
            let maps = self.read_job(pid, "its maps, for the GPU maps scan", move || {
                super::maps::mapped_libcuda(pid)
            });
            let Some(maps) = self.stalled_if_not(pid, maps) else {
                continue;
            };
            for m in maps {
                if self.at_cap() {
                    return;
                }
                if self.tried.contains(&(m.dev, m.ino)) {
                    continue;
                }
                // The file mapped, not what its path names now; one that
                // cannot be pinned is tried again next scan.
                let (range, dev, ino) = (m.range, m.dev, m.ino);
                let pinned =
                    self.read_job(pid, "a mapped libcuda, for the GPU maps scan", move || {
                        Pinned::mapped(pid, range, dev, ino)
                    });
                let Some(pinned) = self.stalled_if_not(pid, pinned) else {
                    break;
                };
                let Ok(file) = pinned else {
                    if let Some(rest) = &mut self.to_scan {
                        if !rest.contains(&pid) {
                            rest.push(pid);
                        }
                        break;
                    }
                    continue;
                };
                if let Some(a) = self.attach_library(ebpf, &file, &m.name, "maps", Some(pid)) {
                    if !a.attached.is_empty() {
                        self.close_windows(out, Some((m.dev, m.ino)), pid, now);
                    }
                    rec(out, now, GpuUserBody::GpuAttach(a));
                }
            }
        }
    }

    /// The job processes whose maps this scan reads. Where the late probe
    /// is on the file faults, it catches every process that touches an
    /// unprobed library from then on, so only the processes already there
    /// need a look, once each: those the collector named as the job's when
    /// the probes were on (`GpuProbes::predating`; else the job's at the
    /// first scan), a scan's worth at a time. A `record --all` node that forks a thousand
    /// processes a second read 512 of their maps every second, for
    /// nothing. Elsewhere (the `mmap` tracepoint misses what a fork
    /// inherits), every job process in turn, every scan, and the
    /// processes from before the probes once each.
    fn pids_to_scan(&mut self, job: &BpfHashMap<MapData, u32, u32>) -> Vec<u32> {
        let once = self.late.as_ref().is_some_and(|l| l.on_faults());
        if once {
            let rest = self.to_scan.get_or_insert_with(|| {
                let mut pids: Vec<u32> = job.keys().filter_map(Result::ok).collect();
                // Scanned from the end: lowest pids first, as elsewhere.
                pids.sort_unstable_by(|a, b| b.cmp(a));
                pids
            });
            let keep = rest.len().saturating_sub(MAX_SCAN);
            let mut pids = rest.split_off(keep);
            // And, every scan, the processes whose mapping's record was
            // lost: their windows are the sign, and nothing else sees them.
            // A window on a file tried already closes at its attach, or
            // stays for the run where it could not be probed: no read
            // would change that.
            if let Some(l) = &self.late {
                let tried = &self.tried;
                pids.extend(l.window_pids(|file| tried.contains(&file)));
            }
            pids.sort_unstable();
            pids.dedup();
            return pids;
        }
        let mut pids: Vec<u32> = job.keys().filter_map(Result::ok).collect();
        pids.sort_unstable();
        // Round-robin when there are more than a scan's worth.
        let n = pids.len();
        let start = if n > MAX_SCAN { self.scan_from % n } else { 0 };
        self.scan_from = start + MAX_SCAN;
        let mut scan: Vec<u32> = (0..n.min(MAX_SCAN))
            .map(|i| pids[(start + i) % n])
            .collect();
        // And a scan's worth of the processes from before the probes that
        // the job map does not hold (`record --all`'s node), once each.
        if let Some(rest) = &mut self.to_scan {
            let keep = rest.len().saturating_sub(MAX_SCAN);
            scan.extend(rest.split_off(keep));
            scan.sort_unstable();
            scan.dedup();
        }
        scan
    }

    /// Runs a read of the job's `/proc` for process `pid` on a worker,
    /// waiting [`READ_DEADLINE`] at most; a read that did not come back is
    /// said in the recording, as `what`.
    pub(super) fn read_job<T: Send + 'static>(
        &self,
        pid: u32,
        what: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Stall> {
        self.readers.run(READ_DEADLINE, f).inspect_err(|e| {
            STATS.note(|| format!("pid {pid}: {what}: {e}"));
        })
    }

    /// The read's value; where it timed out, its process is not read by
    /// the scan again.
    fn stalled_if_not<T>(&mut self, pid: u32, r: Result<T, Stall>) -> Option<T> {
        self.scan_stalled.note(pid, r).ok()
    }
}
