//! A kill's one line, told at the kill: the facts the report's
//! `kills[].verdict` is made of ([`trainbpf_report::model::verdict`]),
//! gathered from the records as they pass, and the line made once by the
//! model's own function. The collector records it, prints it, and hands
//! it to `--events-jsonl` and torchelastic's error file; the report
//! repeats the recorded line, so that every place says the same.
//!
//! The report's rules, kept live and bounded: the victim named by its
//! rank; the constraint from `oom_kill_process` or the kernel's log; a
//! memcg OOM's limit from the kernel's `memory: usage …, limit …` line;
//! the top grower by what it added over the report's window
//! (`pipeline::WINDOW`), from a few samples per process; and the place
//! of its heaviest growth stack.

use std::collections::{HashMap, VecDeque};

use trainbpf_report::{
    decode::{Event, MemSample, OomRecord, ProcKey, Timed, UserBody, stacks::StackDelta},
    model::{
        Constraint,
        identity::Identity,
        kill_constraint, memcg_limit,
        verdict::{self, Facts, Top},
    },
    pipeline::WINDOW,
};

/// Processes followed at most: past this a new one has no figures (a
/// kill still gets its line, without a top grower the recorder lost).
const MAX_PROCS: usize = 8192;
/// Samples kept per process, at least `WINDOW / SAMPLES` apart.
const SAMPLES: u64 = 16;
/// Growth stacks kept per process, and in all (a new stack heavier than
/// a process's lightest takes its place in a full table).
const MAX_STACKS: usize = 256;
const MAX_ALL_STACKS: usize = 65_536;
/// Recent kernel log facts and told kills remembered.
const MAX_LOG: usize = 64;
/// A kill's log lines come this close before its record.
const LOG_NS: u64 = 2_000_000_000;

#[derive(Default)]
struct Proc {
    start_ns: u64,
    parent: u32,
    comm: String,
    in_job: bool,
    /// Its rank, and whether it inherited it from its parent.
    rank: Option<(u32, bool)>,
    /// (ts, added kB, resident kB), oldest first.
    samples: VecDeque<(u64, i64, u64)>,
    /// Per growth stack: its bytes, and the place it cites once named.
    stacks: HashMap<(i32, u64, u64), Stack>,
}

#[derive(Default)]
struct Stack {
    bytes: u64,
    /// `None` until the stack's frames come; then the place its lead
    /// frame cites (`Some(None)`: none of the user's own code).
    place: Option<Option<String>>,
}

/// See the module docs.
#[derive(Default)]
pub struct KillLines {
    procs: HashMap<u32, Proc>,
    /// (ts, pid, constraint) from `oom-kill:` and `Killed process` lines;
    /// no pid where the `oom-kill:` line came cut (the next kill's).
    constraints: VecDeque<(u64, Option<u32>, Constraint)>,
    /// (ts, limit kB) from `memory: usage …, limit …` lines.
    limits: VecDeque<(u64, u64)>,
    /// Kills told: (victim pid, ts).
    told: VecDeque<(u32, u64)>,
    /// Growth stacks kept, over all processes.
    stacks: usize,
    /// The last signal each job process was sent: (sig, its sender).
    senders: HashMap<u32, (u32, String)>,
    /// The first kill of the latest burst: (ts, its victim named).
    burst: Option<(u64, String)>,
    /// The job's first kill: (ts, its victim named).
    first: Option<(u64, String)>,
}

impl KillLines {
    /// A kernel record; for a kill of a job process not told yet, its
    /// victim and line.
    pub fn observe(&mut self, t: &Timed) -> Option<(ProcKey, String)> {
        let ts = t.ts_ns;
        match &t.event {
            Event::Fork {
                child,
                parent,
                comm,
                ..
            } => {
                let rank = self
                    .procs
                    .get(&parent.tgid)
                    .and_then(|p| p.rank)
                    .map(|(r, _)| (r, true));
                if let Some(p) = self.entry(*child) {
                    p.parent = parent.tgid;
                    p.comm.clone_from(comm);
                    p.rank = rank;
                }
            }
            Event::Exec { proc, comm, .. } => {
                if let Some(p) = self.entry(*proc) {
                    p.comm.clone_from(comm);
                }
            }
            Event::Signal(s)
                if self.senders.len() < MAX_PROCS || self.senders.contains_key(&s.target.tgid) =>
            {
                let from = format!("{} (pid {})", s.sender.comm, s.sender.tgid);
                self.senders.insert(s.target.tgid, (s.sig, from));
            }
            Event::Exit { proc, .. } => {
                self.senders.remove(&proc.tgid);
                if let Some(p) = self.procs.remove(&proc.tgid) {
                    self.stacks -= p.stacks.len();
                }
            }
            Event::Mem(m) => self.on_mem(ts, m),
            Event::Printk { msg, .. } => {
                if let Some((pid, c)) = kill_constraint(msg) {
                    push_bounded(&mut self.constraints, (ts, pid, c));
                } else if let Some(l) = memcg_limit(msg) {
                    push_bounded(&mut self.limits, (ts, l));
                }
            }
            Event::Oom(r) if r.in_job => return self.on_kill(ts, r),
            _ => {}
        }
        None
    }

