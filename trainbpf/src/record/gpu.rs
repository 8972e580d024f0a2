//! The recorder's GPU side: which `libcuda.so` files to probe and when,
//! the Xid tracepoint and driver kprobes where the machine has them, and
//! NVML sampling.
//!
//! Uprobes are per inode: one attach to a library file covers every process
//! that maps it, including processes that `dlopen` it later. So at start the
//! probes go on every `libcuda.so*` file that can be found (`ldconfig -p`,
//! the usual directories, `TRAINBPF_LIBCUDA`), once per distinct file
//! (device + inode); then, once a second, the job's processes' maps are
//! scanned for a `libcuda.so*` not yet probed (a container's, a conda
//! environment's). Before any scan, the kernel sees the job's mmap of such a
//! file and holds the process until its probes are on ([`late`]): no call is
//! missed; where it cannot hold it, the window is reported with its calls
//! counted. The scan is the safety net for a mapping whose record was lost.
//!
//! Everything tried and not used is recorded with the reason
//! ([`GpuSource`], [`GpuAttach`]), once.
//!
//! What a job hands the root recorder here is bounded: only a
//! file the job's user may read is read, opened with that user's
//! credentials ([`pinned`]); its symbol tables are read within a fixed
//! size ([`elf`]); a run tries at most [`probe::MAX_LIBRARIES`] files found
//! through the job ([`probe`]); and a hold ends within a time limit, or at
//! once when the recorder dies ([`watchdog`]).
//!
//! Each file is held by a descriptor from the moment it is found, and a
//! job's library is reached through `/proc/PID/map_files`, never through a
//! path the job controls ([`pinned`]): root's breakpoints go on the inode
//! the job maps, not on whatever a link names by the time of the attach.

use std::{collections::HashSet, ffi::OsStr, fs, path::PathBuf};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray},
    programs::ProgramError,
};
use nvml_wrapper::{Nvml, enums::device::UsedGpuMemory};
use trainbpf_common::GpuCounters;
use trainbpf_report::decode::gpu::{
    GpuLost, GpuSource, GpuUserBody, NvmlDevice, NvmlProcess, NvmlSample, encode_user,
};

use self::{
    pinned::Pinned,
    uprobes::{attach_nv_kprobe, attach_xid, load_uprobes},
};

mod elf;
pub(crate) mod held;
mod late;
mod mapped;
mod maps;
mod pinned;
mod probe;
mod uprobes;
mod watchdog;

pub use late::{ENV_FORCE_WINDOW_MS, forced_window as late_window_forced};
pub use watchdog::{SUBCOMMAND as WATCHDOG_SUBCOMMAND, run as watchdog_main};

/// Extra `libcuda.so` paths, `:`-separated: a driver outside the usual
/// places, or a stand-in library in tests.
pub const ENV_LIBCUDA: &str = "TRAINBPF_LIBCUDA";
/// The NVML library to load instead of `libnvidia-ml.so.1`; used only when
/// root alone can change it (see [`crate::util::trust`]).
pub const ENV_LIBNVML: &str = crate::util::trust::ENV_LIBNVML;

/// Directories where drivers put `libcuda.so*` (Debian/Ubuntu, RHEL, the
/// CUDA toolkit's forward-compatibility packages, WSL).
const LIB_DIRS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/wsl/lib",
];

