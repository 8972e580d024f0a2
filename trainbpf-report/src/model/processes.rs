//! The job and its processes: who forked whom, what each ran, how it
//! ended, what it held; and the machine's biggest memory users.

use crate::decode::MemSample;
use crate::decode::{Event, ExitStatus, JobStart, ProcInfo, ProcKey, Rss};

use super::timeline::Sample;
use super::{Builder, Group, Grower, attribution};

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(crate) struct Job {
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    /// When the collector started it (event time).
    pub(crate) started_ns: u64,
    pub(crate) argv: Vec<String>,
    pub(crate) cwd: String,
    pub(crate) uid: u32,
    pub(crate) cgroup: Option<String>,
    pub(crate) memory_limit_bytes: Option<u64>,
    /// As `wait(2)` reported it; `None` when the recording ends first.
    pub(crate) exit: Option<ExitStatus>,
    pub(crate) exited_ns: Option<u64>,
    /// How the recorder attached to a job it did not start: "pid",
    /// "cgroup" or "all"; None when it ran the job.
    pub(crate) attached: Option<String>,
    /// The `--cgroup` directory as named.
    pub(crate) target: Option<String>,
}

impl Job {
    /// What was recorded, for a title: the command it ran, or what it
    /// attached to ("all processes", "cgroup /sys/fs/cgroup/memory/x",
    /// "pid 42 (python3)"). `root_comm` names the root for `--pid`.
    pub(crate) fn title(&self, root_comm: Option<&str>) -> String {
        match self.attached.as_deref() {
            Some("all") => "all processes".into(),
            Some("cgroup") => format!(
                "cgroup {}",
                self.target
                    .as_deref()
                    .or(self.cgroup.as_deref())
                    .unwrap_or("?")
            ),
            Some("pid") => {
                let comm = root_comm
                    .filter(|c| !c.is_empty())
                    .or(self.argv.first().map(|a| a.rsplit('/').next().unwrap_or(a)))
                    .unwrap_or("?");
                format!("pid {} ({comm})", self.pid)
            }
            _ => self.argv.join(" "),
        }
    }

    /// Attached to processes the recorder did not start, with no single
    /// root (`--all`, `--cgroup`).
    pub(crate) fn rootless(&self) -> bool {
        self.pid == 0 && self.attached.is_some()
    }

    pub(crate) fn key(&self) -> ProcKey {
        ProcKey {
            tgid: self.pid,
            start_ns: self.start_ns,
        }
    }
}

/// One process of the job.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(crate) struct Process {
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    pub(crate) comm: String,
    pub(crate) parent: Option<ProcKey>,
    /// Last exec'd filename; ends in "…" when the recorder had to cut it.
    pub(crate) exec: Option<String>,
    pub(crate) born_ns: Option<u64>,
    pub(crate) died_ns: Option<u64>,
    pub(crate) exit: Option<ExitStatus>,
    pub(crate) peak_rss_kb: u64,
    pub(crate) oom_killed: bool,
    /// Last `oom_score_adj` written while recording, if any.
    pub(crate) oom_score_adj: Option<i32>,
    /// The process (tgid) that wrote it: itself, or a launcher.
    pub(crate) oom_score_adj_by: Option<u32>,
    /// Its parent's resident memory when it forked this process: what a
    /// child that did not exec shares copy-on-write at birth.
    pub(crate) parent_rss_at_fork_kb: Option<u64>,
    /// Memory it allocated minus what it freed, in its own context, at its
    /// last record: what it really added.
    pub(crate) honest_kb: Option<i64>,
    /// The most it had added at any record: a process that frees its heap
    /// before exiting still shows what it held.
    pub(crate) honest_peak_kb: Option<i64>,
    /// Page cache it brought in minus what it removed, in its own context,
    /// at its last record: left out of `honest_kb` (the kernel gives it back
    /// without a kill). None in recordings without the page-cache probes,
    /// where it is part of `honest_kb`.
    pub(crate) page_cache_kb: Option<i64>,
    /// Unique and proportional memory from its last smaps_rollup sample.
    pub(crate) uss_kb: Option<u64>,
    pub(crate) pss_kb: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MemoryUser {
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    pub(crate) comm: String,
    pub(crate) peak_rss_kb: u64,
    pub(crate) in_job: bool,
}

