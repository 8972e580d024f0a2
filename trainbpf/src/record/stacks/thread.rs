//! The growth stacks' collector on a thread of its own.
//! Naming a stack reads the job: its maps, the files it maps (their
//! symbols) and its memory (its CPython state), and the job can make such
//! a read wait as long as it likes. The thread that drains the rings
//! hands this one what it needs, in order (forks, execs, exits, stacks at
//! death, a kill seen) and picks up the records it makes, never waiting
//! for them; this one makes each read on a `procfs::guard` worker with a
//! deadline, so that one process's stall does not stop the others'
//! stacks.

use std::{
    sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError},
    thread,
    time::{Duration, Instant},
};

use trainbpf_common::DeathStack;
use trainbpf_report::decode::{ProcKey, UserBody};

use super::{StackCollector, StackMaps};
use crate::record::samplers::procfs::guard::Readers;

/// How often the growth stacks are drained at most.
const STACKS_EVERY: Duration = Duration::from_millis(100);
/// Exits that bring the next drain forward (their keys are deleted after
/// it): a node where a thousand processes exit a second drains on its
/// pace, and the kernel's map (16,384 keys) never fills with the dead.
const EXITS_DUE: usize = 1024;
/// Forks, execs and exits held for the next [`Msg::Tick`] at most.
const MAX_QUEUED: usize = 4096;

/// What the draining thread tells the stacks' thread.
pub enum Msg {
    Fork {
        child: ProcKey,
        parent: ProcKey,
    },
    /// A process exec'd, at this time (the kernel record's); held by the
    /// kernel until its interpreter is looked for (`hold_root`).
    Exec(ProcKey, u64, bool),
    /// The job's root, whose holds the thread ends (`hold_root`).
    Root(super::Root),
    Exit(ProcKey),
    /// A kill: drain now, while the processes' maps are there to resolve
    /// their stacks by.
    Due,
    /// The draining thread has read the rings this far: the kernel's map
    /// may be read now. Its stacks were taken before what it has read of
    /// the rings, so each stack's exec and fork are known when it is
    /// named (a stack read ahead of its process's exec would be named
    /// with the interpreter the exec then discards).
    Tick,
    /// A stack at death waits (`Stacks::death`).
    Death,
    /// The recording ends: a last drain.
    Finish,
    /// An attached job's processes, before the kernel counts them as the
    /// job's: their interpreters are located now, so that their first
    /// stacks carry Python frames. Answered when done.
    Attach(Vec<u32>, std::sync::mpsc::Sender<()>),
    /// Forks, execs and exits held since the last message, in order, and
    /// the message that follows them: one hand-off (and one wake of the
    /// thread) per read of the rings, not one per process.
    Batch(Vec<Msg>),
}

enum Out {
    Record(u64, UserBody),
    Finished,
}

/// The stacks' thread, as the draining thread holds it.
pub struct Stacks {
    /// `None` once the thread could not be started or is gone. Unbounded:
    /// the messages are few per kernel record, and the thread never waits
    /// longer than a read's deadline.
    tx: Option<Sender<Msg>>,
    /// Forks, execs and exits not sent yet: they go with the next message,
    /// the tick that follows each read of the rings.
    queued: Vec<Msg>,
    /// `EXEC_HOLD`, until the root is named to it (`hold_root`).
    exec_hold: Option<aya::maps::HashMap<aya::maps::MapData, u32, trainbpf_common::ExecHold>>,
    /// Stacks at death, on a channel of their own: the process is on its
    /// way out, and the thread names them between two processes of a
    /// drain, not after it.
    deaths: Sender<super::death::Dying>,
    /// Whose code each forked job process runs, for its stack at death.
    family: super::family::Family,
    rx: Receiver<Out>,
}

