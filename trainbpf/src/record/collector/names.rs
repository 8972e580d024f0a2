//! Names the collector writes beside the kernel's records, read while the
//! process or cgroup still exists: a cgroup's path, a signal sender's
//! executable, and who a job process is (rank, run, Slurm step,
//! container) at its exec.

use std::{fs, time::Duration};

use trainbpf_report::decode::{self, CgroupName, UserBody};

use super::{Collector, MAX_JOB_PROCS};
use crate::record::job;
use crate::record::samplers::procfs::{
    guard::{Count, STATS},
    identity::{Done, Request},
};
use crate::util::clock::mono_ns;

/// Which record asks who a process is: a fork (its parent's identity
/// until it execs), an exec, or the first memory record of a process the
/// recorder did not see start.
#[derive(Clone, Copy)]
pub(super) enum Ident {
    Fork,
    Exec,
    Mem,
}

impl Collector {
    /// Names a cgroup id once, while the directory still exists.
    pub(super) fn name_cgroup(&mut self, id: u64) {
        if id == 0
            || self.known_cgroups.contains(&id)
            || !may_name(self.known_cgroups.len(), "cgroup")
        {
            return;
        }
        self.known_cgroups.insert(id);
        if let Some(path) = job::cgroup_path_by_id(id) {
            self.user(UserBody::Cgroup(CgroupName { id, path }));
        }
    }

    /// Asks who a process is (rank, run, Slurm step, container) at its
    /// exec, and at the first record of one whose exec the recorder did
    /// not see; and, with `info`, its command line (at an exec). A fork is
    /// its parent until it execs: the model passes the parent's identity
    /// and command line on, and nothing is read. The reads run off this thread
    /// (`procfs::identity::Reader`) and are recorded when they come
    /// (`poll_identities`), the identity stamped with the kernel record's
    /// time, so that it sorts with the exec it belongs to.
    pub(super) fn identify(&mut self, how: Ident, proc: decode::ProcKey, ts: u64, info: bool) {
        let tgid = proc.tgid;
        let known = self.identified.contains(&tgid);
        if !known && self.identified.len() < MAX_JOB_PROCS {
            self.identified.insert(tgid);
        }
        let identity = match how {
            Ident::Fork => false,
            Ident::Exec => true,
            Ident::Mem => !known,
        };
        if !identity && !info {
            return;
        }
        self.ident.request(Request {
            tgid,
            ts,
            start_ns: proc.start_ns,
            identity,
            info,
        });
    }

    /// A process found running when an attach began: who it is, and with
    /// `info` its command line.
    pub(in crate::record) fn identify_running(&mut self, tgid: u32, info: bool) {
        if self.identified.len() < MAX_JOB_PROCS && self.identified.insert(tgid) {
            self.ident.request(Request {
                tgid,
                ts: mono_ns(),
                start_ns: 0,
                identity: true,
                info,
            });
        }
    }

    /// Records the identities and command lines read since the last time.
    pub(in crate::record) fn poll_identities(&mut self) {
        for d in self.ident.poll() {
            self.write_read(d);
        }
    }

    /// Woken when a read names torchelastic's error file
    /// (`Reader::error_file_read`).
    pub(in crate::record) fn error_file_read(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.ident.error_file_read.clone()
    }

    /// At the end: the reads still in flight, waited for briefly.
    pub(in crate::record) fn finish_identities(&mut self) {
        for d in self.ident.finish(Duration::from_secs(1)) {
            self.write_read(d);
        }
    }

    fn write_read(&mut self, d: Done) {
        if let Some(id) = d.identity {
            if let Some(ef) = &mut self.error_files {
                ef.know(id.tgid, d.error_file);
            }
            let body = UserBody::Identity(id);
            self.lines.on_user(&body);
            if let Some(o) = &mut self.live {
                o.live.on_user(&body);
            }
            let (kind, out) = decode::encode_user(d.ts, body);
            self.writer.record(kind, &out);
        }
        if let Some(info) = d.info {
            self.user(UserBody::ProcInfo(info));
        }
    }

    /// Names a signal sender's executable now: it may be gone by report
    /// time. Once per process.
    pub(super) fn name_exe(&mut self, tgid: u32) {
        if tgid == 0
            || self.known_exes.contains(&tgid)
            || !may_name(self.known_exes.len(), "executable")
        {
            return;
        }
        self.known_exes.insert(tgid);
        let exe = fs::read_link(format!("/proc/{tgid}/exe"))
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let uid = fs::read_to_string(format!("/proc/{tgid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
            });
        self.user(UserBody::Exe(decode::ExeName { tgid, exe, uid }));
    }
}

/// Whether a cache of names holding `held` has room for one more; when
/// not, the name goes unrecorded, counted (a job that signals from, or
/// allocates in, more of them than this would grow the recorder's memory
/// and the recording without end).
fn may_name(held: usize, what: &str) -> bool {
    if held < MAX_NAMES {
        return true;
    }
    STATS.add(Count::NamesCut, 1);
    STATS.note(|| format!("a {what} left unnamed: {MAX_NAMES} are named already"));
    false
}

/// Names kept per kind: signal senders' executables, cgroups.
const MAX_NAMES: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_caches_are_bounded_and_say_so() {
        assert!(may_name(MAX_NAMES - 1, "cgroup"));
        let before = STATS.snapshot().names_cut;
        assert!(!may_name(MAX_NAMES, "executable"));
        assert!(STATS.snapshot().names_cut > before);
    }
}
