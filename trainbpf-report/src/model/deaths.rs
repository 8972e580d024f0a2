//! Why each job process died: the kernel's OOM killer (global or a memory
//! cgroup), a signal from another process (with the sender), a crash signal,
//! or a plain exit. A torchrun job only shows `exitcode: -9`; the sender of
//! that SIGKILL is the difference between systemd-oomd, a person's `kill`
//! and the kernel.

use std::collections::{HashMap, VecDeque};

use crate::decode::{ExeName, ExitStatus, ProcKey, SignalReceived, SignalRecord, Terminal};

use super::{Constraint, Kill, Process};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    OomGlobal,
    OomMemcg,
    Signal,
    Crash,
    Exit,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::OomGlobal => "oom_global",
            Cause::OomMemcg => "oom_memcg",
            Cause::Signal => "signal",
            Cause::Crash => "crash",
            Cause::Exit => "exit",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sender {
    pub(crate) pid: u32,
    pub(crate) comm: String,
    /// Read from /proc by the recorder while the sender lived.
    pub(crate) exe: Option<String>,
    pub(crate) uid: Option<u32>,
    /// The signal came from this terminal (a Ctrl-C, a hangup); `pid` and
    /// `comm` are then 0 and empty: the kworker that carried it is no
    /// sender.
    pub(crate) terminal: Option<Terminal>,
    /// The recorder (this pid) passed the signal on from the sender named.
    pub(crate) forwarded_by: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Death {
    pub(crate) pid: u32,
    pub(crate) start_ns: u64,
    pub(crate) comm: String,
    pub(crate) ts_ns: u64,
    pub(crate) cause: Cause,
    pub(crate) signal: Option<i32>,
    pub(crate) code: Option<i32>,
    /// Who sent the fatal signal; for an OOM kill, the task whose
    /// allocation triggered it.
    pub(crate) sender: Option<Sender>,
    /// For OOM kills: the memory cgroup and its limit.
    pub(crate) memcg: Option<String>,
    pub(crate) memcg_limit_kb: Option<u64>,
    /// The job's first OOM kill, when this death came after it and is its
    /// consequence rather than a cause ([`consequence`]).
    pub(crate) after: Option<After>,
}

/// The OOM kill a death followed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct After {
    /// 1-based, as the report numbers its kills.
    pub(crate) kill: usize,
    /// Its victim, as the report names it (`Report::who`).
    pub(crate) victim: String,
    pub(crate) victim_pid: u32,
    /// From the kill to this death.
    pub(crate) after_ns: u64,
}

/// Whether a job process's death after the job's first OOM kill is that
/// kill's consequence, not a cause of its own: when one rank is killed,
/// torchrun's agent stops the others (SIGTERM, then SIGKILL), their
/// collectives fail or time out (an exception, an abort), and the agent
/// itself exits non-zero. The process was alive at the kill and died after
/// it, by a signal, a crash or a non-zero exit. A clean exit is no failure,
/// and a later OOM kill is a kill of its own. One rule for the report and
/// the recorder's live view.
pub fn consequence(
    cause: Cause,
    code: Option<i32>,
    born_ns: Option<u64>,
    died_ns: u64,
    kill_ns: u64,
) -> bool {
    let failed = match cause {
        Cause::Signal | Cause::Crash => true,
        Cause::Exit => code.unwrap_or(0) != 0,
        Cause::OomGlobal | Cause::OomMemcg => false,
    };
    failed && died_ns > kill_ns && born_ns.is_none_or(|b| b < kill_ns)
}

/// Signals that end a process by the process's own fault.
const CRASH_SIGNALS: [i32; 7] = [4, 5, 6, 7, 8, 11, 31];
/// Signals kept per target: the fatal one is among the last.
const PER_TARGET: usize = 8;
/// Signals the recorder received, kept: a person or a service manager
/// sends a handful.
const RECEIVED_KEPT: usize = 64;
/// `si_code` of a signal the kernel generated.
const SI_KERNEL: i32 = 0x80;
/// What a terminal sends: SIGHUP on hangup, SIGINT, SIGQUIT, SIGTSTP.
const TTY_SIGNALS: [u32; 4] = [1, 2, 3, 20];
/// How far apart the recorder's and the job's copies of one Ctrl-C can be.
const SAME_KEYSTROKE_NS: u64 = 2_000_000_000;

/// Signals sent to job processes, and the senders' executables.
#[derive(Default)]
pub(super) struct Signals {
    by_target: HashMap<ProcKey, VecDeque<(u64, SignalRecord)>>,
    exes: HashMap<u32, ExeName>,
    received: VecDeque<(u64, SignalReceived)>,
}

impl Signals {
    pub(super) fn observe(&mut self, ts: u64, rec: SignalRecord) {
        let q = self.by_target.entry(rec.target).or_default();
        if q.len() == PER_TARGET {
            q.pop_front();
        }
        q.push_back((ts, rec));
    }

