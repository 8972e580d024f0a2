//! USS/PSS (`smaps_rollup`) sampling, on a thread of its own (shared
//! memory has its own, `samplers/shm.rs`). The kernel walks a process's page tables to answer `smaps_rollup`:
//! for a job with tens of GiB mapped that takes seconds, and on the thread
//! that drains the ring buffers those seconds were records lost. The
//! collector asks for a round and picks the answer up on a later tick; one
//! round at a time, so nothing queues up behind a slow one.
//!
//! The read waits on the process's memory map's lock, which the job can
//! hold as long as it likes: each read is made on a worker with a
//! deadline (`procfs::guard`), and a process whose read stalled once is
//! not read again, so that one wedged process does not end the sampling
//! of the others.

use std::{
    sync::mpsc::{self, Receiver, SyncSender, TryRecvError},
    thread,
    time::Duration,
};

use trainbpf_report::decode::samples::Smaps;

use crate::record::samplers::procfs::guard::{DEADLINE, Readers, STATS, Stalled};
use crate::util::clock::thread_cpu;

/// One round's answer.
pub struct Sampled {
    pub procs: Vec<Smaps>,
    /// CPU time the round took, its `smaps_rollup` reads' included (the
    /// kernel's walk of the page tables is most of it). A read abandoned
    /// past its deadline costs nothing here, and a busy machine's wait
    /// for a CPU stretches nothing: the rounds are paced by it.
    pub cost: Duration,
}

pub struct Sampler {
    /// `None` once the thread could not be started or is gone.
    tx: Option<SyncSender<Vec<u32>>>,
    rx: Receiver<Sampled>,
    busy: bool,
}

impl Sampler {
    pub fn start() -> Sampler {
        let (tx, req_rx) = mpsc::sync_channel::<Vec<u32>>(1);
        let (res_tx, rx) = mpsc::sync_channel::<Sampled>(1);
        let spawned = thread::Builder::new()
            .name("trainbpf-procfs".into())
            .spawn(move || {
                let (readers, mut stalled) = (Readers::new(), Stalled::default());
                // Ends when the collector drops its sender.
                while let Ok(pids) = req_rx.recv() {
                    if res_tx.send(sample(&pids, &readers, &mut stalled)).is_err() {
                        return;
                    }
                }
            });
        Sampler {
            tx: spawned.ok().map(|_| tx),
            rx,
            busy: false,
        }
    }

    /// Asks for a round over `pids`, unless one is still running. Returns
    /// whether it was asked.
    pub fn request(&mut self, pids: Vec<u32>) -> bool {
        if self.busy {
            return false;
        }
        let Some(tx) = &self.tx else { return false };
        match tx.try_send(pids) {
            Ok(()) => {
                self.busy = true;
                true
            }
            Err(_) => false,
        }
    }

    /// The finished round, if there is one; never waits.
    pub fn poll(&mut self) -> Option<Sampled> {
        match self.rx.try_recv() {
            Ok(s) => {
                self.busy = false;
                Some(s)
            }
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                self.tx = None;
                self.busy = false;
                None
            }
        }
    }
}

fn sample(pids: &[u32], readers: &Readers, stalled: &mut Stalled<u32>) -> Sampled {
    // CPU time, this thread's and the reads' on their workers: what the
    // round costs the machine, which paces the rounds.
    let started = thread_cpu();
    let mut read_cpu = Duration::ZERO;
    let mut procs = Vec::new();
    for &t in pids {
        if stalled.contains(&t) {
            continue;
        }
        let read = readers.run_timed(DEADLINE, move || crate::record::samplers::procfs::smaps(t));
        match stalled.note(t, read) {
            Ok((s, cpu)) => {
                read_cpu += cpu;
                procs.extend(s);
            }
            Err(e) => {
                STATS.note(|| format!("pid {t}: its USS and PSS (smaps_rollup): {e}"));
            }
        }
    }
    Sampled {
        procs,
        cost: thread_cpu().saturating_sub(started) + read_cpu,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// The round runs on the sampler's thread: asking never waits for it,
    /// and a second ask while one runs is refused rather than queued.
    #[test]
    fn rounds_run_off_the_callers_thread_one_at_a_time() {
        let mut s = Sampler::start();
        let me = std::process::id();
        assert!(s.request(vec![me]));
        assert!(!s.request(vec![me]), "one round at a time");
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = loop {
            if let Some(r) = s.poll() {
                break r;
            }
            assert!(Instant::now() < deadline, "the round never came back");
            thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(got.procs.len(), 1);
        assert_eq!(got.procs[0].tgid, me);
        assert!(got.procs[0].rss_kb > 0);
        assert!(s.request(vec![me]), "free again once answered");
    }
}
