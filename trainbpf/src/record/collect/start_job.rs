//! The job's start: spawned and held until its start is recorded,
//! or the processes of an attached one taken in, and the recording's
//! record of it.

use std::{ffi::OsString, fs, io, time::Duration};

use trainbpf_report::decode::{CgroupName, JobStart, UserBody};

use super::{Attached, JobMap};
use crate::{
    record::{
        collector::Collector,
        error::RecordError,
        job::{self, MemCgroup},
        options::Target,
    },
    util::invoker::Invoker,
};

/// An attached job's interpreters, located before its processes are the
/// job's in the kernel: a stack taken in its first second already carries
/// its Python frames. A job whose files stall is waited for 2 s at most.
fn locate_attached(c: &mut Collector, procs: &[u32]) {
    if let Some(st) = &mut c.stacks {
        st.attach(procs.to_vec(), Duration::from_secs(2));
    }
}

/// Adds a process to the kernel's job map, whose members the probes record.
pub(super) fn seed(job: &mut JobMap, pid: u32) -> Result<(), RecordError> {
    job.insert(pid, 1, 0).map_err(|e| RecordError::Io {
        what: "adding the job to the kernel's job map".into(),
        source: io::Error::other(e.to_string()),
    })
}

/// Starts the job, or takes in the processes of the attached one, and
/// writes the job's start; returns its main process (0 for `--cgroup` and
/// `--all`) and, for a spawned job, the child to wait for.
pub(super) fn start_job(
    c: &mut Collector,
    job: &mut JobMap,
    target: &Target,
    attached: &Attached,
    invoker: &Invoker,
    job_adj: i32,
    cgroup: Option<&MemCgroup>,
) -> Result<(u32, Option<tokio::process::Child>), RecordError> {
    let job_memcg = c.job_memcg.clone();
    let (pid, argv, pending) = match target {
        Target::Run(argv) => {
            let pending = job::spawn(argv, job_adj)?;
            seed(job, pending.pid)?;
            if let Some(st) = &mut c.stacks {
                st.hold_root(pending.pid);
            }
            (pending.pid, argv.clone(), Some(pending))
        }
        Target::Pid(p) => {
            // The process and every descendant alive now; the kernel adds
            // those born from here on.
            let procs: Vec<u32> = crate::record::samplers::procfs::descendants(*p)
                .into_iter()
                .filter(|&t| attached.watcher.may_watch(t))
                .collect();
            locate_attached(c, &procs);
            for t in procs {
                seed(job, t)?;
                c.job.insert(t);
                c.identify_running(t, true);
            }
            // Its memory may be wedged (`procfs::guard`): read with a
            // deadline, before the rings are drained at all.
            let p = *p;
            let argv = c
                .readers
                .run(
                    crate::record::samplers::procfs::guard::DEADLINE,
                    move || crate::record::samplers::procfs::proc_info(p, None),
                )
                .ok()
                .flatten()
                .map(|i| i.cmdline.into_iter().map(OsString::from).collect())
                .unwrap_or_default();
            (p, argv, None)
        }
        Target::Cgroup(_) => {
            let procs = attached.procs();
            locate_attached(c, &procs);
            for t in procs {
                seed(job, t)?;
                c.job.insert(t);
                c.identify_running(t, false);
            }
            (0, Vec::new(), None)
        }
        Target::All => (0, Vec::new(), None),
    };
    if let Some(cg) = cgroup {
        cg.add(pid)?;
        c.known_cgroups.insert(cg.id());
        let (id, path) = (cg.id(), cg.rel.clone());
        c.user(UserBody::Cgroup(CgroupName { id, path }));
    }
    c.poll_pressure();
    c.user(UserBody::JobStart(JobStart {
        pid,
        // The kernel's start time isn't visible from here; the report
        // matches the root by pid from this record on.
        start_ns: 0,
        argv: argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default(),
        uid: invoker.uid,
        gid: invoker.gid,
        cgroup: match (&target, &job_memcg) {
            (_, Some((_, rel, _))) => Some(rel.clone()),
            (Target::Cgroup(dir), None) => Some(dir.display().to_string()),
            _ => None,
        },
        memory_limit_bytes: job_memcg.as_ref().and_then(|(dir, _, v2)| {
            let f = if *v2 {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            };
            fs::read_to_string(dir.join(f)).ok()?.trim().parse().ok()
        }),
        attached: match target {
            Target::Run(_) => None,
            Target::Pid(_) => Some("pid".into()),
            Target::Cgroup(_) => Some("cgroup".into()),
            Target::All => Some("all".into()),
        },
        target: match target {
            Target::Cgroup(dir) => Some(dir.display().to_string()),
            _ => None,
        },
    }));
    if pid != 0 {
        c.job.insert(pid);
        c.root = pid;
    }
    c.flush()?;
    if !matches!(target, Target::Run(_)) {
        eprintln!("trainbpf: attached; Ctrl-C detaches and leaves the job running");
    }
    let child = match pending {
        Some(p) => Some(p.release()?),
        None => None,
    };
    Ok((pid, child))
}
