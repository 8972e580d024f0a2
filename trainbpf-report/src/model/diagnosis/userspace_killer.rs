//! `userspace_killer`: a process outside the job, not the kernel, killed
//! it: systemd-oomd, earlyoom (or another user-space OOM daemon), a batch
//! system, or a person's `kill`.
//!
//! Without the sender, such a death reads like the kernel's OOM killer
//! (`Killed`, exit code 137, or a DataLoader "worker killed by signal"),
//! and people tune the wrong thing. The signal probe records who sent the
//! fatal signal (`model/deaths.rs`); this rule names the sender, what sets
//! it off when it is a known daemon, and how to configure it.

use std::collections::HashSet;

use super::{Confidence, Diagnosis};
use crate::model::{Cause, Death, Report, Sender};
use crate::units::human_kb;

const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;
/// The recorder's own name.
const RECORDER: &str = "trainbpf";
/// Available memory at or above this share of RAM is not a shortage a
/// memory daemon acts on by default.
const PLENTY_PCT: u64 = 25;

/// What a known killer is, what sets it off and how to configure it.
struct Killer {
    comm: &'static str,
    name: &'static str,
    trigger: &'static str,
    fix: &'static [&'static str],
    /// It acts on the machine's memory (not on time limits).
    memory: bool,
}

const KILLERS: &[Killer] = &[
    Killer {
        comm: "systemd-oomd",
        name: "systemd-oomd",
        trigger: "systemd-oomd kills a whole cgroup when its memory pressure (PSI) stays above ManagedOOMMemoryPressureLimit= (60% by default) for DefaultMemoryPressureDurationSec= (20 s), or, with ManagedOOMSwap=kill, when swap use passes SwapUsedLimit= (90%); it picks the monitored cgroup with the most pressure or swap",
        fix: &[
            "See what systemd-oomd monitors and its limits with `oomctl`; its defaults are in /etc/systemd/oomd.conf ([OOM] SwapUsedLimit=, DefaultMemoryPressureLimit=, DefaultMemoryPressureDurationSec=)",
            "Run the job in a unit or slice with ManagedOOMPreference=avoid (or omit), or raise ManagedOOMMemoryPressureLimit= on its slice (`systemctl edit user@.service`, or `systemd-run --user -p ManagedOOMMemoryPressure=auto`); a job that thrashes is also better given a memory limit of its own (MemoryMax=) so the kernel acts on it alone",
            "Or find the growth that built the pressure (the rest of this report): oomd acts long before the kernel would",
        ],
        memory: true,
    },
    Killer {
        comm: "earlyoom",
        name: "earlyoom",
        trigger: "earlyoom sends SIGTERM to the process with the highest oom_score when both available memory and free swap fall below its thresholds (-m and -s, 10% by default), and SIGKILL below half of them (5%)",
        fix: &[
            "Lower earlyoom's thresholds (-m PERCENT[,KILL_PERCENT] and -s PERCENT[,KILL_PERCENT], in EARLYOOM_ARGS of /etc/default/earlyoom), or protect the job with --avoid '(^|/)(python3?|torchrun)$' and point it at something else with --prefer",
            "earlyoom acts only when the machine is nearly out of memory: find what used it (the job's growth, or another process: the rest of this report) rather than only silencing earlyoom",
        ],
        memory: true,
    },
    Killer {
        comm: "oomd",
        name: "oomd",
        trigger: "oomd (Meta's user-space OOM killer) kills a cgroup when its plugins' rules match: memory pressure (PSI) or swap use over their thresholds",
        fix: &[
            "Adjust the ruleset in oomd's JSON configuration (/etc/oomd/oomd.json: pressure_above, swap_free thresholds, the cgroups it may kill), or exclude the job's cgroup",
        ],
        memory: true,
    },
    Killer {
        comm: "nohang",
        name: "nohang",
        trigger: "nohang kills the process with the highest badness when available memory, swap or PSI cross the thresholds in its configuration",
        fix: &[
            "Adjust the thresholds (soft_threshold_min_mem, hard_threshold_min_mem, psi_*) or add the job to the @BADNESS_ADJ_RE_NAME exceptions in /etc/nohang/nohang.conf",
        ],
        memory: true,
    },
    Killer {
        comm: "slurmstepd",
        name: "Slurm (slurmstepd)",
        trigger: "slurmstepd ends a step at its time limit (--time), on scancel, or when it exceeds its memory request where the cluster enforces it (JobAcctGatherParams=OverMemoryKill)",
        fix: &[
            "Check `sacct -j JOBID -o JobID,State,ExitCode,MaxRSS,ReqMem,Timelimit,Elapsed`: TIMEOUT needs a longer --time (or checkpoints), OUT_OF_MEMORY a larger --mem / --mem-per-gpu",
        ],
        memory: false,
    },
];