/// Exported symbol → (entry program, return program). `_ptsz` variants (per
/// thread default stream) share their base call's programs.
pub const CUDA_SYMBOLS: [(&str, &str); 23] = [
    ("cuInit", "cu_init"),
    ("cuDevicePrimaryCtxRetain", "cu_primary_ctx_retain"),
    ("cuCtxCreate_v2", "cu_ctx_create_v2"),
    ("cuCtxCreate_v3", "cu_ctx_create_v3"),
    ("cuCtxCreate_v4", "cu_ctx_create_v4"),
    ("cuMemAlloc_v2", "cu_mem_alloc"),
    ("cuMemFree_v2", "cu_mem_free"),
    ("cuMemAllocAsync", "cu_mem_alloc_async"),
    ("cuMemAllocAsync_ptsz", "cu_mem_alloc_async"),
    ("cuMemFreeAsync", "cu_mem_free_async"),
    ("cuMemFreeAsync_ptsz", "cu_mem_free_async"),
    ("cuMemAllocFromPoolAsync", "cu_mem_alloc_from_pool"),
    ("cuMemAllocFromPoolAsync_ptsz", "cu_mem_alloc_from_pool"),
    ("cuMemAllocManaged", "cu_mem_alloc_managed"),
    ("cuMemAllocHost_v2", "cu_mem_alloc_host"),
    ("cuMemHostAlloc", "cu_mem_host_alloc"),
    ("cuMemFreeHost", "cu_mem_free_host"),
    ("cuMemHostRegister_v2", "cu_mem_host_register"),
    ("cuMemHostUnregister", "cu_mem_host_unregister"),
    ("cuMemCreate", "cu_mem_create"),
    ("cuMemRelease", "cu_mem_release"),
    ("cuMemMap", "cu_mem_map"),
    ("cuMemUnmap", "cu_mem_unmap"),
];

/// The driver's host-page allocator, probed where kprobes exist.
const NV_KPROBES: [&str; 2] = ["nv_alloc_pages", "nv_free_pages"];

/// The GPU programs as the loader left them, loaded and not attached.
pub struct Preloaded {
    /// The late probe's fault programs, or why not.
    pub faults: Result<(), String>,
    /// The CUDA uprobes for multi links, or why not.
    pub multi: Result<crate::loader::UprobeMulti, String>,
}

/// The recorder's GPU state while the job runs.
pub struct GpuProbes {
    /// (st_dev, st_ino) of every library file tried, probed or not.
    tried: HashSet<(u64, u64)>,
    /// Those of them with probes on.
    probed: HashSet<(u64, u64)>,
    /// Files tried that were found through the job, against the cap.
    job_files: usize,
    /// Whether a file past the cap was said yet.
    over_cap_said: bool,
    /// Whose credentials open the files parsed: the job's user.
    owner: crate::util::safe_file::Owner,
    /// The uprobe programs loaded (the verifier accepted them).
    loaded: bool,
    /// The same programs loaded for multi links, where the kernel has
    /// them; `Err` says why aya's perf-event uprobes are used instead.
    multi: Result<crate::loader::UprobeMulti, String>,
    counters: Option<PerCpuArray<MapData, GpuCounters>>,
    lost: GpuLost,
    nvml: Option<Nvml>,
    nvml_failed: bool,
    scan_from: usize,
    /// Where the late probe is on the file faults: the job's processes at
    /// the first scan, not scanned yet ([`probe`]'s `scan_maps`).
    to_scan: Option<Vec<u32>>,
    /// The reads of the job's `/proc` (its maps, its mapped files), on
    /// workers with a deadline: this runs on the thread that drains the
    /// rings ([`probe::READ_DEADLINE`]).
    readers: crate::record::samplers::procfs::guard::Readers,
    /// Processes whose read for the maps scan stalled: not read again.
    scan_stalled: crate::record::samplers::procfs::guard::Stalled<u32>,
    attached_files: usize,
    /// The late-library probe; `None` where the uprobes did not load.
    late: Option<late::Late>,
    /// Its windows and holds, for [`GpuLost`].
    late_lost: GpuLost,
    /// The uprobes' and the late probe's links, detached together
    /// ([`detach`](GpuProbes::detach)).
    links: crate::record::links::Links,
    /// `record -v`: a library probed while the job runs is said on stderr
    /// too, not only in the recording.
    verbose: bool,
}

/// Encoded GPU collector records, for the recording.
pub type Records = Vec<(u16, Vec<u8>)>;

/// CLOCK_MONOTONIC, ns: the kernel's clock for the records.
fn mono_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

fn rec(out: &mut Records, now: u64, body: GpuUserBody) {
    out.push(encode_user(now, body));
}

fn source(out: &mut Records, now: u64, source: &str, used: bool, detail: String) {
    rec(
        out,
        now,
        GpuUserBody::GpuSource(GpuSource {
            source: source.into(),
            used,
            detail,
        }),
    );
}