/// Decodes a wait(2) status: low 7 bits a signal, else the exit code in
/// bits 8–15.
pub fn wait_status(status: u32) -> ExitStatus {
    let sig = status & 0x7f;
    if sig != 0 {
        ExitStatus::Signal(sig as i32)
    } else {
        ExitStatus::Code(((status >> 8) & 0xff) as i32)
    }
}

/// A job process's life; kept for the whole recording (it is the output).
#[derive(Debug, Default)]
pub(super) struct JobProc {
    pub(super) comm: String,
    pub(super) parent: Option<ProcKey>,
    pub(super) exec: Option<String>,
    pub(super) fork_ns: Option<u64>,
    pub(super) died_ns: Option<u64>,
    pub(super) exit: Option<ExitStatus>,
    pub(super) peak_kb: u64,
    /// Its last exec: `peak_kb` counts from there (see `Track::exec_ns`).
    pub(super) exec_ns: Option<u64>,
    pub(super) oom_killed: bool,
    /// Allocated minus freed in its own context, at its last record, and
    /// the most it reached.
    pub(super) net_kb: Option<i64>,
    pub(super) peak_net_kb: Option<i64>,
    /// Page cache added minus removed in its context, at its last record.
    pub(super) cache_kb: Option<i64>,
    /// The parent's resident memory at the fork.
    pub(super) parent_rss_kb: Option<u64>,
}

impl Builder {
    /// A new start time under a known tgid: the old process has exited even
    /// if its exit went unrecorded (only job processes report exits).
    pub(super) fn note_pid(&mut self, key: ProcKey, ts: u64) {
        if key.start_ns == 0 {
            return;
        }
        let prev = self.current.insert(key.tgid, key.start_ns);
        if let Some(old) = prev.filter(|&s| s != 0 && s < key.start_ns) {
            let old = ProcKey {
                tgid: key.tgid,
                start_ns: old,
            };
            if let Some(tr) = self.tracks.get_mut(&old) {
                tr.died_ns.get_or_insert(ts.min(key.start_ns.max(1)));
            }
        } else if let Some(old) = prev.filter(|&s| s > key.start_ns) {
            // A late record of the older process: keep the newer as current.
            self.current.insert(key.tgid, old);
        }
    }

    pub(super) fn on_mem(
        &mut self,
        ts: u64,
        proc: ProcKey,
        in_job: bool,
        comm: String,
        rss: Rss,
        more: Sample,
    ) {
        self.note_pid(proc, ts);
        let horizon = self.horizon();
        let kb = rss.resident_kb();
        if in_job || self.job_procs.contains_key(&proc) {
            let p = self.job_procs.entry(proc).or_default();
            if ts >= p.exec_ns.unwrap_or(0) {
                p.peak_kb = p.peak_kb.max(kb);
            }
            p.comm.clone_from(&comm);
            if self.honest {
                p.net_kb = Some(more.net_kb);
                p.peak_net_kb = Some(p.peak_net_kb.map_or(more.net_kb, |n| n.max(more.net_kb)));
                if self.page_cache {
                    p.cache_kb = Some(more.cache_kb);
                }
            }
        }
        let tr = self.tracks.entry(proc).or_default();
        tr.comm = comm;
        tr.in_job |= in_job;
        tr.push(
            Sample {
                ts,
                kb,
                swap_kb: rss.swap_kb,
                ..more
            },
            horizon,
        );
    }

    pub(super) fn on_job_start(&mut self, ts: u64, j: JobStart) {
        let key = ProcKey {
            tgid: j.pid,
            start_ns: j.start_ns,
        };
        self.note_pid(key, ts);
        // `--all` and `--cgroup` have no root process: no row for pid 0.
        if j.pid != 0 {
            let p = self.job_procs.entry(key).or_default();
            if p.comm.is_empty() {
                // Until the first exec or memory record names it.
                let arg0 = j.argv.first().map(String::as_str).unwrap_or("");
                p.comm = arg0.rsplit('/').next().unwrap_or(arg0).to_string();
            }
            if p.fork_ns.is_none() && j.start_ns == 0 {
                p.fork_ns = Some(ts);
            }
        }
        self.job = Some(Job {
            pid: j.pid,
            start_ns: j.start_ns,
            started_ns: ts,
            argv: j.argv,
            cwd: j.cwd,
            uid: j.uid,
            cgroup: j.cgroup,
            memory_limit_bytes: j.memory_limit_bytes,
            exit: None,
            exited_ns: None,
            attached: j.attached,
            target: j.target,
        });
        // Kernel records of the root can precede this one in the file: the
        // collector writes its own records as it makes them, the kernel's
        // as it drains the ring buffer.
        let earlier = self
            .job_procs
            .keys()
            .filter(|k| k.tgid == j.pid && k.start_ns != 0)
            .max_by_key(|k| k.start_ns)
            .copied();
        if let Some(k) = earlier {
            self.adopt_root(k);
        }
    }