    /// A record the collector wrote: who a process is, its stacks.
    pub fn on_user(&mut self, body: &UserBody) {
        match body {
            UserBody::Identity(rec) => {
                let Some(rank) = Identity::from_record(rec).rank else {
                    return;
                };
                let parent = self.procs.get(&rec.tgid).map_or(0, |p| p.parent);
                // A helper that carries its rank's RANK is not a rank.
                let inherited = self
                    .procs
                    .get(&parent)
                    .and_then(|p| p.rank)
                    .is_some_and(|(r, _)| r == rank);
                if let Some(p) = self.procs.get_mut(&rec.tgid) {
                    p.rank = Some((rank, inherited));
                }
            }
            UserBody::Stacks(s) => {
                for d in s.stacks.iter().filter(|d| !d.gpu) {
                    self.on_stack(d);
                }
            }
            _ => {}
        }
    }

    fn on_stack(&mut self, d: &StackDelta) {
        let room = self.stacks < MAX_ALL_STACKS;
        let Some(p) = self.procs.get_mut(&d.proc.tgid) else {
            return;
        };
        let key = (d.stack_id, d.py_id, d.leaf_ret);
        let e = match p.stacks.get_mut(&key) {
            Some(e) => e,
            None => {
                if !room || p.stacks.len() >= MAX_STACKS {
                    let lightest = p
                        .stacks
                        .iter()
                        .min_by_key(|(_, s)| s.bytes)
                        .map(|(k, s)| (*k, s.bytes));
                    match lightest {
                        Some((k, b)) if b < d.bytes => {
                            p.stacks.remove(&k);
                        }
                        _ => return,
                    }
                } else {
                    self.stacks += 1;
                }
                p.stacks.entry(key).or_default()
            }
        };
        e.bytes += d.bytes;
        // The frames come with the stack's first record that has them.
        if e.place.is_none()
            && let Some(frames) = &d.frames
        {
            e.place = Some(verdict::place_of(&[(1, frames.clone())]));
        }
    }

    /// A process in prose, as the report names it (`rank 1 (pid 812)`).
    pub fn who(&self, pid: u32, comm: &str) -> String {
        let p = self.procs.get(&pid);
        let comm = p
            .map(|p| p.comm.as_str())
            .filter(|c| !c.is_empty())
            .unwrap_or(comm);
        verdict::who(pid, comm, p.and_then(|p| p.rank))
    }

    /// The job's first OOM kill before a death at `ts` of a process born
    /// at `born`: its victim, and how long before. Such a death is its
    /// consequence (the report's rule, `model::consequence`): the process
    /// was alive at the kill.
    pub fn after_first_kill(&self, ts: u64, born: u64) -> Option<(&str, u64)> {
        self.first
            .as_ref()
            .filter(|(at, _)| *at < ts && born < *at)
            .map(|(at, who)| (who.as_str(), ts - at))
    }

    /// Who sent `pid` signal `sig` last, where the recorder saw it.
    pub fn sender(&self, pid: u32, sig: i32) -> Option<&str> {
        self.senders
            .get(&pid)
            .filter(|s| s.0 as i32 == sig)
            .map(|s| s.1.as_str())
    }

    fn entry(&mut self, key: ProcKey) -> Option<&mut Proc> {
        if self.procs.len() >= MAX_PROCS && !self.procs.contains_key(&key.tgid) {
            return None;
        }
        let p = self.procs.entry(key.tgid).or_default();
        if p.start_ns != key.start_ns {
            self.stacks -= p.stacks.len();
            *p = Proc {
                start_ns: key.start_ns,
                ..Proc::default()
            };
        }
        Some(p)
    }