fn why(e: &ProgramError) -> String {
    let mut s = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s.lines().next().unwrap_or("").to_string()
}

impl GpuProbes {
    /// Loads the GPU programs, probes every `libcuda.so*` found, and tries
    /// the Xid tracepoint, the driver kprobes and NVML. `printk` says whether
    /// the kernel-log probe (which forwards `NVRM: Xid` lines) is attached;
    /// `hold`, whether the kernel holds a late mapping (the recorder runs
    /// the job); `windows`, whether an unheld late library's driver calls
    /// are counted (an attached recorder of a tree or cgroup); `loaded`,
    /// what the loader left of the GPU programs; `owner` is the job's user,
    /// whose credentials open what is parsed.
    pub fn start(
        ebpf: &mut Ebpf,
        printk: bool,
        hold: bool,
        windows: bool,
        loaded: Preloaded,
        owner: crate::util::safe_file::Owner,
        now: u64,
    ) -> (GpuProbes, Records) {
        let mut out = Vec::new();
        let mut g = GpuProbes {
            tried: HashSet::new(),
            probed: HashSet::new(),
            job_files: 0,
            over_cap_said: false,
            owner,
            loaded: false,
            multi: loaded.multi,
            counters: ebpf
                .take_map("GPU_COUNTERS")
                .and_then(|m| PerCpuArray::try_from(m).ok()),
            lost: GpuLost::default(),
            nvml: None,
            nvml_failed: false,
            scan_from: 0,
            to_scan: None,
            readers: Default::default(),
            scan_stalled: Default::default(),
            attached_files: 0,
            late: None,
            late_lost: GpuLost::default(),
            links: Default::default(),
            verbose: false,
        };
        // aya's programs are loaded only where the multi ones are not.
        match g
            .multi
            .as_ref()
            .map_or_else(|_| load_uprobes(ebpf), |_| Ok(()))
        {
            Ok(()) => g.loaded = true,
            Err(e) => source(
                &mut out,
                now,
                "libcuda",
                false,
                format!("the CUDA uprobe programs did not load: {e}"),
            ),
        }
        if g.loaded {
            // Before the first attach, so that every file tried is marked
            // in the kernel's map as it is.
            let (l, r) = late::Late::start(ebpf, hold, windows, loaded.faults, &mut g.links);
            match r {
                Ok(detail) => source(&mut out, now, "late-mmap", true, detail),
                Err(e) => source(
                    &mut out,
                    now,
                    "late-mmap",
                    false,
                    format!(
                        "{e}; a library mapped later is found by the maps scan, about a second late"
                    ),
                ),
            }
            g.late = Some(l);
            for (path, found_by) in candidates() {
                // Links followed once, here: the descriptor holds the file.
                let Ok(file) = Pinned::open(&path) else {
                    continue;
                };
                if let Some(a) = g.attach_library(ebpf, &file, &path, found_by, None) {
                    rec(&mut out, now, GpuUserBody::GpuAttach(a));
                }
            }
            let detail = if g.attached_files > 0 {
                format!(
                    "{} libcuda file(s) probed by {}; job processes' maps are scanned for others (once each where the late probe is on the file faults)",
                    g.attached_files,
                    g.links_kind()
                )
            } else {
                format!(
                    "no libcuda.so* found at start ({ENV_LIBCUDA}, ldconfig -p, {}, /usr/local/cuda*/compat); job processes' maps are scanned (once each where the late probe is on the file faults)",
                    LIB_DIRS.join(", ")
                )
            };
            source(&mut out, now, "libcuda", g.attached_files > 0, detail);
        }
        let (used, detail) = attach_xid(ebpf, printk);
        source(&mut out, now, "xid", used, detail);
        for sym in NV_KPROBES {
            let (used, detail) = attach_nv_kprobe(ebpf, sym);
            source(&mut out, now, &format!("kprobe:{sym}"), used, detail);
        }
        source(
            &mut out,
            now,
            "ioctl",
            false,
            "decoding the driver's allocation ioctls on /dev/nvidia* is not implemented".into(),
        );
        let lib = crate::util::trust::nvml_library();
        // Said at start, not only in the recording: whoever set the variable
        // learns at once why their library was not used.
        for r in &lib.refused {
            eprintln!("trainbpf: warning: {r}");
        }
        let refused: String = lib.refused.iter().map(|r| format!("; {r}")).collect();
        match &lib.path {
            None => source(
                &mut out,
                now,
                "nvml",
                false,
                format!(
                    "libnvidia-ml.so.1 could not be loaded: {}; no NVML samples",
                    lib.not_found()
                ),
            ),
            Some(path) => match Nvml::builder().lib_path(path.as_os_str()).init() {
                Ok(n) => {
                    let count = n.device_count().map_or_else(
                        |e| format!("device count failed: {e}"),
                        |c| format!("{c} GPU(s)"),
                    );
                    let driver = n.sys_driver_version().unwrap_or_else(|_| "unknown".into());
                    source(
                        &mut out,
                        now,
                        "nvml",
                        true,
                        format!(
                            "{} (found by {}): {count}, driver {driver}; sampled every second{refused}",
                            path.display(),
                            lib.found_by
                        ),
                    );
                    g.nvml = Some(n);
                }
                Err(e) => source(
                    &mut out,
                    now,
                    "nvml",
                    false,
                    format!(
                        "{} (found by {}) could not be loaded ({e}); no NVML samples{refused}",
                        path.display(),
                        lib.found_by
                    ),
                ),
            },
        }
        (g, out)
    }