    /// The collector can't see the kernel's start time of the job's root
    /// and records 0; the first job record under the root's pid names it.
    /// From then on the root is that process, whatever later reuses its pid.
    pub(super) fn adopt_root(&mut self, key: ProcKey) {
        let Some(job) = &mut self.job else {
            return;
        };
        if job.start_ns != 0 || key.tgid != job.pid || key.start_ns == 0 {
            return;
        }
        job.start_ns = key.start_ns;
        let placeholder = ProcKey {
            tgid: key.tgid,
            start_ns: 0,
        };
        if let Some(p) = self.job_procs.remove(&placeholder) {
            let real = self.job_procs.entry(key).or_default();
            if real.comm.is_empty() {
                real.comm = p.comm;
            }
            real.peak_kb = real.peak_kb.max(p.peak_kb);
        }
    }

    /// When the process was born, if known: its fork, else its start time.
    pub(super) fn born_ns(&self, key: ProcKey) -> Option<u64> {
        self.job_procs
            .get(&key)
            .and_then(|p| p.fork_ns)
            .or((key.start_ns != 0).then_some(key.start_ns))
    }

    /// Role groups over the whole run, from each process's last record.
    pub(super) fn run_groups(&self, processes: &[Process]) -> Vec<Group> {
        let as_growers: Vec<Grower> = processes
            .iter()
            .map(|p| Grower {
                pid: p.pid,
                start_ns: p.start_ns,
                comm: p.comm.clone(),
                grew_kb: p.peak_rss_kb,
                honest_kb: p.honest_peak_kb,
                window_ns: p
                    .died_ns
                    .or(self.last)
                    .unwrap_or(0)
                    .saturating_sub(p.born_ns.unwrap_or(0)),
                rate_kb_per_s: None,
                rss_kb: p.peak_rss_kb,
                in_job: true,
                born_in_window: false,
                is_victim: false,
            })
            .collect();
        attribution::groups(&as_growers, |g| self.role_of(g))
    }

    /// A grower's role: DataLoader worker, torchrun rank, or its command
    /// line when it has siblings (groups of one are dropped later).
    pub(super) fn role_of(&self, g: &Grower) -> Option<String> {
        let info = self.attribution.info_of(g.pid);
        let key = ProcKey {
            tgid: g.pid,
            start_ns: g.start_ns,
        };
        // A rank's own process, by its identity: the helpers under it carry
        // its RANK too (a pyenv shim's bash, a compiler), and are grouped by
        // command line; its workers are DataLoader workers. What the
        // sampler read decides only where no identity was recorded.
        let rank = match self.identities.get(&key) {
            Some(i) => i.rank.is_some() && !i.inherited,
            None => attribution::role(&g.comm, info.as_deref()).is_some(),
        };
        attribution::role(&g.comm, None)
            .or_else(|| rank.then(|| "torchrun ranks".to_string()))
            .or_else(|| {
                let cmd = info?.cmdline.join(" ");
                (!cmd.is_empty()).then(|| format!("`{}`", truncate_chars(&cmd, 60)))
            })
    }

    pub(super) fn comm_of(&self, key: ProcKey) -> String {
        self.job_procs
            .get(&key)
            .map(|p| p.comm.clone())
            .filter(|c| !c.is_empty())
            .or_else(|| self.tracks.get(&key).map(|t| t.comm.clone()))
            .unwrap_or_else(|| "?".into())
    }
}