    fn on_mem(&mut self, ts: u64, m: &MemSample) {
        let in_job = m.in_job;
        let Some(p) = self.entry(m.proc) else {
            return;
        };
        p.in_job |= in_job;
        if p.comm.is_empty() {
            p.comm.clone_from(&m.comm);
        }
        let s = (
            ts,
            m.alloc_kb as i64 - m.freed_kb as i64,
            m.rss.resident_kb(),
        );
        let every = WINDOW.as_nanos() as u64 / SAMPLES;
        // The newest always; an older one only as often as `every`.
        let n = p.samples.len();
        if n >= 2 && p.samples[n - 2].0 + every > ts {
            p.samples[n - 1] = s;
        } else {
            p.samples.push_back(s);
        }
        // One at or before the window's start stays: the baseline.
        let start = ts.saturating_sub(WINDOW.as_nanos() as u64);
        while p.samples.len() > 2 && p.samples[1].0 <= start {
            p.samples.pop_front();
        }
    }

    fn on_kill(&mut self, ts: u64, r: &OomRecord) -> Option<(ProcKey, String)> {
        let pid = r.victim.tgid;
        if self
            .told
            .iter()
            .any(|&(p, t)| p == pid && t.abs_diff(ts) <= LOG_NS)
        {
            return None;
        }
        push_bounded(&mut self.told, (pid, ts));
        let constraint =
            r.oc.as_ref()
                .map(|o| Constraint::from_kernel(o.constraint))
                .or_else(|| {
                    self.constraints
                        .iter()
                        .rev()
                        .find(|l| match l.1 {
                            Some(p) => p == pid && l.0.abs_diff(ts) <= LOG_NS,
                            None => l.0 <= ts && ts - l.0 <= LOG_NS,
                        })
                        .map(|l| l.2)
                })
                .unwrap_or(Constraint::Unknown);
        let limit_kb = self
            .limits
            .iter()
            .rev()
            .find(|l| l.0 <= ts && ts - l.0 <= LOG_NS)
            .map(|l| l.1)
            .filter(|_| constraint == Constraint::Memcg);
        let (comm, rank) = match self.procs.get(&pid) {
            Some(p) if !p.comm.is_empty() => (p.comm.clone(), p.rank),
            p => (r.comm.clone(), p.and_then(|p| p.rank)),
        };
        let victim = verdict::who(pid, &comm, rank);
        // A second victim while the first one's memory is being freed: the
        // line names the first (the report's rule, `verdict::facts`).
        let after = match &self.burst {
            Some((first, who)) if ts.saturating_sub(*first) <= verdict::AFTER_NS => {
                Some((who.clone(), ts.saturating_sub(*first)))
            }
            _ => {
                self.burst = Some((ts, victim.clone()));
                None
            }
        };
        self.first.get_or_insert_with(|| (ts, victim.clone()));
        let facts = Facts {
            victim,
            constraint,
            limit_kb,
            top: self.top(ts, pid),
            after,
        };
        Some((r.victim, verdict::line(&facts)))
    }

    /// The job's process that added most over the window up to `ts`.
    fn top(&self, ts: u64, victim: u32) -> Option<Top> {
        let start = ts.saturating_sub(WINDOW.as_nanos() as u64);
        let (pid, p, added, rss, window) = self
            .procs
            .iter()
            .filter(|(pid, p)| p.in_job || **pid == victim)
            .filter_map(|(pid, p)| {
                let end = *p.samples.back()?;
                let from = match p.samples.iter().rev().find(|s| s.0 <= start) {
                    Some(b) => *b,
                    None if p.start_ns >= start => (p.start_ns, 0, 0),
                    None => *p.samples.front()?,
                };
                let added = end.1 - from.1;
                let rss = end.2.saturating_sub(from.2);
                (added > 0 || rss > 0).then_some((
                    *pid,
                    p,
                    added,
                    rss,
                    end.0.saturating_sub(from.0),
                ))
            })
            .max_by_key(|g| (g.2, g.3))?;
        Some(Top {
            who: (pid != victim).then(|| verdict::who(pid, &p.comm, p.rank)),
            added_kb: Some(added),
            rss_kb: rss,
            window_ns: window,
            at: heaviest_place(p),
        })
    }
}

/// The place whose stacks added most, as the report merges them (stacks
/// that differ only below the user's own line); none while a heavier
/// stack is not named yet.
fn heaviest_place(p: &Proc) -> Option<String> {
    let mut by_place: HashMap<&str, u64> = HashMap::new();
    let mut unnamed = 0;
    for s in p.stacks.values() {
        match &s.place {
            Some(Some(at)) => *by_place.entry(at).or_default() += s.bytes,
            Some(None) => {}
            None => unnamed = unnamed.max(s.bytes),
        }
    }
    let (at, bytes) = by_place.into_iter().max_by_key(|(at, b)| (*b, *at))?;
    (bytes >= unnamed).then(|| at.to_string())
}

fn push_bounded<T>(q: &mut VecDeque<T>, v: T) {
    if q.len() == MAX_LOG {
        q.pop_front();
    }
    q.push_back(v);
}

#[cfg(test)]
mod tests;
