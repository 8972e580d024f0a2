//! Reads of what the job controls (its memory, its `/proc` entries, the
//! files it maps), on worker threads, each with a deadline. The job can
//! make such a read wait as long as it likes: a page of a file on a FUSE
//! filesystem whose server does not answer, or a thread of its own that
//! holds its memory map's lock while another waits to take it for writing
//! (every later reader of the lock then waits behind it, the kernel's
//! readers of `/proc/PID/cmdline`, `environ` and `mem` among them). The
//! thread that drains the ring buffers makes no such read itself: the
//! threads that do hand each one to a worker here and wait for it at most
//! its deadline. (The GPU probes' few reads, a driver library's maps and
//! descriptor, are the one wait on the draining thread: half a second at
//! most, and the maps scan's once per process, `gpu/probe.rs`.) A read past its deadline is
//! abandoned: its worker may stay blocked in the kernel, so at most
//! [`MAX_STUCK`] may be at once, and past that reads are refused until
//! one returns. Each abandoned and refused read is counted in [`STATS`]
//! and said in the recording (`decode::JobReads`).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
        mpsc::{self, RecvTimeoutError, SyncSender},
    },
    thread,
    time::Duration,
};

use trainbpf_report::decode::JobReads;

/// How long a read of a job process's memory or `/proc` entries may take:
/// they take microseconds, milliseconds under memory pressure.
pub const DEADLINE: Duration = Duration::from_secs(2);
/// How long reading a mapped file's symbols and line tables may take: a
/// large library's DWARF takes seconds the first time.
pub const FILES_DEADLINE: Duration = Duration::from_secs(15);
/// Workers of one pool that may be blocked in an abandoned read at once
/// (each a thread with its stack; the recorder has five pools, the
/// identities', the stacks', the shared-memory looks', the USS/PSS
/// samples' and the GPU probes'): past this, the pool refuses reads until
/// one of them returns.
pub const MAX_STUCK: usize = 4;
/// Idle workers kept for the next read.
const MAX_IDLE: usize = 2;
/// Notes kept of what stalled or was skipped (the first ones), and the
/// longest one.
const MAX_NOTES: usize = 16;
const MAX_NOTE: usize = 512;

/// Why a read was not made, or not waited for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Stall {
    /// Past its deadline: abandoned, its worker perhaps blocked for good.
    #[error(
        "the read took longer than {0:?} and was abandoned (the process's memory may be held by a filesystem that does not answer)"
    )]
    TimedOut(Duration),
    /// Too many earlier reads are still blocked.
    #[error("not read: {0} earlier reads of the job are still blocked")]
    Refused(usize),
    /// The worker could not be started, or it panicked.
    #[error("not read: the reading thread failed")]
    Failed,
}

/// Processes (or places) remembered as stalled, at most.
const MAX_STALLED: usize = 4096;

/// What a read timed out on once (a process, a directory), not read
/// again: a wedged process costs one abandoned read, not one a round.
/// Bounded; past the bound a stalled one is read again, at one more
/// abandoned read each time.
pub struct Stalled<K>(std::collections::HashSet<K>);

impl<K> Default for Stalled<K> {
    fn default() -> Self {
        Stalled(std::collections::HashSet::new())
    }
}

impl<K: std::hash::Hash + Eq> Stalled<K> {
    pub fn contains(&self, k: &K) -> bool {
        self.0.contains(k)
    }

    /// `r`, after remembering `k` where it timed out (a refusal says
    /// nothing about `k`).
    pub fn note<T>(&mut self, k: K, r: Result<T, Stall>) -> Result<T, Stall> {
        if matches!(r, Err(Stall::TimedOut(_))) && self.0.len() < MAX_STALLED {
            self.0.insert(k);
        }
        r
    }
}

/// Counts of what reading the job cost and skipped, for the recording.
pub struct Stats {
    stalled: AtomicU64,
    refused: AtomicU64,
    stuck: AtomicU64,
    fuse_skipped: AtomicU64,
    queue_full: AtomicU64,
    py_cache_cleared: AtomicU64,
    py_budget_spent: AtomicU64,
    py_frames_cut: AtomicU64,
    names_cut: AtomicU64,
    unwind_refused: AtomicU64,
    namer_failed: AtomicU64,
    notes: Mutex<Vec<String>>,
}

