//! `shm_full`: /dev/shm ran out. PyTorch's DataLoader workers hand batches
//! to the main process through files in /dev/shm; a container's is 64 MiB
//! unless it is given more, and when it fills a worker that touches a page
//! of its segment gets a bus error (SIGBUS), or a write gets ENOSPC ("No
//! space left on device"). The evidence: the job's /dev/shm as the
//! recorder's look at (or just after) the failure found it, the objects in
//! it and who made them, and the SIGBUS death.

use super::{Confidence, Diagnosis};
use crate::model::shm::{ShmFsHistory, ShmFsSample};
use crate::model::{Death, Report};
use crate::units::human_kb;

const SIGBUS: i32 = 7;
/// Used at or above this share of its size is full: tmpfs keeps a little
/// back, and a look can come a moment after the worst.
const FULL_PCT: u64 = 90;
/// A look a bus error asked for comes this soon after it.
const AFTER_NS: u64 = 2_000_000_000;
/// A look older than this says little of the moment of the error.
const STALE_NS: u64 = 30_000_000_000;
/// Docker's default /dev/shm.
const DOCKER_DEFAULT_KB: u64 = 64 << 10;
/// Processes and objects named in the evidence.
const SHOWN: usize = 3;

pub(super) fn check(r: &Report, out: &mut Vec<Diagnosis>) {
    let bus: Vec<&Death> = r
        .deaths
        .iter()
        .filter(|d| d.signal == Some(SIGBUS))
        .collect();
    let job_fs: Vec<&ShmFsHistory> = r.shm.filesystems.iter().filter(|f| f.job).collect();
    if let Some(first) = bus.first() {
        // The fullest of the job's /dev/shm as it stood at the error.
        let at = job_fs
            .iter()
            .filter_map(|f| Some((*f, f.at(first.ts_ns, AFTER_NS)?)))
            .filter(|(_, s)| s.ts_ns.saturating_add(STALE_NS) >= first.ts_ns)
            .max_by_key(|(_, s)| pct(s));
        match at {
            Some((f, s)) if full(&s) => out.push(bus_error(r, &bus, f, s)),
            // Room to spare: the bus error is something else (a file
            // truncated under a mapping, the hardware).
            Some(_) => {}
            None => out.push(unseen(r, &bus)),
        }
        return;
    }
    // No bus error: a write that got ENOSPC shows only as a full /dev/shm
    // and a job that failed.
    let Some(f) = job_fs
        .iter()
        .filter(|f| full(&f.peak))
        .max_by_key(|f| pct(&f.peak))
    else {
        return;
    };
    let crashed: Vec<&Death> = r
        .deaths
        .iter()
        .filter(|d| d.ts_ns >= f.peak.ts_ns && d.signal.is_some())
        .collect();
    let failed = r
        .job
        .as_ref()
        .and_then(|j| j.exit)
        .is_some_and(|e| !matches!(e, crate::model::ExitStatus::Code(0)));
    if !failed && crashed.is_empty() {
        return;
    }
    let mut evidence = vec![fs_line(r, f, &f.peak)];
    evidence.extend(objects(r, f));
    evidence.extend(crashed.iter().take(SHOWN).map(|d| death_line(r, d)));
    out.push(Diagnosis {
        id: "shm_full",
        confidence: Confidence::Medium,
        title: format!(
            "Shared memory ran out: /dev/shm filled up ({} of {}) and the job failed",
            human_kb(f.peak.used_kb),
            human_kb(f.peak.size_kb)
        ),
        evidence,
        fix: fixes(f.peak.size_kb),
        kill: None,
        pids: crashed.iter().map(|d| d.pid).take(16).collect(),
    });
}

fn pct(s: &ShmFsSample) -> u64 {
    s.used_kb.saturating_mul(100) / s.size_kb.max(1)
}

fn full(s: &ShmFsSample) -> bool {
    s.size_kb > 0 && pct(s) >= FULL_PCT
}

fn bus_error(r: &Report, bus: &[&Death], f: &ShmFsHistory, s: ShmFsSample) -> Diagnosis {
    let d = bus[0];
    let mut evidence = vec![fs_line(r, f, &s)];
    evidence.extend(objects(r, f));
    evidence.push(bus_line(r, bus));
    Diagnosis {
        id: "shm_full",
        confidence: Confidence::High,
        title: format!(
            "Shared memory ran out: pid {} ({}) died of a bus error with /dev/shm full ({} of {})",
            d.pid,
            d.comm,
            human_kb(s.used_kb),
            human_kb(s.size_kb)
        ),
        evidence,
        fix: fixes(s.size_kb),
        kill: None,
        pids: bus.iter().map(|d| d.pid).take(16).collect(),
    }
}