    /// One line for record's start-up message.
    pub fn describe(&self) -> String {
        format!(
            "GPU: {} libcuda file(s) probed, NVML {}{}; driver calls probed by {}",
            self.attached_files,
            if self.nvml.is_some() {
                "sampled"
            } else {
                "unavailable"
            },
            match self.late.as_ref().and_then(late::Late::point) {
                Some(p) => format!("; a libcuda mapped later is seen by {p}"),
                None => String::new(),
            },
            self.links_kind(),
        )
    }

    /// How the driver calls are probed, and why, where it is the fallback.
    fn links_kind(&self) -> String {
        match &self.multi {
            Ok(_) => "one uprobe_multi link per program and file".into(),
            Err(e) => format!("one perf-event uprobe per call: {e}"),
        }
    }

    /// Once a second: new libraries in the job's maps, an NVML sample, the
    /// kernel counters.
    pub fn tick(
        &mut self,
        ebpf: &mut Ebpf,
        job: &BpfHashMap<MapData, u32, u32>,
        now: u64,
    ) -> Records {
        let mut out = Vec::new();
        if self.loaded {
            self.scan_maps(ebpf, job, now, &mut out);
        }
        if let Some(n) = &self.nvml {
            match sample(n) {
                Ok(s) => rec(&mut out, now, GpuUserBody::Nvml(s)),
                // Said once: a GPU that fell off the bus fails every sample.
                Err(e) if !self.nvml_failed => {
                    self.nvml_failed = true;
                    source(
                        &mut out,
                        now,
                        "nvml",
                        false,
                        format!("sampling failed: {e}"),
                    );
                }
                Err(_) => {}
            }
        }
        self.poll_counters(&mut out, now);
        out
    }

    /// See [`late::Late::release_agent`]: a note of what came of the hold.
    pub fn release_agent(&mut self, tgid: u32) -> Option<String> {
        self.late.as_mut()?.release_agent(tgid)
    }