/// The recorder's counts (one recording per process).
pub static STATS: Stats = Stats {
    stalled: AtomicU64::new(0),
    refused: AtomicU64::new(0),
    stuck: AtomicU64::new(0),
    fuse_skipped: AtomicU64::new(0),
    queue_full: AtomicU64::new(0),
    py_cache_cleared: AtomicU64::new(0),
    py_budget_spent: AtomicU64::new(0),
    py_frames_cut: AtomicU64::new(0),
    names_cut: AtomicU64::new(0),
    unwind_refused: AtomicU64::new(0),
    namer_failed: AtomicU64::new(0),
    notes: Mutex::new(Vec::new()),
};

/// Counts and notes made in the namer, which reads the job's CPython
/// structures, on their way to the recorder's `STATS`.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Relay {
    pub fuse_skipped: u64,
    pub py_cache_cleared: u64,
    pub py_budget_spent: u64,
    pub notes: Vec<String>,
}

/// What a count is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// A read skipped: the memory or file lies on FUSE.
    FuseSkipped,
    /// A request to read a process's identity dropped: its queue was full.
    QueueFull,
    /// A process's cache of CPython code objects cleared: it was full.
    PyCacheCleared,
    /// A process whose CPython read budget ran out.
    PyBudgetSpent,
    /// Python frames left unnamed: a naming pass's bound was reached.
    PyFramesCut,
    /// Names of executables or cgroups not recorded: their cache was full.
    NamesCut,
    /// Files whose unwind tables were not read: over their bound, outside
    /// the file, or not ELF.
    UnwindRefused,
    /// Requests the frames' namer failed (it crashed, hung or refused):
    /// those stacks went unnamed.
    NamerFailed,
}