impl Stacks {
    /// With workers of its own: its reads come one at a time, so one
    /// worker serves them all, and that worker's symbolizer keeps what it
    /// read of each process (its maps and files), which names a stack at
    /// death once the process is gone.
    pub fn start(mut maps: StackMaps) -> Stacks {
        let exec_hold = maps.exec_hold.take();
        let readers = Readers::new();
        let (tx, msgs) = mpsc::channel::<Msg>();
        let (deaths, urgent) = mpsc::channel::<super::death::Dying>();
        let (out, rx) = mpsc::channel::<Out>();
        let spawned = thread::Builder::new()
            .name("trainbpf-stacks".into())
            .spawn(move || {
                let mut c = StackCollector::new(maps, readers);
                let named = out.clone();
                c.on_death(
                    urgent,
                    Box::new(move |ts, s| {
                        let _ = named.send(Out::Record(ts, UserBody::StackAtDeath(s)));
                    }),
                );
                run(c, &msgs, &out)
            });
        Stacks {
            tx: spawned.ok().map(|_| tx),
            queued: Vec::new(),
            exec_hold,
            deaths,
            family: Default::default(),
            rx,
        }
    }

    /// A job thread's stacks at a fatal signal, to name at once (with the
    /// tick that ends this read of the rings). Never waits.
    pub fn death(&mut self, ev: DeathStack) {
        let owner = self.family.owner_of(trainbpf_report::decode::ProcKey {
            tgid: ev.hdr.tgid,
            start_ns: ev.hdr.start_ns,
        });
        // The stack itself goes now, on its own channel, where a thread
        // busy draining picks it up between two processes. The wake of an
        // idle thread rides the tick that ends this read of the rings
        // (`Collector::poll_stacks`), microseconds later: one wake per
        // read, not one per death (a node killing a hundred processes a
        // second woke it a hundred times).
        if self.deaths.send((Box::new(ev), owner)).is_ok() {
            self.queue(Msg::Death);
        }
    }

    /// Locates the interpreters of an attached job's processes, waiting
    /// `within` at most (a job's files can stall a read): before they are
    /// the job's in the kernel, so none of their stacks is taken first.
    pub fn attach(&mut self, tgids: Vec<u32>, within: Duration) {
        let (tx, rx) = std::sync::mpsc::channel();
        self.send(Msg::Attach(tgids, tx));
        let _ = rx.recv_timeout(within);
    }

    /// The job the recorder starts, `pid`, before it runs: the kernel
    /// stops it at its first execs (a wrapper's, then the interpreter's)
    /// whose file holds no interpreter the thread located before, and the
    /// thread continues it once it has looked for one, so that the job's
    /// first Python process has its frames from its first stack. Nothing
    /// is held unless the thread runs and the job's pidfd is open; one
    /// held while the recorder dies is continued by the parent-death
    /// signal the trampoline sets (SIGCONT).
    pub fn hold_root(&mut self, pid: u32) {
        const HOLDS: u32 = 3;
        if self.tx.is_none() {
            return;
        }
        let Some(mut hold) = self.exec_hold.take() else {
            return;
        };
        let Ok(fd) = crate::record::gpu::held::Pidfd::open(pid) else {
            return;
        };
        let h = trainbpf_common::ExecHold {
            left: HOLDS,
            ..Default::default()
        };
        if hold.insert(pid, h, 0).is_ok() {
            self.send(Msg::Root(super::Root::new(pid, fd, hold)));
        }
    }

    /// Never waits. What was queued goes first, with it.
    pub fn send(&mut self, m: Msg) {
        let m = if self.queued.is_empty() {
            m
        } else {
            let mut batch = std::mem::take(&mut self.queued);
            batch.push(m);
            Msg::Batch(batch)
        };
        if let Some(tx) = &self.tx
            && tx.send(m).is_err()
        {
            self.tx = None;
        }
    }

    /// A fork, an exec or an exit: sent with the next message.
    fn queue(&mut self, m: Msg) {
        if self.tx.is_none() {
            return;
        }
        self.queued.push(m);
        if self.queued.len() >= MAX_QUEUED {
            let batch = std::mem::take(&mut self.queued);
            self.send(Msg::Batch(batch));
        }
    }

    /// The records made since the last time, each with its time; never
    /// waits.
    pub fn poll(&mut self) -> Vec<(u64, UserBody)> {
        let mut out = Vec::new();
        loop {
            match self.rx.try_recv() {
                Ok(Out::Record(ts, body)) => out.push((ts, body)),
                Ok(Out::Finished) | Err(TryRecvError::Disconnected) => {
                    self.tx = None;
                    return out;
                }
                Err(TryRecvError::Empty) => return out,
            }
        }
    }

