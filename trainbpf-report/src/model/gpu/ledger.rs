//! The ledger's stream: every event of the recording in, the GPU events
//! through a short reorder buffer, and the report out at the end.

use crate::decode::MemSample;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use crate::decode::gpu::{CudaCall, GpuAttach, GpuEvent, GpuLate, GpuLost, GpuSource, NvmlSample};
use crate::decode::{Event, ProcKey, Rss, Timed};

use super::state::{KINDS, ProcState, idx, thin};
use super::timeline::{at_kill, timeline};
use super::xid::{parse_xid_line, xid_from_tracepoint};
use super::{
    CudaOom, GpuProcess, GpuReport, GpuSeries, Holder, MAX_LIST, MAX_RSS, MemKind, NvmlCompare,
    NvmlDeviceSummary, REORDER_NS, XID_MERGE_NS, Xid,
};

/// An event waiting in the reorder buffer.
#[derive(Debug)]
enum Item {
    Cuda(CudaCall),
    Exit(ProcKey),
    Rss(ProcKey, u64),
    Nvml(NvmlSample),
    Xid(Xid),
    NvPages(ProcKey, bool, u32),
}

/// The ledger; see the module docs. The model feeds it every event
/// ([`Ledger::observe`]) and takes its report at the end
/// ([`Ledger::finish`]).
#[derive(Debug, Default)]
pub struct Ledger {
    now: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    items: HashMap<u64, Item>,
    pub(super) procs: HashMap<ProcKey, ProcState>,
    /// Job processes by pid, newest start: NVML and Xid name pids only.
    pub(super) job_pids: HashMap<u32, ProcKey>,
    /// Pids the OOM killer chose.
    oom_victims: HashSet<u32>,
    pub(super) parents: HashMap<ProcKey, ProcKey>,
    pub(super) root_pid: Option<u32>,
    rss: HashMap<ProcKey, Vec<(u64, u64)>>,
    pub(super) ooms: Vec<CudaOom>,
    pub(super) xid: Vec<Xid>,
    attach: Vec<GpuAttach>,
    late: Vec<GpuLate>,
    sources: Vec<GpuSource>,
    lost: GpuLost,
    nvml_samples: u64,
    nvml_devices: Vec<NvmlDeviceSummary>,
    /// Last NVML sample: (used, total) summed over GPUs.
    pub(super) nvml_last: Option<(u64, u64)>,
}

impl Ledger {
    /// Sees every event of the recording; keeps what the GPU side needs.
    pub fn observe(&mut self, t: &Timed) {
        let ts = t.ts_ns;
        self.now = self.now.max(ts);
        let item = match &t.event {
            Event::Gpu(g) => match &**g {
                GpuEvent::Cuda(c) => Some(Item::Cuda(c.clone())),
                GpuEvent::Xid(x) => Some(Item::Xid(xid_from_tracepoint(ts, x))),
                GpuEvent::NvPages { proc, alloc, pages } => {
                    Some(Item::NvPages(*proc, *alloc, *pages))
                }
                GpuEvent::Nvml(n) => Some(Item::Nvml(n.clone())),
                GpuEvent::Attach(a) => {
                    if self.attach.len() < MAX_LIST {
                        self.attach.push(a.clone());
                    }
                    None
                }
                GpuEvent::Source(s) => {
                    if !self.sources.contains(s) {
                        self.sources.push(s.clone());
                    }
                    None
                }
                GpuEvent::Lost(l) => {
                    self.lost = l.clone();
                    None
                }
                GpuEvent::Late(l) => {
                    if self.late.len() < MAX_LIST {
                        self.late.push(l.clone());
                    }
                    None
                }
            },
            Event::Printk { msg, .. } => parse_xid_line(msg).map(|mut x| {
                x.ts_ns = ts;
                Item::Xid(x)
            }),
            Event::JobStart(j) => {
                self.root_pid = Some(j.pid);
                None
            }
            Event::Fork { child, parent, .. } => {
                self.parents.insert(*child, *parent);
                self.job_pids.insert(child.tgid, *child);
                None
            }
            Event::Exec { proc, .. } => {
                self.job_pids.entry(proc.tgid).or_insert(*proc);
                None
            }
            Event::Exit { proc, .. } => Some(Item::Exit(*proc)),
            Event::Oom(o) => {
                self.oom_victims.insert(o.victim.tgid);
                None
            }
            Event::Mem(MemSample {
                proc,
                in_job: true,
                rss,
                ..
            }) => {
                self.job_pids.entry(proc.tgid).or_insert(*proc);
                Some(Item::Rss(*proc, resident(rss)))
            }
            _ => None,
        };
        if let Some(item) = item {
            self.seq += 1;
            self.heap.push(Reverse((ts, self.seq)));
            self.items.insert(self.seq, item);
        }
        self.replay(self.now.saturating_sub(REORDER_NS));
    }