    /// Job processes that were not the job's when the probe could see
    /// them map a library: an attached job's at the start, the root the
    /// recorder just started, a process moved into an attached cgroup
    /// later; for `record --all`, the node's processes at the start. The
    /// maps scan reads these, once each (`probe.rs`, `pids_to_scan`):
    /// where the late probe is on the file faults, no other.
    pub fn predating(&mut self, pids: impl Iterator<Item = u32>) {
        let rest = self.to_scan.get_or_insert_with(Vec::new);
        let before = rest.len();
        rest.extend(pids);
        // Scanned from the end: these first, lowest pid first.
        rest[before..].sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Whether a job process can be held, its hold bounded by the
    /// watchdog (the recorder runs the job).
    pub fn holds(&self) -> bool {
        self.late.as_ref().is_some_and(late::Late::holds)
    }

    /// `record -v`: see the field.
    pub fn set_verbose(&mut self, on: bool) {
        self.verbose = on;
    }

    /// Detaches the probes, together (`record::links`).
    pub fn detach(&mut self) {
        self.links.detach_all();
    }

    /// The last counters, when the job has ended; windows still open
    /// never had their probes.
    pub fn finish(&mut self, ebpf: &mut Ebpf, now: u64) -> Records {
        let mut out = self.due(ebpf, u64::MAX);
        if let Some(l) = &mut self.late {
            l.release_all();
        }
        self.close_windows(&mut out, None, 0, now);
        self.poll_counters(&mut out, now);
        out
    }

    fn poll_counters(&mut self, out: &mut Records, now: u64) {
        let mut lost = GpuLost {
            attach_failed: self.lost.attach_failed,
            ..self.late_lost.clone()
        };
        if let Some(c) = &self.counters
            && let Ok(per_cpu) = c.get(&0, 0)
        {
            for v in per_cpu.iter() {
                lost.pending_full += v.pending_full;
                lost.read_failed += v.read_failed;
            }
        }
        if lost != self.lost {
            self.lost = lost.clone();
            rec(out, now, GpuUserBody::GpuLost(lost));
        }
    }
}

/// `TRAINBPF_LIBCUDA` first, then `ldconfig -p`, then the usual directories.
fn candidates() -> Vec<(PathBuf, &'static str)> {
    let mut out = Vec::new();
    if let Some(v) = std::env::var_os(ENV_LIBCUDA) {
        for p in std::env::split_paths(&v) {
            if !p.as_os_str().is_empty() {
                out.push((p, "env"));
            }
        }
    }
    // The trusted ldconfig only: one found through PATH would run as root.
    for (name, path) in crate::util::trust::ld_cache() {
        if name.starts_with("libcuda.so") {
            out.push((path, "ldconfig"));
        }
    }
    let mut dirs: Vec<PathBuf> = LIB_DIRS.iter().map(PathBuf::from).collect();
    if let Ok(rd) = fs::read_dir("/usr/local") {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("cuda") {
                dirs.push(e.path().join("compat"));
            }
        }
    }
    for d in dirs {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        let mut found: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| is_libcuda(p.file_name().unwrap_or_default()))
            .collect();
        found.sort();
        out.extend(found.into_iter().map(|p| (p, "dir")));
    }
    out
}

pub(super) fn is_libcuda(name: &OsStr) -> bool {
    name.to_string_lossy().starts_with("libcuda.so")
}

fn sample(n: &Nvml) -> Result<NvmlSample, nvml_wrapper::error::NvmlError> {
    let mut s = NvmlSample::default();
    for index in 0..n.device_count()? {
        let d = n.device_by_index(index)?;
        let mem = d.memory_info()?;
        let processes = d
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .map(|p| NvmlProcess {
                pid: p.pid,
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect();
        s.devices.push(NvmlDevice {
            index,
            name: d.name().unwrap_or_default(),
            used_bytes: mem.used,
            total_bytes: mem.total,
            processes,
        });
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_symbol_has_programs_named_for_the_object() {
        // The entry programs are the ones in trainbpf-ebpf/src/gpu.rs; each
        // has a `_ret` twin.
        let progs: HashSet<&str> = CUDA_SYMBOLS.iter().map(|(_, p)| *p).collect();
        assert_eq!(progs.len(), 20);
        assert!(CUDA_SYMBOLS.iter().all(|(s, _)| s.starts_with("cu")));
    }

    #[test]
    fn libcuda_names() {
        assert!(is_libcuda(OsStr::new("libcuda.so.1")));
        assert!(is_libcuda(OsStr::new("libcuda.so.550.54.15")));
        assert!(!is_libcuda(OsStr::new("libcudart.so.12")));
    }
}