pub(super) fn truncate_chars(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

impl Builder {
    /// Any job record under the root's pid can name the root's start time.
    pub(super) fn adopt_from(&mut self, ev: &Event) {
        match ev {
            Event::Fork { child, parent, .. } => {
                self.adopt_root(*parent);
                self.adopt_root(*child);
            }
            Event::Exec { proc, .. } | Event::Exit { proc, .. } => self.adopt_root(*proc),
            Event::Mem(MemSample {
                proc, in_job: true, ..
            }) => self.adopt_root(*proc),
            Event::Oom(r) if r.in_job => self.adopt_root(r.victim),
            _ => {}
        }
    }

    pub(super) fn on_fork(&mut self, ts: u64, child: ProcKey, parent: ProcKey, comm: String) {
        self.note_pid(child, ts);
        let parent_rss_kb = self
            .tracks
            .get(&parent)
            .and_then(|t| t.at_or_before(ts))
            .map(|s| s.kb);
        let p = self.job_procs.entry(child).or_default();
        p.parent = Some(parent);
        p.parent_rss_kb = parent_rss_kb;
        p.fork_ns = Some(ts);
        if p.comm.is_empty() {
            p.comm = comm;
        }
    }

    pub(super) fn on_exec(
        &mut self,
        ts: u64,
        proc: ProcKey,
        comm: String,
        filename: String,
        truncated: bool,
    ) {
        self.note_pid(proc, ts);
        // A fork of a 450 MiB parent that becomes `ldconfig` is not a
        // 450 MiB process: its peak counts from the exec on.
        let since = match self.tracks.get_mut(&proc) {
            Some(tr) => {
                tr.on_exec(ts);
                tr.peak_kb
            }
            None => 0,
        };
        let p = self.job_procs.entry(proc).or_default();
        p.exec_ns = Some(ts);
        p.peak_kb = since;
        p.comm = comm;
        p.exec = Some(if truncated {
            format!("{filename}…")
        } else {
            filename
        });
    }

    pub(super) fn on_exit(&mut self, ts: u64, proc: ProcKey, comm: String, exit_code: u32) {
        // The name at exit is the newest: a worker renamed after
        // fork (`pt_data_worker`) may send no memory record since.
        if let Some(tr) = self.tracks.get_mut(&proc) {
            tr.died_ns = Some(ts);
            tr.comm.clone_from(&comm);
        }
        let p = self.job_procs.entry(proc).or_default();
        p.comm = comm;
        p.died_ns = Some(ts);
        p.exit = Some(wait_status(exit_code));
    }

    /// A memory record: the process's sample, with its honest figures.
    pub(super) fn on_mem_event(&mut self, ts: u64, ev: Event) {
        let Event::Mem(MemSample {
            proc,
            in_job,
            comm,
            rss,
            oom_score_adj,
            pgtables_kb,
            memcg_id,
            alloc_kb,
            freed_kb,
            cache_kb,
            ..
        }) = ev
        else {
            return;
        };
        let mut net_kb = alloc_kb as i64 - freed_kb as i64;
        if self.page_cache {
            // Added is anonymous, shmem and copy-on-write memory,
            // all of which the process maps: never more than that.
            // A parent that writes while a short-lived child still
            // shares its pages copies them, and the child frees the
            // originals at its exec or exit: the parent's count
            // climbs with every fork while its memory does not.
            net_kb = net_kb.min(
                rss.anon_kb
                    .saturating_add(rss.shmem_kb)
                    .saturating_add(rss.swap_kb) as i64,
            );
        }
        let more = Sample {
            adj: oom_score_adj,
            pgtables_kb,
            memcg_id,
            net_kb,
            cache_kb,
            ..Sample::at(ts, 0)
        };
        self.on_mem(ts, proc, in_job, comm, rss, more)
    }

    pub(super) fn on_proc_info(&mut self, i: ProcInfo) {
        // A process found running at an attach: its parent from
        // /proc, since no fork of it was recorded.
        if let (Some(pp), Some(&start)) = (i.ppid, self.current.get(&i.tgid)) {
            let key = ProcKey {
                tgid: i.tgid,
                start_ns: start,
            };
            let parent = self.current.get(&pp).map(|&s| ProcKey {
                tgid: pp,
                start_ns: s,
            });
            let parent = parent.filter(|k| self.job_procs.contains_key(k));
            if let (Some(p), Some(parent)) = (self.job_procs.get_mut(&key), parent)
                && p.parent.is_none()
            {
                p.parent = Some(parent);
            }
        }
        self.attribution.on_proc_info(i)
    }

    /// Who a process is: its exec's record, under the process it names
    /// (by start time, or the pid's current process).
    pub(super) fn on_identity(&mut self, ts: u64, rec: crate::decode::ProcIdentity) {
        let start_ns = match rec.start_ns {
            0 => self.current.get(&rec.tgid).copied().unwrap_or(0),
            s => s,
        };
        let key = ProcKey {
            tgid: rec.tgid,
            start_ns,
        };
        let parent = self.job_procs.get(&key).and_then(|p| p.parent);
        self.identities.on_record(ts, key, parent, &rec);
    }

    /// The job's processes for the report; the caller orders them.
    pub(super) fn processes(&self) -> Vec<Process> {
        self.job_procs
            .iter()
            .map(|(key, p)| Process {
                pid: key.tgid,
                start_ns: key.start_ns,
                comm: p.comm.clone(),
                parent: p.parent,
                exec: p.exec.clone(),
                born_ns: self.born_ns(*key),
                died_ns: p.died_ns,
                exit: p.exit,
                peak_rss_kb: p.peak_kb,
                oom_killed: p.oom_killed,
                oom_score_adj: self.adj.get(key).map(|a| a.0),
                oom_score_adj_by: self.adj.get(key).map(|a| a.1).filter(|&w| w != 0),
                parent_rss_at_fork_kb: p.parent_rss_kb,
                honest_kb: p.net_kb,
                honest_peak_kb: p.peak_net_kb,
                page_cache_kb: p.cache_kb,
                uss_kb: self.attribution.smaps_of(key.tgid).map(|s| s.uss_kb),
                pss_kb: self.attribution.smaps_of(key.tgid).map(|s| s.pss_kb),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::decode::{Event, MemSample, ProcKey, Rss, Timed};
    use crate::model::{ModelOptions, build};
    use crate::recording::RecordingHeader;

    const SEC: u64 = 1_000_000_000;

    fn mem(ts_ns: u64, proc: ProcKey, anon_kb: u64) -> Timed {
        Timed {
            ts_ns,
            event: Event::Mem(MemSample {
                proc,
                in_job: true,
                comm: "python3".into(),
                rss: Rss {
                    anon_kb,
                    ..Rss::default()
                },
                faults: 0,
                reason: 1,
                oom_score_adj: 0,
                pgtables_kb: 0,
                memcg_id: 0,
                stall_ns: 0,
                alloc_kb: 0,
                freed_kb: 0,
                cache_kb: 0,
            }),
        }
    }

    /// A worker forked from a parent holding 90 MiB shares those pages at
    /// birth: the model keeps the parent's figure at the fork, not a
    /// later one. A launcher's write of the worker's oom_score_adj names
    /// the launcher.
    #[test]
    fn the_parents_rss_at_fork_and_who_set_oom_score_adj() {
        let parent = ProcKey {
            tgid: 10,
            start_ns: 1,
        };
        let child = ProcKey {
            tgid: 11,
            start_ns: 2 * SEC,
        };
        let events = vec![
            mem(SEC, parent, 90 << 10),
            Timed {
                ts_ns: 2 * SEC,
                event: Event::Fork {
                    child,
                    parent,
                    comm: "python3".into(),
                    kthread: false,
                },
            },
            mem(3 * SEC, parent, 150 << 10),
            Timed {
                ts_ns: 3 * SEC,
                event: Event::OomAdj {
                    proc: child,
                    in_job: true,
                    comm: "python3".into(),
                    oom_score_adj: 1000,
                    writer_tgid: 10,
                },
            },
        ];
        let r = build(
            &RecordingHeader::default(),
            events.into_iter(),
            &ModelOptions::default(),
        );
        let p = |pid| r.processes.iter().find(|p| p.pid == pid).unwrap();
        assert_eq!(p(11).parent_rss_at_fork_kb, Some(90 << 10));
        assert_eq!(p(11).oom_score_adj, Some(1000));
        assert_eq!(p(11).oom_score_adj_by, Some(10));
        assert_eq!(p(10).parent_rss_at_fork_kb, None);
        assert_eq!(p(10).oom_score_adj_by, None);
    }
}
