//! Who each job process is, read on a thread of its own:
//! its environment and command line live in its memory,
//! whose lock the job can make any reader wait on as long as it likes (a
//! thread of its own blocked in a read of a FUSE page that holds the lock,
//! and another waiting to take it for writing). The collector asks and
//! never waits; each read is made on a `guard` worker with a deadline, and
//! the answers are recorded when they come, under the process they name
//! (the identity carries the kernel record's time and the process's start;
//! the model takes a late one, `model/identity.rs`).

use std::{
    sync::{
        Arc,
        mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError},
    },
    thread,
    time::{Duration, Instant},
};

use trainbpf_report::decode::{ProcIdentity, ProcInfo};

use crate::record::samplers::procfs::guard::{Count, DEADLINE, Readers, STATS, Stalled};

/// Requests waiting to be read; past this a request is dropped, counted.
const MAX_QUEUED: usize = 4096;

/// What to read of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub tgid: u32,
    /// The kernel record's time: the identity is stamped with it, so that
    /// it sorts with the exec it belongs to.
    pub ts: u64,
    /// The process's start (0: the pid's current process).
    pub start_ns: u64,
    /// Its identity (at an exec, or for a process whose exec the recorder
    /// did not see); a fork's is its parent's, and none is read.
    pub identity: bool,
    /// Its command line and parent (`ProcInfo`).
    pub info: bool,
}

/// What was read; nothing where the process was gone or the read failed.
#[derive(Debug)]
pub struct Done {
    pub ts: u64,
    pub identity: Option<ProcIdentity>,
    /// Where torchelastic wants its error file (with the identity).
    pub error_file: Option<crate::record::torchelastic::Target>,
    pub info: Option<ProcInfo>,
}

pub struct Reader {
    /// `None` once the thread could not be started or is gone.
    tx: Option<SyncSender<Request>>,
    rx: Receiver<Done>,
    /// Asked and not yet answered.
    pending: usize,
    /// Woken when a read names an error file: the hold of its agent is to
    /// be attached and marked before the worker can be killed, not at the
    /// collector's next look (`ErrorFiles::know`).
    pub error_file_read: Arc<tokio::sync::Notify>,
}

impl Reader {
    pub fn start(readers: Readers) -> Reader {
        let (tx, req_rx) = mpsc::sync_channel::<Request>(MAX_QUEUED);
        let (done_tx, rx) = mpsc::sync_channel::<Done>(MAX_QUEUED);
        let wake = Arc::new(tokio::sync::Notify::new());
        let error_file_read = wake.clone();
        let spawned = thread::Builder::new()
            .name("trainbpf-identity".into())
            .spawn(move || {
                let mut stalled = Stalled::default();
                // Ends when the collector drops its sender.
                while let Ok(req) = req_rx.recv() {
                    let done = read_guarded(&readers, req, &mut stalled, &done_tx, &wake);
                    if !send(&done_tx, done, &wake) {
                        return;
                    }
                }
            });
        Reader {
            tx: spawned.ok().map(|_| tx),
            rx,
            pending: 0,
            error_file_read,
        }
    }

    /// Asks for a read; never waits. A full queue drops it, counted.
    pub fn request(&mut self, req: Request) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(req) {
            Ok(()) => self.pending += 1,
            Err(TrySendError::Full(_)) => {
                STATS.add(Count::QueueFull, 1);
                STATS.note(|| {
                    format!(
                        "pid {}: its identity and command line not read (more than {MAX_QUEUED} reads waiting)",
                        req.tgid
                    )
                });
            }
            Err(TrySendError::Disconnected(_)) => self.tx = None,
        }
    }

    /// What was read since the last time; never waits.
    pub fn poll(&mut self) -> Vec<Done> {
        let mut out = Vec::new();
        loop {
            match self.rx.try_recv() {
                Ok(d) => {
                    self.pending = self.pending.saturating_sub(1);
                    out.push(d);
                }
                Err(TryRecvError::Empty) => return out,
                Err(TryRecvError::Disconnected) => {
                    self.tx = None;
                    self.pending = 0;
                    return out;
                }
            }
        }
    }

    /// At the end: what is still being read, waited for at most `within`.
    pub fn finish(&mut self, within: Duration) -> Vec<Done> {
        let until = Instant::now() + within;
        let mut out = self.poll();
        while self.pending > 0 {
            let left = until.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(d) => {
                    self.pending -= 1;
                    out.push(d);
                }
                Err(_) => break,
            }
        }
        out
    }
}

/// Hands a read back, waking the collector if it names an error file;
/// false once the collector is gone.
fn send(done_tx: &SyncSender<Done>, done: Done, wake: &tokio::sync::Notify) -> bool {
    let named = done.error_file.is_some();
    let sent = done_tx.send(done).is_ok();
    if named {
        wake.notify_one();
    }
    sent
}

/// One request, on a worker with a deadline; a process whose read stalled
/// once is not read again.
fn read_guarded(
    readers: &Readers,
    req: Request,
    stalled: &mut Stalled<u32>,
    done: &SyncSender<Done>,
    wake: &Arc<tokio::sync::Notify>,
) -> Done {
    let nothing = Done {
        ts: req.ts,
        identity: None,
        error_file: None,
        info: None,
    };
    let what = if req.identity {
        "identity and command line"
    } else {
        "command line"
    };
    if stalled.contains(&req.tgid) {
        STATS.note(|| {
            format!(
                "pid {}: its {what} not read (an earlier read of it stalled)",
                req.tgid
            )
        });
        return nothing;
    }
    // A read that was slow rather than stuck is still recorded, when it
    // comes (under the process and time it names).
    let (late, late_wake) = (done.clone(), wake.clone());
    let r = readers.run_or_late(
        DEADLINE,
        move || read(req),
        move |d| {
            send(&late, d, &late_wake);
        },
    );
    match stalled.note(req.tgid, r) {
        Ok(d) => d,
        Err(e) => {
            STATS.note(|| format!("pid {}: its {what}: {e}", req.tgid));
            nothing
        }
    }
}

/// The reads themselves, on a `guard` worker.
pub fn read(req: Request) -> Done {
    let (identity, error_file) = if req.identity {
        match super::read_with_error_file(req.tgid, req.start_ns) {
            Some((id, ef)) => (Some(id), ef),
            None => (None, None),
        }
    } else {
        (None, None)
    };
    let info = if req.info {
        super::super::proc_info(req.tgid, identity.as_ref().map(|i| &i.vars))
    } else {
        None
    };
    Done {
        ts: req.ts,
        identity,
        error_file,
        info,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asked for its own process: answered later, on another thread, and
    /// the asking never waits.
    #[test]
    fn reads_come_back_later() {
        let mut r = Reader::start(Readers::new());
        let me = std::process::id();
        r.request(Request {
            tgid: me,
            ts: 5,
            start_ns: 7,
            identity: true,
            info: true,
        });
        r.request(Request {
            tgid: u32::MAX,
            ts: 6,
            start_ns: 0,
            identity: true,
            info: true,
        });
        let got = r.finish(Duration::from_secs(10));
        assert_eq!(got.len(), 2);
        let id = got[0].identity.as_ref().expect("own identity");
        assert_eq!((got[0].ts, id.tgid, id.start_ns), (5, me, 7));
        assert!(got[0].info.as_ref().is_some_and(|i| !i.cmdline.is_empty()));
        assert!(got[1].identity.is_none() && got[1].info.is_none());
        assert_eq!(r.pending, 0);
    }
}