/// A person's tools: a shell's `kill`, `pkill`, a process viewer.
const INTERACTIVE: &[&str] = &[
    "kill", "pkill", "killall", "skill", "bash", "sh", "dash", "zsh", "fish", "ksh", "tcsh",
    "htop", "top", "btop", "atop", "glances",
];

pub(super) fn check(report: &Report, out: &mut Vec<Diagnosis>) {
    let job: HashSet<u32> = report.processes.iter().map(|p| p.pid).collect();
    let root = report.job.as_ref().map(|j| j.pid);
    // One diagnosis per sender, in the order of its first kill.
    let mut senders: Vec<(&Sender, Vec<&Death>)> = Vec::new();
    for d in &report.deaths {
        let Some(s) = outside_sender(d, &job) else {
            continue;
        };
        match senders
            .iter_mut()
            .find(|(o, _)| o.pid == s.pid && o.comm == s.comm)
        {
            Some((_, v)) => v.push(d),
            None => senders.push((s, vec![d])),
        }
    }
    for (s, deaths) in senders {
        out.push(diagnose(report, s, &deaths, root));
    }
}

/// The sender of a fatal SIGKILL or SIGTERM from outside the job, if that
/// is how `d` died. A Ctrl-C (a terminal) and the job's own processes
/// (a DataLoader stopping its workers) are not killers.
fn outside_sender<'a>(d: &'a Death, job: &HashSet<u32>) -> Option<&'a Sender> {
    if d.cause != Cause::Signal || !matches!(d.signal, Some(SIGKILL | SIGTERM)) {
        return None;
    }
    let s = d.sender.as_ref()?;
    // The recorder itself SIGKILLs what is left of its job when it is
    // stopped: cleaning up, not a killer.
    let recorder = s.comm == RECORDER || exe_name(s) == Some(RECORDER);
    (s.terminal.is_none() && s.pid != 0 && !job.contains(&s.pid) && !recorder).then_some(s)
}

fn exe_name(s: &Sender) -> Option<&str> {
    s.exe.as_deref().and_then(|e| e.rsplit('/').next())
}

fn known(s: &Sender) -> Option<&'static Killer> {
    KILLERS
        .iter()
        .find(|k| s.comm == k.comm || exe_name(s) == Some(k.comm))
}

fn who(s: &Sender) -> String {
    let uid = s.uid.map(|u| format!(", uid {u}")).unwrap_or_default();
    let exe = s
        .exe
        .as_deref()
        .filter(|e| exe_name(s) != Some(s.comm.as_str()) || !e.contains('/'))
        .map(|e| format!(", {e}"))
        .unwrap_or_default();
    format!("{} (pid {}{uid}{exe})", s.comm, s.pid)
}

fn signame(sig: Option<i32>) -> &'static str {
    match sig {
        Some(SIGKILL) => "SIGKILL",
        Some(SIGTERM) => "SIGTERM",
        _ => "a signal",
    }
}