    pub(super) fn observe_exe(&mut self, exe: ExeName) {
        self.exes.insert(exe.tgid, exe);
    }

    pub(super) fn observe_received(&mut self, ts: u64, r: SignalReceived) {
        if self.received.len() == RECEIVED_KEPT {
            self.received.pop_front();
        }
        self.received.push_back((ts, r));
    }

    /// The newest `sig` sent to `target` at or before `ts`, and when.
    fn last(&self, target: ProcKey, sig: i32, ts: u64) -> Option<&(u64, SignalRecord)> {
        let q = self.by_target.get(&target).or_else(|| {
            // The root's start time may be unknown (0) on one side.
            self.by_target
                .iter()
                .find(|(k, _)| k.tgid == target.tgid && (k.start_ns == 0 || target.start_ns == 0))
                .map(|(_, q)| q)
        })?;
        q.iter()
            .rev()
            .find(|(t, r)| *t <= ts && r.sig as i32 == sig)
    }

    fn sender(&self, r: &SignalRecord, ts: u64) -> Sender {
        if let Some(s) = self.forwarded(r, ts) {
            return s;
        }
        if let Some(t) = self.terminal(r, ts) {
            return Sender {
                pid: 0,
                comm: String::new(),
                exe: None,
                uid: None,
                terminal: Some(t),
                forwarded_by: None,
            };
        }
        let exe = self.exes.get(&r.sender.tgid);
        Sender {
            pid: r.sender.tgid,
            comm: r.sender.comm.clone(),
            exe: exe.map(|e| e.exe.clone()).filter(|e| !e.is_empty()),
            uid: exe.and_then(|e| e.uid).or(Some(r.sender_uid)),
            terminal: None,
            forwarded_by: None,
        }
    }

    /// The real sender of a signal the recorder passed on: the kernel saw
    /// the recorder send it; the recorder's own record (its signalfd's
    /// `ssi_pid`) and the kernel's record of the signal it received say
    /// who asked.
    fn forwarded(&self, r: &SignalRecord, ts: u64) -> Option<Sender> {
        let (_, x) = self.received.iter().rev().find(|(t, x)| {
            *t <= ts
                && x.forwarded_to.is_some()
                && x.recorder_pid == r.sender.tgid
                && x.sig == r.sig as i32
        })?;
        // The kernel's record of the signal to the recorder has the
        // sender's comm even when it exited before the recorder looked.
        let seen = self
            .by_target
            .iter()
            .filter(|(k, _)| k.tgid == x.recorder_pid)
            .flat_map(|(_, q)| q.iter())
            .filter(|(t, k)| *t <= ts && k.sig as i32 == x.sig && k.sender.tgid == x.sender_pid)
            .max_by_key(|(t, _)| *t)
            .map(|(_, k)| k);
        let comm = if x.sender_comm.is_empty() {
            seen.map(|k| k.sender.comm.clone()).unwrap_or_default()
        } else {
            x.sender_comm.clone()
        };
        let exe = Some(x.sender_exe.clone())
            .filter(|e| !e.is_empty())
            .or_else(|| {
                self.exes
                    .get(&x.sender_pid)
                    .map(|e| e.exe.clone())
                    .filter(|e| !e.is_empty())
            });
        Some(Sender {
            pid: x.sender_pid,
            comm,
            exe,
            uid: Some(x.sender_uid),
            terminal: None,
            forwarded_by: Some(x.recorder_pid),
        })
    }

    /// The terminal behind a signal the kernel generated for it (a Ctrl-C
    /// reaches the foreground group from whichever kworker ran the line
    /// discipline): from the kernel's record, else from the recorder's own
    /// copy of the same keystroke.
    fn terminal(&self, r: &SignalRecord, ts: u64) -> Option<Terminal> {
        if r.code != SI_KERNEL || !TTY_SIGNALS.contains(&r.sig) {
            return None;
        }
        if let Some(t) = &r.tty {
            return Some(t.clone());
        }
        self.received
            .iter()
            .rev()
            .find(|(t, x)| x.sig == r.sig as i32 && t.abs_diff(ts) <= SAME_KEYSTROKE_NS)
            .and_then(|(_, x)| x.terminal.clone())
    }
}

