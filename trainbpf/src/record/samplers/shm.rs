//! Looks at shared memory (`samplers/shm/look.rs`) on a thread of their own: on a
//! timer, and at once when a kill or a fatal signal is seen, since the
//! objects outlive the processes and a full /dev/shm shows as a bus error.
//!
//! The thread that drains the ring buffers only pokes this one through a
//! channel and picks the answer up later; it never waits for a look. The
//! timer's interval is [`EVERY`], stretched to [`COST_TIMES`] times what the
//! last look cost in CPU time, its reads' included (a job with thousands of
//! processes and files takes longer to look at; a busy machine that makes
//! a look wait for a CPU does not), so that looking on the timer costs at most a quarter
//! of 1% of a core: the whole recorder's target on a crowded node is 1%. A
//! kill or a signal brings the next look forward, but never closer than 10
//! times a look's cost to the one before. Those early looks are paid from
//! a budget of time that grows by one [`COST_TIMES`]th of the time that
//! passes, up to [`TRIGGER_BURST`] looks' worth at the last look's cost: a
//! job's first kill is looked at as it comes, and a node where processes
//! are killed a hundred times a second (`record --all`) pays a quarter of
//! 1% of a core for them, not the tenth of a core it paid before the
//! budget. Kept as time, the budget a job saved while its looks were cheap
//! buys few of the dear ones it grows into. A big job's maps and
//! descriptors are read a slice per look (`pick.rs`), so that one look
//! costs about the same however crowded the node.

pub mod look;
pub mod pick;
mod read;

use std::{
    sync::mpsc::{self, Receiver, SyncSender, TryRecvError},
    thread,
    time::{Duration, Instant},
};

use trainbpf_report::decode::samples::{ShmLook, ShmTrigger};

use crate::util::clock::thread_cpu;
use look::ShmLooker;

/// The timer's interval while looks are cheap: an object that lives a few
/// seconds is seen.
pub const EVERY: Duration = Duration::from_secs(1);
/// The interval is at least this many times a look's cost.
const COST_TIMES: u32 = 400;
/// A triggered look follows the last one by at least this many times a
/// look's cost, and by [`MIN_GAP`].
const TRIGGER_COST_TIMES: u32 = 10;
const MIN_GAP: Duration = Duration::from_millis(20);
/// Looks brought forward that may come one after another (each still
/// [`TRIGGER_COST_TIMES`] apart) before the budget runs dry, at most.
const TRIGGER_BURST: f64 = 3.0;

/// The job's processes, and those of them whose maps and descriptors a
/// look reads (`pick.rs`).
pub struct Pids {
    pub job: Vec<u32>,
    pub scan: Vec<u32>,
}

struct Request {
    pids: Pids,
    trigger: ShmTrigger,
}

/// One finished look, stamped when it began (CLOCK_MONOTONIC ns).
pub struct Done {
    pub ts_ns: u64,
    pub look: ShmLook,
}

pub struct ShmSampler {
    /// `None` once the thread could not be started or is gone.
    tx: Option<SyncSender<Request>>,
    rx: Receiver<Done>,
    busy: bool,
    /// A kill or a signal asked for a look that has not been asked yet.
    due: Option<ShmTrigger>,
    last: Option<Instant>,
    cost: Duration,
    every: Duration,
    /// Looks that may still be brought forward, and when that was counted.
    budget: (Duration, Instant),
}

impl ShmSampler {
    pub fn start() -> ShmSampler {
        let (tx, req_rx) = mpsc::sync_channel::<Request>(1);
        let (res_tx, rx) = mpsc::sync_channel::<Done>(1);
        let spawned = thread::Builder::new()
            .name("trainbpf-shm".into())
            .spawn(move || {
                let mut looker = ShmLooker::default();
                // Ends when the collector drops its sender.
                while let Ok(req) = req_rx.recv() {
                    let ts_ns = crate::util::clock::mono_ns();
                    let started = thread_cpu();
                    let (objects, fs) = looker.look(&req.pids.job, &req.pids.scan);
                    // CPU time, this thread's and its reads' on their
                    // workers: what the look cost the machine. A read
                    // abandoned past its deadline costs nothing (a wedged
                    // job would stop the looks), and a busy machine's wait
                    // for a CPU stretches nothing (it pushed the next look
                    // seconds away, past objects that live a few seconds).
                    let cost = thread_cpu().saturating_sub(started) + looker.read_cpu;
                    let look = ShmLook {
                        objects,
                        fs,
                        trigger: req.trigger,
                        cost_us: cost.as_micros() as u64,
                        interval_ms: 0,
                    };
                    if res_tx.send(Done { ts_ns, look }).is_err() {
                        return;
                    }
                }
            });
        ShmSampler {
            tx: spawned.ok().map(|_| tx),
            rx,
            busy: false,
            due: None,
            last: None,
            cost: Duration::ZERO,
            every: EVERY,
            budget: (Duration::ZERO, Instant::now()),
        }
    }