    /// Applies every buffered event up to `until`, in time order.
    fn replay(&mut self, until: u64) {
        while let Some(Reverse((ts, seq))) = self.heap.peek().copied() {
            if ts > until {
                break;
            }
            self.heap.pop();
            if let Some(item) = self.items.remove(&seq) {
                self.apply(ts, item);
            }
        }
    }

    pub(super) fn proc(&mut self, key: ProcKey, comm: &str, ts: u64) -> &mut ProcState {
        let root = self.root_pid;
        let parent = self.parents.get(&key).copied();
        let st = self.procs.entry(key).or_insert_with(|| ProcState {
            p: GpuProcess {
                pid: key.tgid,
                start_ns: key.start_ns,
                parent: parent.map(|p| p.tgid),
                is_root: root == Some(key.tgid),
                ..GpuProcess::default()
            },
            seen_ns: ts,
            ..ProcState::default()
        });
        if !comm.is_empty() {
            st.p.comm = comm.to_string();
        }
        st
    }

    fn apply(&mut self, ts: u64, item: Item) {
        match item {
            Item::Cuda(c) => self.on_cuda(ts, c),
            Item::Exit(key) => self.on_exit(ts, key),
            Item::Rss(key, kb) => self.on_rss(ts, key, kb),
            Item::Nvml(n) => self.on_nvml(n),
            Item::Xid(x) => self.on_xid(x),
            Item::NvPages(key, alloc, pages) => {
                let st = self.proc(key, "", ts);
                if alloc {
                    st.p.nv_pages_alloc += u64::from(pages);
                } else {
                    st.p.nv_pages_free += u64::from(pages);
                }
            }
        }
    }

    fn on_rss(&mut self, ts: u64, key: ProcKey, kb: u64) {
        let v = self.rss.entry(key).or_default();
        v.push((ts, kb));
        if v.len() > MAX_RSS {
            thin(v);
        }
        if let Some(st) = self.procs.get_mut(&key) {
            st.p.host_rss_peak_kb = st.p.host_rss_peak_kb.max(kb);
        }
    }

    /// Host RSS of a job process at or before `ts`.
    pub(super) fn rss_at(&self, key: ProcKey, ts: u64) -> Option<u64> {
        let v = self.rss.get(&key)?;
        let i = v.partition_point(|(t, _)| *t <= ts);
        (i > 0).then(|| v[i - 1].1)
    }

    /// Everyone holding GPU-side memory now, most device memory first.
    pub(super) fn holders(&self) -> Vec<Holder> {
        let mut v: Vec<Holder> = self
            .procs
            .values()
            .filter(|s| s.p.exited_ns.is_none() && s.cur.iter().any(|&b| b > 0))
            .map(|s| Holder {
                pid: s.p.pid,
                comm: s.p.comm.clone(),
                held: s.held(),
            })
            .collect();
        v.sort_by(|a, b| b.held.device.cmp(&a.held.device).then(a.pid.cmp(&b.pid)));
        v
    }

    fn on_exit(&mut self, ts: u64, key: ProcKey) {
        let Some(st) = self.procs.get_mut(&key) else {
            return;
        };
        st.p.exited_ns = Some(ts);
        st.p.oom_killed = self.oom_victims.contains(&key.tgid);
        for k in KINDS {
            let held = st.cur[idx(k)];
            let s = st.stats(k);
            s.end = held;
            s.freed_at_exit = held;
        }
        st.cur = [0; 3];
        st.registered = 0;
        st.live.clear();
        st.vmm.clear();
        st.maps.clear();
        st.point(ts);
    }