/// A bus error, and no look at the job's /dev/shm near it (a recording
/// from before the looks, or a job gone before the first).
fn unseen(r: &Report, bus: &[&Death]) -> Diagnosis {
    let d = bus[0];
    Diagnosis {
        id: "shm_full",
        confidence: Confidence::Low,
        title: format!(
            "A bus error killed pid {} ({}): a full /dev/shm is the usual cause",
            d.pid, d.comm
        ),
        evidence: vec![
            bus_line(r, bus),
            "the job's /dev/shm was not looked at near the error: its size and use are unknown"
                .into(),
        ],
        fix: {
            let mut f = vec!["check the job's /dev/shm with `df -h /dev/shm` where it runs".into()];
            f.extend(fixes(0));
            f
        },
        kill: None,
        pids: bus.iter().map(|d| d.pid).take(16).collect(),
    }
}

fn fs_line(r: &Report, f: &ShmFsHistory, s: &ShmFsSample) -> String {
    let docker = if s.size_kb <= DOCKER_DEFAULT_KB {
        " (Docker's default is 64 MiB)"
    } else {
        ""
    };
    format!(
        "the job's /dev/shm (tmpfs {}:{}): {} used of {} ({}%) at {:.1} s{docker}",
        libc::major(f.dev),
        libc::minor(f.dev),
        human_kb(s.used_kb),
        human_kb(s.size_kb),
        pct(s),
        r.since_start_s(s.ts_ns)
    )
}

fn bus_line(r: &Report, bus: &[&Death]) -> String {
    let named: Vec<String> = bus
        .iter()
        .take(SHOWN)
        .map(|d| {
            format!(
                "pid {} ({}) at {:.1} s",
                d.pid,
                d.comm,
                r.since_start_s(d.ts_ns)
            )
        })
        .collect();
    let named = named.join(", ");
    match bus.len() {
        1 => {
            let d = bus[0];
            format!(
                "pid {} ({}) died of SIGBUS (bus error) at {:.1} s",
                d.pid,
                d.comm,
                r.since_start_s(d.ts_ns)
            )
        }
        n if n <= SHOWN => format!("{n} processes died of SIGBUS (bus error): {named}"),
        n => format!(
            "{n} processes died of SIGBUS (bus error): {named} and {} more",
            n - SHOWN
        ),
    }
}

fn death_line(r: &Report, d: &Death) -> String {
    format!(
        "pid {} ({}) died of signal {} at {:.1} s",
        d.pid,
        d.comm,
        d.signal.unwrap_or(0),
        r.since_start_s(d.ts_ns)
    )
}

/// The biggest objects in that /dev/shm, with who made them.
fn objects(r: &Report, f: &ShmFsHistory) -> Vec<String> {
    let mut objs: Vec<_> = r
        .shared_memory
        .iter()
        .filter(|o| o.kind == crate::decode::ShmKind::Posix && o.dev == f.dev)
        .collect();
    objs.sort_by_key(|o| std::cmp::Reverse(o.resident_kb));
    objs.iter()
        .take(SHOWN)
        .map(|o| {
            let comm = |p: u32| {
                r.processes
                    .iter()
                    .find(|q| q.pid == p)
                    .map(|q| format!(" ({})", q.comm))
            };
            // PyTorch names its segments for the process that made them:
            // a maker that died before a look saw it is known by that.
            let by_name = torch_pid(&o.name).and_then(|p| Some((p, comm(p)?)));
            let who = match (o.owner_tgid, by_name) {
                (Some(p), _) => format!("made by pid {p}{}", comm(p).unwrap_or_default()),
                (None, Some((p, c))) => format!("made by pid {p}{c} (by its name)"),
                (None, None) => "its maker exited before a look saw it".into(),
            };
            format!(
                "{}: {} resident of {}, {who}",
                o.name,
                human_kb(o.resident_kb),
                human_kb(o.size_kb)
            )
        })
        .collect()
}

/// The pid in a PyTorch segment's name: `/dev/shm/torch_<pid>_<rest>`.
fn torch_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("/dev/shm/torch_")?;
    rest.split('_').next()?.parse().ok()
}

/// A size for `--shm-size`: four times what it was, rounded up to whole
/// GiB, at least 1 GiB.
fn bigger(size_kb: u64) -> u64 {
    (size_kb.saturating_mul(4).div_ceil(1 << 20)).max(1)
}