    /// A kill or a fatal signal was seen: look as soon as allowed. A kill
    /// outranks a signal as the reason given.
    pub fn trigger(&mut self, t: ShmTrigger) {
        if self.due != Some(ShmTrigger::Kill) {
            self.due = Some(t);
        }
    }

    /// The finished look, if any (never waits), and a new one asked for
    /// when it is time; `pids` (the job's live processes) is called only
    /// then.
    pub fn tick(&mut self, pids: impl FnOnce() -> Pids) -> Option<Done> {
        let done = self.take();
        let now = Instant::now();
        self.budget = (refill(self.budget, self.cost, now), now);
        if !self.busy
            && let Some((trigger, early)) = next(
                self.last,
                self.every,
                self.cost,
                self.due,
                self.budget.0 >= self.cost,
                now,
            )
        {
            if early {
                self.budget.0 = self.budget.0.saturating_sub(self.cost);
            }
            self.ask(pids(), trigger);
        }
        done
    }

    /// At the end of the recording: the look in flight, and a last one
    /// (what the job left in /dev/shm; the look a bus error just before the
    /// end asked for), waiting up to `limit` in all.
    pub fn finish(&mut self, limit: Duration, pids: impl FnOnce() -> Pids) -> Vec<Done> {
        let until = Instant::now() + limit;
        self.due = self.due.or(Some(ShmTrigger::Timer));
        let mut out = Vec::new();
        let mut pids = Some(pids);
        while Instant::now() < until && (self.busy || self.due.is_some()) && self.tx.is_some() {
            if let Some(d) = self.take() {
                out.push(d);
            }
            if !self.busy
                && let Some(t) = self.due
                && let Some(p) = pids.take()
            {
                self.ask(p(), t);
            } else if !self.busy {
                break;
            }
            thread::sleep(Duration::from_millis(5));
        }
        out
    }

    fn ask(&mut self, pids: Pids, trigger: ShmTrigger) {
        let Some(tx) = &self.tx else { return };
        if tx.try_send(Request { pids, trigger }).is_ok() {
            self.busy = true;
            self.due = None;
            self.last = Some(Instant::now());
        }
    }