fn diagnose(report: &Report, s: &Sender, deaths: &[&Death], root: Option<u32>) -> Diagnosis {
    let first = deaths[0];
    let ended_job = deaths.iter().any(|d| Some(d.pid) == root);
    let victims = if ended_job {
        "the job".to_string()
    } else if deaths.len() == 1 {
        format!("{} (pid {})", first.comm, first.pid)
    } else {
        format!("{} job processes", deaths.len())
    };
    let mut evidence: Vec<String> = deaths
        .iter()
        .take(8)
        .map(|d| {
            format!(
                "At {:.1} s {} sent {} to {} (pid {}){}",
                report.since_start_s(d.ts_ns),
                who(s),
                signame(d.signal),
                d.comm,
                d.pid,
                if Some(d.pid) == root {
                    ", the job's root"
                } else {
                    ""
                }
            )
        })
        .collect();
    if deaths.len() > 8 {
        evidence.push(format!("… and {} more", deaths.len() - 8));
    }
    if let Some(by) = s.forwarded_by {
        evidence.push(format!(
            "The recorder (pid {by}) received the signal from it and passed it on to the job"
        ));
    }
    evidence.push(
        "The kernel's OOM killer did not kill these processes: no OOM kill of them was recorded"
            .into(),
    );
    let mem = memory_then(report, first.ts_ns);
    let plenty = mem
        .as_ref()
        .is_some_and(|m| m.1.is_some_and(|p| p >= PLENTY_PCT));
    evidence.extend(mem.map(|m| m.0));
    let (confidence, title, fix) = match known(s) {
        Some(k) => {
            evidence.insert(0, format!("Its trigger: {}", k.trigger));
            if plenty && k.memory {
                evidence.push(format!(
                    "Memory was not short then: its thresholds (or a brief spike between samples) set it off, or it was asked to kill; check {}'s log (journalctl -u {})",
                    k.name, k.comm
                ));
            }
            (
                Confidence::High,
                format!(
                    "{} killed {victims}, not the kernel: {} from {}",
                    k.name,
                    signame(first.signal),
                    who(s)
                ),
                k.fix.iter().map(|f| f.to_string()).collect(),
            )
        }
        None if INTERACTIVE.contains(&s.comm.as_str()) => (
            if ended_job {
                Confidence::High
            } else {
                Confidence::Medium
            },
            format!(
                "A person's kill ended {victims}, not the kernel: {} from {}",
                signame(first.signal),
                who(s)
            ),
            vec![
                format!(
                    "Ask who runs as uid {} on this machine (`last`, the shell history of that user, an admin's cleanup script): the memory figures here show whether the job was about to run out anyway",
                    s.uid.map_or("?".into(), |u| u.to_string())
                ),
                "To stop a job cleanly, send SIGINT or SIGTERM and let it save a checkpoint; SIGKILL leaves no traceback and no checkpoint".into(),
            ],
        ),
        None => (
            if ended_job {
                Confidence::High
            } else {
                Confidence::Medium
            },
            format!(
                "A process outside the job killed {victims}, not the kernel: {} from {}",
                signame(first.signal),
                who(s)
            ),
            vec![
                format!(
                    "Find what {} is and why it signals the job (its configuration, a watchdog or scheduler policy); it is not the kernel's OOM killer, so raising memory limits will not stop it",
                    s.comm
                ),
            ],
        ),
    };
    let mut pids: Vec<u32> = deaths.iter().map(|d| d.pid).collect();
    pids.dedup();
    Diagnosis {
        id: "userspace_killer",
        confidence,
        title,
        evidence,
        fix,
        kill: None,
        pids,
    }
}