    /// At the end: a last drain, waited for at most `within`; what it
    /// made by then.
    pub fn finish(&mut self, within: Duration) -> Vec<(u64, UserBody)> {
        self.send(Msg::Finish);
        let until = Instant::now() + within;
        let mut out = Vec::new();
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Out::Record(ts, body)) => out.push((ts, body)),
                Ok(Out::Finished) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    crate::record::samplers::procfs::guard::STATS.note(|| {
                        format!(
                            "growth stacks: the last drain did not finish within {within:?}; its stacks are not recorded"
                        )
                    });
                    break;
                }
            }
        }
        self.tx = None;
        out
    }
}

/// The thread: the messages in order, and a drain at a tick each
/// `STACKS_EVERY` or more (the map's read kept to about 1% of a core), and
/// at the first tick after a kill, an exec or an exit.
fn run(mut c: StackCollector, msgs: &Receiver<Msg>, out: &Sender<Out>) {
    let mut every = STACKS_EVERY;
    let mut last = Instant::now();
    let mut due = false;
    loop {
        let Ok(first) = msgs.recv() else { return };
        c.name_deaths();
        c.poll_hold();
        let mut tick = false;
        // Everything queued, in order, before the drain.
        let queued = std::iter::once(first).chain(std::iter::from_fn(|| msgs.try_recv().ok()));
        for m in queued.flat_map(|m| match m {
            Msg::Batch(v) => v,
            m => vec![m],
        }) {
            match m {
                Msg::Fork { child, parent } => c.on_fork(child, parent),
                Msg::Exec(p, ts, held) => {
                    c.on_exec(p, ts, held);
                    due = true;
                }
                Msg::Root(r) => c.set_root(r),
                // Its keys go after the next drain, at its pace: draining
                // at each exit read the whole map a thousand times a
                // second on a busy node.
                Msg::Exit(p) => {
                    c.on_exit(p);
                    due |= c.exits_waiting() >= EXITS_DUE;
                }
                Msg::Due => due = true,
                Msg::Tick => tick = true,
                Msg::Death => c.name_deaths(),
                Msg::Attach(tgids, done) => {
                    c.locate_attached(&tgids);
                    let _ = done.send(());
                }
                Msg::Finish => {
                    drain(&mut c, out);
                    let _ = out.send(Out::Finished);
                    return;
                }
                // Flattened above; none is sent inside another.
                Msg::Batch(_) => {}
            }
        }
        if tick && (due || last.elapsed() >= every) {
            due = false;
            every = drain(&mut c, out);
            last = Instant::now();
        }
    }
}

/// Drains the kernel's totals into a record, stamped when the map is
/// read (naming a process's first stacks can take long, and a kill's
/// growers count what was recorded by shortly after it); returns when the
/// next drain is due: a stack is resolved only while its process lives,
/// so often, but the map's read (two syscalls a key) kept to about 1% of
/// a core, and never less often than once a second.
fn drain(c: &mut StackCollector, out: &Sender<Out>) -> Duration {
    c.name_deaths();
    let ts = crate::util::clock::mono_ns();
    let (sample, read) = c.drain();
    if let Some(s) = sample {
        let _ = out.send(Out::Record(ts, UserBody::Stacks(s)));
    }
    (read * 100).clamp(STACKS_EVERY, Duration::from_secs(1))
}

/// Forks, execs and exits keep the stacks' thread's view of the job's
/// processes in order with the growth stacks; a kill asks it to name what
/// it holds now.
impl crate::record::observe::Observe for Stacks {
    fn observe(&mut self, t: &trainbpf_report::decode::Timed) {
        use trainbpf_report::decode::Event;
        match &t.event {
            Event::Fork { child, parent, .. } => {
                self.family.fork(*child, *parent);
                self.queue(Msg::Fork {
                    child: *child,
                    parent: *parent,
                })
            }
            // A stack taken before an exec resolves only against the old
            // program: the thread drains at the tick that follows, to
            // narrow the window in which one is read against the new one.
            Event::Exec { proc, held, .. } => {
                self.family.gone(*proc);
                self.queue(Msg::Exec(*proc, t.ts_ns, *held))
            }
            Event::Exit { proc, .. } => {
                self.family.gone(*proc);
                self.queue(Msg::Exit(*proc))
            }
            Event::Oom(_) => self.send(Msg::Due),
            _ => {}
        }
    }
}