    fn take(&mut self) -> Option<Done> {
        match self.rx.try_recv() {
            Ok(mut d) => {
                self.busy = false;
                self.cost = Duration::from_micros(d.look.cost_us);
                self.every = interval(self.cost);
                d.look.interval_ms = self.every.as_millis() as u64;
                Some(d)
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

/// The timer's interval after a look that cost `cost`.
fn interval(cost: Duration) -> Duration {
    EVERY.max(cost * COST_TIMES)
}

/// The budget of early looks `(left, counted at)` at `now`: one
/// [`COST_TIMES`]th of the time since, up to [`TRIGGER_BURST`] looks at
/// `cost`. A look is early when the budget holds its cost: at the start
/// (no look's cost known), the first is.
fn refill((left, at): (Duration, Instant), cost: Duration, now: Instant) -> Duration {
    let gained = now.saturating_duration_since(at) / COST_TIMES;
    (left + gained).min(cost.mul_f64(TRIGGER_BURST))
}

/// Whether to look now, and why, and whether before the timer (a look
/// brought forward): the first look at once, then on the timer, and a due
/// trigger once far enough from the last look, if the budget has one
/// (`early_ok`).
fn next(
    last: Option<Instant>,
    every: Duration,
    cost: Duration,
    due: Option<ShmTrigger>,
    early_ok: bool,
    now: Instant,
) -> Option<(ShmTrigger, bool)> {
    let Some(last) = last else {
        return Some((due.unwrap_or_default(), false));
    };
    let since = now.saturating_duration_since(last);
    match due {
        _ if since >= every => Some((due.unwrap_or_default(), false)),
        Some(t) if early_ok && since >= MIN_GAP.max(cost * TRIGGER_COST_TIMES) => Some((t, true)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_four_hundred_times_a_looks_cost_and_at_least_a_second() {
        assert_eq!(interval(Duration::from_micros(300)), EVERY);
        assert_eq!(interval(Duration::from_millis(40)), Duration::from_secs(16));
    }

    #[test]
    fn a_kill_brings_the_next_look_forward_within_its_budget() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let cost = ms(5);
        let every = interval(cost);
        let timer = Some((ShmTrigger::Timer, false));
        // The first look at once.
        assert_eq!(next(None, every, cost, None, true, t0), timer);
        // The timer waits its interval.
        assert_eq!(next(Some(t0), every, cost, None, true, t0 + ms(400)), None);
        assert_eq!(next(Some(t0), every, cost, None, true, t0 + every), timer);
        // A bus error 60 ms after a look is looked at then (10 × 5 ms),
        // early...
        let due = Some(ShmTrigger::Signal);
        let early = Some((ShmTrigger::Signal, true));
        assert_eq!(next(Some(t0), every, cost, due, true, t0 + ms(60)), early);
        // ...but not closer than that to the last one.
        assert_eq!(next(Some(t0), every, cost, due, true, t0 + ms(30)), None);
        // On the timer, it is no early look.
        assert_eq!(
            next(Some(t0), every, cost, due, true, t0 + every),
            Some((ShmTrigger::Signal, false))
        );
        // None early with the budget dry: the timer's, with its reason.
        assert_eq!(next(Some(t0), every, cost, due, false, t0 + ms(60)), None);
        assert_eq!(
            next(Some(t0), every, cost, due, false, t0 + every),
            Some((ShmTrigger::Signal, false))
        );
        // A cheap look: 20 ms apart at least.
        let cheap = Duration::from_micros(200);
        assert_eq!(next(Some(t0), EVERY, cheap, due, true, t0 + ms(10)), None);
        assert_eq!(next(Some(t0), EVERY, cheap, due, true, t0 + ms(25)), early);
    }

    #[test]
    fn early_looks_come_from_a_budget_refilled_at_four_hundred_times_their_cost() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // A 50 ms look (a node of thousands of processes): one early look
        // more each 20 s, three at most.
        let cost = ms(50);
        let none = Duration::ZERO;
        assert_eq!(refill((none, t0), cost, t0 + ms(10_000)), ms(25));
        assert_eq!(refill((none, t0), cost, t0 + ms(20_000)), cost);
        assert_eq!(refill((ms(125), t0), cost, t0 + ms(60_000)), cost * 3);
        // What a job saved while its looks cost 1 ms buys at most three of
        // those: none of a 50 ms one.
        let saved = refill((none, t0), ms(1), t0 + ms(60_000));
        assert_eq!(saved, ms(3));
        assert!(refill((saved, t0), cost, t0) < cost);
        // A kill storm of 100 a second for 30 s: the early looks' cost.
        let (mut budget, mut last, mut spent) = ((none, t0), Some(t0), none);
        for i in 1..=3000u64 {
            let now = t0 + ms(10 * i);
            budget = (refill(budget, cost, now), now);
            let due = Some(ShmTrigger::Kill);
            if let Some((_, early)) = next(last, interval(cost), cost, due, budget.0 >= cost, now) {
                if early {
                    budget.0 -= cost;
                }
                last = Some(now);
                spent += cost;
            }
        }
        // The timer's quarter of 1% and the early looks' quarter.
        assert!(spent <= ms(30_000) / 200, "{spent:?}");
        // Without the budget it was a tenth of a core: 3 s of 30.
        assert!(spent >= ms(30_000) / 400, "{spent:?}");
    }

    fn me() -> Pids {
        let me = std::process::id();
        Pids {
            job: vec![me],
            scan: vec![me],
        }
    }

    /// The look runs on the sampler's thread and comes back stamped, with
    /// its cost and the interval it leaves.
    #[test]
    fn looks_come_back_with_their_cost() {
        let mut s = ShmSampler::start();
        assert!(s.tick(me).is_none() || !s.busy);
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = loop {
            if let Some(d) = s.tick(me) {
                break d;
            }
            assert!(Instant::now() < deadline, "the look never came back");
            thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(got.look.trigger, ShmTrigger::Timer);
        assert!(got.look.interval_ms >= 1000);
        assert!(got.ts_ns > 0);
        // A signal asks again soon, without waiting for the timer.
        s.trigger(ShmTrigger::Signal);
        let got = s.finish(Duration::from_secs(10), me);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].look.trigger, ShmTrigger::Signal);
        // And the end always gets a last look: what the job left behind.
        let got = s.finish(Duration::from_secs(10), me);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].look.trigger, ShmTrigger::Timer);
    }
}