/// The cause of one process's death, or None while it lives.
pub(super) fn classify(p: &Process, kills: &[Kill], signals: &Signals) -> Option<Death> {
    let status = p.exit?;
    let key = ProcKey {
        tgid: p.pid,
        start_ns: p.start_ns,
    };
    let ts = p.died_ns.unwrap_or(0);
    let mut d = Death {
        pid: p.pid,
        start_ns: p.start_ns,
        comm: p.comm.clone(),
        ts_ns: ts,
        cause: Cause::Exit,
        signal: None,
        code: None,
        sender: None,
        memcg: None,
        memcg_limit_kb: None,
        after: None,
    };
    let sig = match status {
        ExitStatus::Code(c) => {
            d.code = Some(c);
            return Some(d);
        }
        ExitStatus::Signal(s) => s,
    };
    d.signal = Some(sig);
    let oom = kills.iter().find(|k| {
        k.victim.pid == p.pid
            && (k.victim.start_ns == p.start_ns || k.victim.start_ns == 0 || p.start_ns == 0)
    });
    if let (9, Some(k)) = (sig, oom) {
        d.cause = if k.constraint == Constraint::Memcg {
            Cause::OomMemcg
        } else {
            Cause::OomGlobal
        };
        d.memcg = k.memcg.clone();
        d.memcg_limit_kb = k.memcg_limit_kb;
        d.sender = Some(Sender {
            pid: k.trigger.tgid,
            comm: k.trigger.comm.clone(),
            exe: None,
            uid: None,
            terminal: None,
            forwarded_by: None,
        });
        return Some(d);
    }
    let sent = signals.last(key, sig, ts);
    if let Some((sent_ts, r)) = sent {
        d.code = Some(r.code);
        d.sender = Some(signals.sender(r, *sent_ts));
    }
    d.cause = if CRASH_SIGNALS.contains(&sig) {
        Cause::Crash
    } else {
        Cause::Signal
    };
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Task;

    #[test]
    fn what_follows_the_first_kill_is_its_consequence() {
        let (born, kill) = (Some(10), 100);
        // Stopped by the agent, crashed, or failed in a collective.
        assert!(consequence(Cause::Signal, None, born, 150, kill));
        assert!(consequence(Cause::Crash, None, born, 150, kill));
        assert!(consequence(Cause::Exit, Some(1), born, 150, kill));
        assert!(consequence(Cause::Exit, Some(1), None, 150, kill));
        // Not: a clean exit, a kill of its own, anything before the kill,
        // a process started after it (a restarted worker).
        assert!(!consequence(Cause::Exit, Some(0), born, 150, kill));
        assert!(!consequence(Cause::OomMemcg, None, born, 150, kill));
        assert!(!consequence(Cause::Signal, None, born, 90, kill));
        assert!(!consequence(Cause::Signal, None, Some(120), 150, kill));
    }

    fn signal(target: u32, sig: u32, code: i32, sender: (u32, &str)) -> SignalRecord {
        SignalRecord {
            target: ProcKey {
                tgid: target,
                start_ns: 1,
            },
            target_pid: target,
            comm: "job".into(),
            sig,
            code,
            result: 0,
            sender: Task {
                pid: sender.0,
                tgid: sender.0,
                comm: sender.1.into(),
            },
            sender_uid: 0,
            sender_kthread: false,
            tty: None,
        }
    }

    /// The kernel saw the recorder (800) send the SIGTERM; the recorder's
    /// own record and the kernel's record of the signal to it name the
    /// `kill` (812), which had exited before /proc could be read.
    #[test]
    fn a_forwarded_signal_names_the_original_sender() {
        let mut s = Signals::default();
        s.observe(90, signal(800, 15, 0, (812, "kill")));
        s.observe_received(
            100,
            SignalReceived {
                sig: 15,
                sender_pid: 812,
                sender_uid: 1000,
                recorder_pid: 800,
                forwarded_to: Some(900),
                ..Default::default()
            },
        );
        let fwd = signal(900, 15, 0, (800, "trainbpf"));
        let who = s.sender(&fwd, 110);
        assert_eq!((who.pid, who.comm.as_str()), (812, "kill"));
        assert_eq!((who.uid, who.forwarded_by), (Some(1000), Some(800)));
        // The same signal from someone else is not the forwarded one.
        let direct = signal(900, 15, 0, (700, "systemd"));
        assert_eq!(s.sender(&direct, 110).pid, 700);
    }

    /// A Ctrl-C comes from a kworker: the terminal is named instead, from
    /// the kernel's record or, without one, from the recorder's copy.
    #[test]
    fn a_ctrl_c_names_the_terminal_not_the_kworker() {
        let term = Terminal {
            tty: "/dev/pts/3".into(),
            session: 1234,
            foreground_pgrp: 1240,
        };
        let mut s = Signals::default();
        let mut rec = signal(900, 2, SI_KERNEL, (55, "kworker/u8:1"));
        rec.sender_kthread = true;
        rec.tty = Some(term.clone());
        let who = s.sender(&rec, 100);
        assert_eq!((who.pid, who.terminal.as_ref()), (0, Some(&term)));

        rec.tty = None;
        s.observe_received(
            99,
            SignalReceived {
                sig: 2,
                code: SI_KERNEL,
                recorder_pid: 800,
                terminal: Some(term.clone()),
                ..Default::default()
            },
        );
        assert_eq!(s.sender(&rec, 100).terminal, Some(term));
        // A SIGKILL the kernel sent (not a terminal's) keeps its sender.
        let kill = signal(900, 9, SI_KERNEL, (55, "kworker/u8:1"));
        assert_eq!(s.sender(&kill, 100).pid, 55);
    }
}