impl Stats {
    pub fn add(&self, what: Count, n: u64) {
        let c = match what {
            Count::FuseSkipped => &self.fuse_skipped,
            Count::QueueFull => &self.queue_full,
            Count::PyCacheCleared => &self.py_cache_cleared,
            Count::PyBudgetSpent => &self.py_budget_spent,
            Count::PyFramesCut => &self.py_frames_cut,
            Count::NamesCut => &self.names_cut,
            Count::UnwindRefused => &self.unwind_refused,
            Count::NamerFailed => &self.namer_failed,
        };
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Keeps `note` (what stalled or was skipped, and of which process)
    /// among the first few.
    pub fn note(&self, note: impl FnOnce() -> String) {
        let mut n = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        if n.len() < MAX_NOTES {
            let s = bounded(&note());
            if !n.contains(&s) {
                n.push(s);
            }
        }
    }

    /// The counts a child process made since the last call, taken out of
    /// its own `STATS` to be sent to the recorder (`absorb`).
    pub fn take_relay(&self) -> Relay {
        let t = |c: &AtomicU64| c.swap(0, Ordering::Relaxed);
        Relay {
            fuse_skipped: t(&self.fuse_skipped),
            py_cache_cleared: t(&self.py_cache_cleared),
            py_budget_spent: t(&self.py_budget_spent),
            notes: std::mem::take(&mut *self.notes.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }

    /// Adds what a child counted (`take_relay`).
    pub fn absorb(&self, r: Relay) {
        self.add(Count::FuseSkipped, r.fuse_skipped);
        self.add(Count::PyCacheCleared, r.py_cache_cleared);
        self.add(Count::PyBudgetSpent, r.py_budget_spent);
        for n in r.notes.into_iter().take(MAX_NOTES) {
            self.note(|| n);
        }
    }

    /// The counts now, as recorded.
    pub fn snapshot(&self) -> JobReads {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        JobReads {
            stalled: g(&self.stalled),
            stuck: g(&self.stuck),
            refused: g(&self.refused),
            fuse_skipped: g(&self.fuse_skipped),
            queue_full: g(&self.queue_full),
            py_cache_cleared: g(&self.py_cache_cleared),
            py_budget_spent: g(&self.py_budget_spent),
            py_frames_cut: g(&self.py_frames_cut),
            names_cut: g(&self.names_cut),
            unwind_refused: g(&self.unwind_refused),
            namer_failed: g(&self.namer_failed),
            notes: self.notes.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }
}

/// A note cut to `MAX_NOTE` bytes (at a char boundary), control
/// characters replaced: what a process chose (its paths, its names) can
/// be in it.
fn bounded(s: &str) -> String {
    let mut end = s.len().min(MAX_NOTE);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out: String = s[..end]
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if end < s.len() {
        out.push('…');
    }
    out
}

type Job = Box<dyn FnOnce() + Send>;

/// One worker thread, as handed out.
struct Worker {
    tx: SyncSender<Job>,
    /// Set when its read was abandoned; cleared when it returns.
    stuck: Arc<std::sync::atomic::AtomicBool>,
}

struct State {
    idle: Vec<Worker>,
    stuck: usize,
}

/// The workers. Clones share them.
#[derive(Clone)]
pub struct Readers {
    state: Arc<Mutex<State>>,
}

impl Default for Readers {
    fn default() -> Self {
        Readers::new()
    }
}

impl Readers {
    pub fn new() -> Readers {
        Readers {
            state: Arc::new(Mutex::new(State {
                idle: Vec::new(),
                stuck: 0,
            })),
        }
    }

    /// Workers blocked in an abandoned read now.
    pub fn stuck(&self) -> usize {
        self.lock().stuck
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on a worker and waits for it at most `deadline`. The
    /// caller must not be the thread that drains the rings: it waits.
    pub fn run<T: Send + 'static>(
        &self,
        deadline: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Stall> {
        self.run_or_late(deadline, f, drop)
    }

    /// [`Readers::run`], with the CPU time `f` took on its worker: what a
    /// paced sampler's read costs, not how long a busy machine made the
    /// caller wait for it. A read abandoned past its deadline costs
    /// nothing here.
    pub fn run_timed<T: Send + 'static>(
        &self,
        deadline: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<(T, Duration), Stall> {
        self.run(deadline, move || {
            let t = crate::util::clock::thread_cpu();
            let v = f();
            (v, crate::util::clock::thread_cpu().saturating_sub(t))
        })
    }

    /// [`Readers::run`], and where the caller gave up but `f` does end
    /// (a read that was slow, not stuck), its result goes to `late`, on
    /// the worker, instead of being lost.
    pub fn run_or_late<T: Send + 'static>(
        &self,
        deadline: Duration,
        f: impl FnOnce() -> T + Send + 'static,
        late: impl FnOnce(T) + Send + 'static,
    ) -> Result<T, Stall> {
        let worker = {
            let mut st = self.lock();
            if st.stuck >= MAX_STUCK {
                STATS.refused.fetch_add(1, Ordering::Relaxed);
                return Err(Stall::Refused(st.stuck));
            }
            match st.idle.pop() {
                Some(w) => w,
                None => {
                    drop(st);
                    self.spawn().ok_or(Stall::Failed)?
                }
            }
        };
        let (res_tx, res_rx) = mpsc::sync_channel::<T>(1);
        let back = Worker {
            tx: worker.tx.clone(),
            stuck: worker.stuck.clone(),
        };
        let state = self.state.clone();
        let job: Job = Box::new(move || {
            let r = f();
            let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
            // Under the lock, so that the caller's giving up and this
            // answer are one or the other.
            let given_up = back.stuck.swap(false, Ordering::Relaxed);
            let r = if given_up {
                st.stuck -= 1;
                STATS.stuck.fetch_sub(1, Ordering::Relaxed);
                Some(r)
            } else {
                // Room for one: never waits.
                let _ = res_tx.send(r);
                None
            };
            if st.idle.len() < MAX_IDLE {
                st.idle.push(back);
            }
            // Else its sender goes with this closure, and the thread ends.
            drop(st);
            if let Some(r) = r {
                late(r);
            }
        });
        if worker.tx.send(job).is_err() {
            return Err(Stall::Failed);
        }
        match res_rx.recv_timeout(deadline) {
            Ok(r) => Ok(r),
            Err(RecvTimeoutError::Disconnected) => Err(Stall::Failed),
            Err(RecvTimeoutError::Timeout) => {
                let mut st = self.lock();
                // It may have finished between the timeout and the lock.
                if let Ok(r) = res_rx.try_recv() {
                    return Ok(r);
                }
                worker.stuck.store(true, Ordering::Relaxed);
                st.stuck += 1;
                STATS.stuck.fetch_add(1, Ordering::Relaxed);
                STATS.stalled.fetch_add(1, Ordering::Relaxed);
                Err(Stall::TimedOut(deadline))
            }
        }
    }

    fn spawn(&self) -> Option<Worker> {
        let (tx, rx) = mpsc::sync_channel::<Job>(1);
        thread::Builder::new()
            .name("trainbpf-read".into())
            // Ends when no sender is left: neither an idle slot nor a job.
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .ok()?;
        Some(Worker {
            tx,
            stuck: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::mpsc, time::Instant};

    use super::*;

    /// A read's cost is the CPU it used on its worker: a read that waits
    /// (a sleep, as a read waiting on a busy machine) costs little, one
    /// that works costs what it worked.
    #[test]
    fn a_timed_read_costs_its_cpu_not_its_wait() {
        let r = Readers::new();
        let (v, waited) = r
            .run_timed(Duration::from_secs(60), || {
                thread::sleep(Duration::from_millis(300));
                1
            })
            .unwrap();
        assert_eq!(v, 1);
        assert!(waited < Duration::from_millis(100), "{waited:?}");
        let (_, worked) = r
            .run_timed(Duration::from_secs(60), || {
                // Until it has had 100 ms of CPU, however long that takes.
                let t = crate::util::clock::thread_cpu();
                let mut x = 0u64;
                while crate::util::clock::thread_cpu() - t < Duration::from_millis(100) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                x
            })
            .unwrap();
        assert!(worked >= Duration::from_millis(100), "{worked:?}");
    }

    #[test]
    fn a_read_comes_back_and_its_worker_is_kept() {
        let r = Readers::new();
        let me = thread::current().id();
        let there = r.run(DEADLINE, move || thread::current().id()).unwrap();
        assert_ne!(there, me, "run on another thread");
        assert_eq!(r.run(DEADLINE, || 7).unwrap(), 7);
        assert_eq!(r.lock().idle.len(), 1, "one worker, reused");
    }

    /// A read that never returns is abandoned at its deadline; past
    /// `MAX_STUCK` of them reads are refused, and one that returns frees
    /// its place.
    #[test]
    fn stuck_reads_are_abandoned_bounded_and_counted() {
        let r = Readers::new();
        let before = STATS.snapshot();
        let mut release = Vec::new();
        for _ in 0..MAX_STUCK {
            let (tx, rx) = mpsc::channel::<()>();
            release.push(tx);
            let t = Instant::now();
            let got = r.run(Duration::from_millis(50), move || rx.recv().is_ok());
            assert_eq!(got, Err(Stall::TimedOut(Duration::from_millis(50))));
            assert!(t.elapsed() < Duration::from_secs(5));
        }
        assert_eq!(r.stuck(), MAX_STUCK);
        assert_eq!(r.run(DEADLINE, || 1), Err(Stall::Refused(MAX_STUCK)));
        let after = STATS.snapshot();
        assert!(after.stalled >= before.stalled + MAX_STUCK as u64);
        assert!(after.refused > before.refused);
        // One returns: reads go again.
        release.pop().unwrap().send(()).unwrap();
        let t = Instant::now();
        while r.stuck() == MAX_STUCK {
            assert!(t.elapsed() < Duration::from_secs(5), "never came back");
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(r.run(DEADLINE, || 2), Ok(2));
        for tx in release {
            tx.send(()).unwrap();
        }
    }

    /// A read that was slow, not stuck: given up on, and its answer goes
    /// to `late` when it comes.
    #[test]
    fn a_slow_read_answers_late() {
        let r = Readers::new();
        let (go, wait) = mpsc::channel::<()>();
        let (late_tx, late_rx) = mpsc::channel::<u32>();
        let got = r.run_or_late(
            Duration::from_millis(20),
            move || {
                let _ = wait.recv();
                7
            },
            move |v| late_tx.send(v).unwrap(),
        );
        assert!(matches!(got, Err(Stall::TimedOut(_))));
        go.send(()).unwrap();
        assert_eq!(late_rx.recv_timeout(Duration::from_secs(10)), Ok(7));
        let t = Instant::now();
        while r.stuck() > 0 {
            assert!(t.elapsed() < Duration::from_secs(5));
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn notes_are_bounded_and_kept_once() {
        for _ in 0..3 {
            STATS.note(|| "pid 1: the same".into());
        }
        for i in 0..(2 * MAX_NOTES) {
            STATS.note(|| format!("pid {i}: another"));
        }
        let n = STATS.snapshot().notes;
        assert!(n.len() <= MAX_NOTES);
        assert!(n.iter().filter(|s| *s == "pid 1: the same").count() <= 1);
    }
}