fn fixes(size_kb: u64) -> Vec<String> {
    let g = bigger(size_kb);
    vec![
        format!(
            "give the container a bigger /dev/shm: `docker run --shm-size={g}g ...` (or `--ipc=host`)"
        ),
        format!(
            "in Kubernetes, mount an emptyDir with `medium: Memory` and `sizeLimit: {g}Gi` at /dev/shm"
        ),
        "or need less of it: fewer DataLoader workers, a smaller `prefetch_factor`, smaller batches"
            .into(),
        "what /dev/shm holds is RAM charged to the job's memory cgroup: raise the memory limit with it"
            .into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{ShmKind, ShmObject, ShmTrigger};
    use crate::model::diagnosis::fixture::{job, process};
    use crate::model::shm::{ShmFsHistory, ShmFsSample};
    use crate::model::{Cause, Death};

    const S: u64 = 1_000_000_000;
    /// tmpfs 0:45.
    const DEV: u64 = 45;

    fn sample(ts_ns: u64, used_mib: u64, trigger: ShmTrigger) -> ShmFsSample {
        ShmFsSample {
            ts_ns,
            size_kb: 64 << 10,
            used_kb: used_mib << 10,
            trigger,
        }
    }

    /// A job whose worker 101 filled a 64 MiB /dev/shm to `used_mib` and
    /// died of SIGBUS at 20 s; a look it asked for came 50 ms later.
    fn bus_error_run(used_mib: u64) -> Report {
        let mut r = job(100, 1024);
        r.processes = vec![
            process(100, None, "python", 200),
            process(101, Some(100), "pt_data_worker", 80),
        ];
        r.deaths = vec![Death {
            pid: 101,
            start_ns: 101,
            comm: "pt_data_worker".into(),
            ts_ns: 20 * S,
            cause: Cause::Crash,
            signal: Some(SIGBUS),
            code: Some(2),
            sender: None,
            memcg: None,
            memcg_limit_kb: None,
            after: None,
        }];
        let samples = vec![
            sample(5 * S, 2, ShmTrigger::Timer),
            sample(20 * S + S / 20, used_mib, ShmTrigger::Signal),
        ];
        r.shm.filesystems = vec![ShmFsHistory {
            dev: DEV,
            job: true,
            peak: samples[1],
            last: samples[1],
            samples,
        }];
        r.shared_memory = vec![ShmObject {
            kind: ShmKind::Posix,
            name: "/dev/shm/torch_101_1".into(),
            id: 7,
            size_kb: 96 << 10,
            resident_kb: used_mib << 10,
            owner_tgid: Some(101),
            mappers: 1,
            dev: DEV,
        }];
        r
    }

    fn run(r: &Report) -> Vec<Diagnosis> {
        let mut out = Vec::new();
        check(r, &mut out);
        out
    }

    #[test]
    fn a_bus_error_with_dev_shm_full_fires() {
        let d = run(&bus_error_run(64));
        assert_eq!(d.len(), 1, "{d:#?}");
        let d = &d[0];
        assert_eq!(d.confidence, Confidence::High);
        assert_eq!(
            d.title,
            "Shared memory ran out: pid 101 (pt_data_worker) died of a bus error with /dev/shm full (64 MiB of 64 MiB)"
        );
        assert_eq!(d.pids, vec![101]);
        assert_eq!(d.kill, None);
        let ev = d.evidence.join("\n");
        assert!(ev.contains("64 MiB used of 64 MiB (100%)"), "{ev}");
        assert!(ev.contains("Docker's default is 64 MiB"), "{ev}");
        assert!(
            ev.contains(
                "/dev/shm/torch_101_1: 64 MiB resident of 96 MiB, made by pid 101 (pt_data_worker)"
            ),
            "{ev}"
        );
        assert!(ev.contains("died of SIGBUS"), "{ev}");
        assert!(d.fix[0].contains("--shm-size=1g"), "{:?}", d.fix);
        assert!(d.fix[1].contains("medium: Memory"), "{:?}", d.fix);
    }

    /// The same bus error with /dev/shm a third full: not this cause.
    #[test]
    fn a_bus_error_with_room_in_dev_shm_does_not_fire() {
        assert!(run(&bus_error_run(20)).is_empty());
    }

    /// A full /dev/shm in a job that ended well is no failure to explain;
    /// the same in one that failed (a write got ENOSPC) is.
    #[test]
    fn a_full_dev_shm_fires_only_when_the_job_failed() {
        let mut r = bus_error_run(63);
        r.deaths.clear();
        r.job.as_mut().unwrap().exit = Some(crate::model::ExitStatus::Code(0));
        assert!(run(&r).is_empty());
        r.job.as_mut().unwrap().exit = Some(crate::model::ExitStatus::Code(1));
        let d = run(&r);
        assert_eq!(d.len(), 1, "{d:#?}");
        assert_eq!(d[0].confidence, Confidence::Medium);
        assert!(d[0].title.contains("63 MiB of 64 MiB"), "{}", d[0].title);
    }

    /// A bus error in a recording without looks: said, unsure.
    #[test]
    fn a_bus_error_unseen_is_low() {
        let mut r = bus_error_run(64);
        r.shm.filesystems.clear();
        let d = run(&r);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].confidence, Confidence::Low);
    }

    /// The maker died before any look: named by the segment's name, and
    /// said so.
    #[test]
    fn a_maker_gone_before_a_look_is_named_by_the_segment_name() {
        let mut r = bus_error_run(64);
        r.shared_memory[0].owner_tgid = None;
        let ev = run(&r)[0].evidence.join("\n");
        assert!(
            ev.contains("made by pid 101 (pt_data_worker) (by its name)"),
            "{ev}"
        );
        r.shared_memory[0].name = "/dev/shm/psm_1234".into();
        let ev = run(&r)[0].evidence.join("\n");
        assert!(ev.contains("its maker exited before a look saw it"), "{ev}");
    }

    #[test]
    fn a_bigger_size() {
        assert_eq!(bigger(64 << 10), 1);
        assert_eq!(bigger(2 << 20), 8);
    }
}