/// The machine's available memory just before `ts`, from the charted
/// samples, against RAM and swap: what a user-space OOM daemon reads.
fn memory_then(report: &Report, ts: u64) -> Option<(String, Option<u64>)> {
    let s = &report.series;
    let from = ts.saturating_sub(5_000_000_000);
    let avail = s
        .mem_available
        .points(&s.grid)
        .filter(|(t, _)| *t <= ts && *t + s.grid.width_ns >= from)
        .map(|(_, b)| b.min_kb)
        .min()?;
    let total = s
        .mem_total_kb
        .filter(|t| *t > 0)
        .unwrap_or(report.header.mem_total_kb);
    let pct = (avail * 100).checked_div(total);
    let of_ram = pct
        .map(|p| format!(" ({p}% of {} RAM)", human_kb(total)))
        .unwrap_or_default();
    let swap = if report.header.swap_total_kb == 0 {
        "; no swap".to_string()
    } else {
        format!("; {} swap", human_kb(report.header.swap_total_kb))
    };
    Some((
        format!(
            "The machine's available memory just before: {}{of_ram}{swap}",
            human_kb(avail)
        ),
        pct,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::diagnosis::fixture::{job, process};

    fn death(pid: u32, comm: &str, sig: i32, sender: Option<(u32, &str, u32)>) -> Death {
        Death {
            pid,
            start_ns: pid as u64,
            comm: comm.into(),
            ts_ns: 30_000_000_000,
            cause: Cause::Signal,
            signal: Some(sig),
            code: Some(0),
            sender: sender.map(|(pid, comm, uid)| Sender {
                pid,
                comm: comm.into(),
                exe: None,
                uid: Some(uid),
                terminal: None,
                forwarded_by: None,
            }),
            memcg: None,
            memcg_limit_kb: None,
            after: None,
        }
    }

    fn report(deaths: Vec<Death>) -> Report {
        let mut r = job(100, 512);
        r.processes = vec![
            process(100, None, "python", 300),
            process(101, Some(100), "pt_data_worker", 100),
        ];
        r.deaths = deaths;
        r
    }

    fn run(r: &Report) -> Vec<Diagnosis> {
        let mut v = Vec::new();
        check(r, &mut v);
        v
    }

    #[test]
    fn earlyoom_is_named_with_its_trigger_and_its_options() {
        let r = report(vec![death(100, "python", 9, Some((555, "earlyoom", 0)))]);
        let d = run(&r);
        assert_eq!(d.len(), 1);
        let d = &d[0];
        assert_eq!((d.confidence, d.kill), (Confidence::High, None));
        assert_eq!(
            d.title,
            "earlyoom killed the job, not the kernel: SIGKILL from earlyoom (pid 555, uid 0)"
        );
        assert!(d.evidence[0].contains("-m and -s, 10% by default"));
        assert!(
            d.evidence
                .iter()
                .any(|e| e.contains("to python (pid 100), the job's root"))
        );
        assert!(d.fix[0].contains("--avoid"));
        assert_eq!(d.pids, vec![100]);
    }

    #[test]
    fn systemd_oomd_by_its_executable_and_a_persons_kill_by_uid() {
        let mut dd = death(101, "pt_data_worker", 9, Some((44, "sd-oomd", 0)));
        dd.sender.as_mut().unwrap().exe = Some("/usr/lib/systemd/systemd-oomd".into());
        let d = run(&report(vec![dd]));
        assert!(
            d[0].title
                .starts_with("systemd-oomd killed pt_data_worker (pid 101)"),
            "{}",
            d[0].title
        );
        assert!(d[0].fix.iter().any(|f| f.contains("ManagedOOM")));

        let d = run(&report(vec![death(
            100,
            "python",
            15,
            Some((900, "kill", 1000)),
        )]));
        assert_eq!(
            d[0].title,
            "A person's kill ended the job, not the kernel: SIGTERM from kill (pid 900, uid 1000)"
        );
        assert!(d[0].fix[0].contains("uid 1000"));
    }

    #[test]
    fn kills_from_inside_the_job_a_terminal_the_kernel_or_the_recorder_do_not_fire() {
        // The DataLoader's parent stopping its worker.
        let inside = death(101, "pt_data_worker", 15, Some((100, "python", 0)));
        // A crash, an exit and an unknown sender.
        let mut crash = death(101, "pt_data_worker", 11, Some((900, "kill", 0)));
        crash.cause = Cause::Crash;
        let unknown = death(100, "python", 9, None);
        let mut oom = death(100, "python", 9, Some((100, "python", 0)));
        oom.cause = Cause::OomMemcg;
        let mut ctrl_c = death(100, "python", 15, Some((0, "", 1000)));
        ctrl_c.sender.as_mut().unwrap().terminal = Some(crate::decode::Terminal {
            tty: "/dev/pts/1".into(),
            session: 1,
            foreground_pgrp: 1,
        });
        let recorder = death(101, "pt_data_worker", 9, Some((50, "trainbpf", 0)));
        let r = report(vec![inside, crash, unknown, oom, ctrl_c, recorder]);
        assert!(run(&r).is_empty(), "{:#?}", run(&r));
    }

    #[test]
    fn one_sender_killing_several_processes_is_one_diagnosis() {
        let s = Some((700, "slurmstepd", 0));
        let d = run(&report(vec![
            death(101, "pt_data_worker", 9, s),
            death(100, "python", 9, s),
        ]));
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].pids, vec![101, 100]);
        assert!(d[0].title.starts_with("Slurm (slurmstepd) killed the job"));
    }
}
