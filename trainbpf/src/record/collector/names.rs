//! Names the collector writes beside the kernel's records, read while the
//! process or cgroup still exists: a cgroup's path, a signal sender's
//! executable, and who a job process is (rank, run, Slurm step,
//! container) at its exec.

use std::fs;

use super::{Collector, IdentityVars, MAX_JOB_PROCS};
use crate::decode::{self, CgroupName, UserBody};
use crate::job;
use crate::record::mono_ns;
use trainbpf_common as common;

impl Collector {
    /// Names a cgroup id once, while the directory still exists.
    pub(super) fn name_cgroup(&mut self, id: u64) {
        if id == 0 || !self.known_cgroups.insert(id) {
            return;
        }
        if let Some(path) = job::cgroup_path_by_id(id) {
            self.user(UserBody::Cgroup(CgroupName { id, path }));
        }
    }

    /// Records who a process is (rank, run, Slurm step, container) at its
    /// exec, and at the first record of one whose exec the recorder did
    /// not see. A fork is its parent until it execs: the model passes the
    /// parent's on, and nothing is read. Stamped with the kernel record's
    /// time, so that it sorts with the exec it belongs to. Returns the
    /// variables read, for the command line's record.
    pub(super) fn identify(&mut self, kind: u16, bytes: &[u8], tgid: u32) -> Option<IdentityVars> {
        let exec = kind == common::KIND_EXEC;
        if !exec && self.identified.contains(&tgid) {
            return None;
        }
        if self.identified.len() < MAX_JOB_PROCS {
            self.identified.insert(tgid);
        }
        if kind == common::KIND_FORK || bytes.len() < size_of::<common::Header>() {
            return None;
        }
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
        self.write_identity(tgid, word(8), word(16))
    }

    /// A process found running when an attach began.
    pub(in crate::record) fn identify_running(&mut self, tgid: u32) -> Option<IdentityVars> {
        if self.identified.len() < MAX_JOB_PROCS && self.identified.insert(tgid) {
            return self.write_identity(tgid, mono_ns(), 0);
        }
        None
    }

    fn write_identity(&mut self, tgid: u32, ts: u64, start_ns: u64) -> Option<IdentityVars> {
        let id = crate::procfs::identity::read(tgid, start_ns)?;
        let vars = id.vars.clone();
        let body = UserBody::Identity(id);
        if let Some(o) = &mut self.live {
            o.live.on_user(&body);
        }
        let (kind, out) = decode::encode_user(ts, body);
        self.writer.record(kind, &out);
        Some(vars)
    }

    /// Names a signal sender's executable now: it may be gone by report
    /// time. Once per process.
    pub(super) fn name_exe(&mut self, tgid: u32) {
        if tgid == 0 || !self.known_exes.insert(tgid) {
            return;
        }
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