    fn on_nvml(&mut self, n: NvmlSample) {
        self.nvml_samples += 1;
        let (mut used, mut total) = (0, 0);
        let mut per_pid: HashMap<u32, u64> = HashMap::new();
        for d in &n.devices {
            used += d.used_bytes;
            total += d.total_bytes;
            match self.nvml_devices.iter_mut().find(|s| s.index == d.index) {
                Some(s) => {
                    s.last_used_bytes = d.used_bytes;
                    s.peak_used_bytes = s.peak_used_bytes.max(d.used_bytes);
                    s.total_bytes = d.total_bytes;
                }
                None => self.nvml_devices.push(NvmlDeviceSummary {
                    index: d.index,
                    name: d.name.clone(),
                    total_bytes: d.total_bytes,
                    last_used_bytes: d.used_bytes,
                    peak_used_bytes: d.used_bytes,
                }),
            }
            for p in &d.processes {
                *per_pid.entry(p.pid).or_default() += p.used_bytes.unwrap_or(0);
            }
        }
        self.nvml_last = Some((used, total));
        for (pid, bytes) in per_pid {
            // Only the job's processes: NVML lists the whole machine's.
            let Some(&key) = self.job_pids.get(&pid) else {
                continue;
            };
            let ts = self.now;
            let st = self.proc(key, "", ts);
            // NVML lists a process until the driver has torn its contexts
            // down, after its exit: the ledger freed its memory at the exit,
            // so such a sample would compare the driver's figure with 0 (seen
            // on an H200: every run's last sample came after the exit).
            if st.p.exited_ns.is_some() {
                continue;
            }
            let c = st.p.nvml.get_or_insert_with(NvmlCompare::default);
            c.samples += 1;
            c.last_nvml_bytes = bytes;
            c.last_ledger_bytes = st.cur[idx(MemKind::Device)];
            c.peak_nvml_bytes = c.peak_nvml_bytes.max(bytes);
        }
    }

    /// `kills`: (time, window) of each host OOM kill, in the report's order.
    pub(crate) fn finish(mut self, kills: &[(u64, u64)]) -> GpuReport {
        self.replay(u64::MAX);
        let mut procs: Vec<&ProcState> = self.procs.values().collect();
        procs.sort_by_key(|s| (s.seen_ns, s.p.pid, s.p.start_ns));

        let at_kills = kills
            .iter()
            .map(|&(kill, window)| at_kill(&procs, kill, window))
            .collect();

        let (timeline, timeline_dropped) = timeline(&procs, &self.ooms, &self.rss);
        let series = procs
            .iter()
            .filter(|s| !s.history.is_empty())
            .map(|s| GpuSeries {
                pid: s.p.pid,
                start_ns: s.p.start_ns,
                comm: s.p.comm.clone(),
                points: s.history.clone(),
            })
            .collect();
        let processes = procs
            .iter()
            .map(|s| {
                let mut p = s.p.clone();
                if p.exited_ns.is_none() {
                    for k in KINDS {
                        let held = s.cur[idx(k)];
                        match k {
                            MemKind::Device => p.device.end = held,
                            MemKind::Pinned => p.pinned.end = held,
                            MemKind::Managed => p.managed.end = held,
                        }
                    }
                }
                if p.comm.is_empty() {
                    p.comm = "?".into();
                }
                p
            })
            .collect();
        GpuReport {
            processes,
            cuda_ooms: self.ooms,
            xid: self.xid,
            timeline,
            timeline_dropped,
            at_kills,
            series,
            attach: self.attach,
            late: self.late,
            sources: self.sources,
            nvml_samples: self.nvml_samples,
            nvml_devices: self.nvml_devices,
            lost: self.lost,
        }
    }
}

fn resident(rss: &Rss) -> u64 {
    rss.resident_kb()
}

/// Xid errors: the tracepoint's and the kernel log's, one entry when both
/// report the same error.
impl Ledger {
    pub(super) fn on_xid(&mut self, x: Xid) {
        // The same Xid from the tracepoint and the log: one entry.
        if let Some(prev) = self.xid.iter_mut().rev().find(|p| {
            p.code == x.code && p.pid == x.pid && p.ts_ns.abs_diff(x.ts_ns) <= XID_MERGE_NS
        }) && prev.source != x.source
            && !prev.source.contains('+')
        {
            prev.source = format!("{}+{}", prev.source, x.source);
            if prev.name.is_none() {
                prev.name = x.name;
            }
            return;
        }
        if self.xid.len() < MAX_LIST {
            self.xid.push(x);
        }
    }
}
