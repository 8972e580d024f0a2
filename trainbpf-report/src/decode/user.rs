//! The collector's own records (kinds 100 and up, besides the GPU's): JSON
//! bodies, one enum for all of them, encoded here and decoded here.

use serde::{Deserialize, Serialize};

use super::{
    CgroupName, Compaction, DecodeError, EbpfLog, Event, ExeName, JobExit, JobReads, JobStart,
    KIND_CGROUP, KIND_COMPACTED, KIND_EBPF_LOG, KIND_EXE, KIND_IDENTITY, KIND_JOB_EXIT,
    KIND_JOB_READS, KIND_JOB_START, KIND_LEAK_WARNING, KIND_LOST, KIND_NOTE, KIND_PRESSURE,
    KIND_PROC_INFO, KIND_SHM, KIND_SIGNAL_RECEIVED, KIND_SMAPS, KIND_STACK_AT_DEATH, KIND_STACKS,
    KIND_VERDICT, KillVerdict, LeakWarning, Lost, Pressure, ProcInfo, ShmLook, ShmObject,
    SignalReceived, SmapsSample, json,
};

/// The JSON body of a userspace record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct UserRecord {
    pub(crate) ts_ns: u64,
    pub(crate) body: UserBody,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserBody {
    JobStart(JobStart),
    JobExit(JobExit),
    Lost(Lost),
    Cgroup(CgroupName),
    Note(String),
    Exe(ExeName),
    Pressure(Box<Pressure>),
    Smaps(SmapsSample),
    ProcInfo(ProcInfo),
    /// Objects only: what recorders before the /dev/shm filesystem
    /// samples wrote (read, no longer written).
    Shm(Vec<ShmObject>),
    /// A look at shared memory: objects and filesystems (also `KIND_SHM`).
    ShmLook(ShmLook),
    Compacted(Compaction),
    LeakWarning(LeakWarning),
    SignalReceived(SignalReceived),
    Stacks(super::stacks::StackSample),
    StackAtDeath(super::stacks::StackAtDeath),
    EbpfLog(EbpfLog),
    Identity(super::ProcIdentity),
    JobReads(JobReads),
    Verdict(KillVerdict),
}

impl UserBody {
    pub(crate) fn kind(&self) -> u16 {
        match self {
            UserBody::JobStart(_) => KIND_JOB_START,
            UserBody::JobExit(_) => KIND_JOB_EXIT,
            UserBody::Lost(_) => KIND_LOST,
            UserBody::Cgroup(_) => KIND_CGROUP,
            UserBody::Note(_) => KIND_NOTE,
            UserBody::Exe(_) => KIND_EXE,
            UserBody::Pressure(_) => KIND_PRESSURE,
            UserBody::Smaps(_) => KIND_SMAPS,
            UserBody::ProcInfo(_) => KIND_PROC_INFO,
            UserBody::Shm(_) | UserBody::ShmLook(_) => KIND_SHM,
            UserBody::Compacted(_) => KIND_COMPACTED,
            UserBody::LeakWarning(_) => KIND_LEAK_WARNING,
            UserBody::SignalReceived(_) => KIND_SIGNAL_RECEIVED,
            UserBody::Stacks(_) => KIND_STACKS,
            UserBody::StackAtDeath(_) => KIND_STACK_AT_DEATH,
            UserBody::EbpfLog(_) => KIND_EBPF_LOG,
            UserBody::Identity(_) => KIND_IDENTITY,
            UserBody::JobReads(_) => KIND_JOB_READS,
            UserBody::Verdict(_) => KIND_VERDICT,
        }
    }
}

/// Encodes a userspace record (the collector's side of `decode`).
pub fn encode_user(ts_ns: u64, body: UserBody) -> (u16, Vec<u8>) {
    let kind = body.kind();
    let bytes = serde_json::to_vec(&UserRecord { ts_ns, body })
        .expect("serializing plain data cannot fail");
    (kind, bytes)
}

/// A collector record's body, checked against its kind.
pub(super) fn decode(kind: u16, bytes: &[u8]) -> Result<(u64, Event), DecodeError> {
    let w: UserRecord = json(kind, bytes)?;
    let ev = match (kind, w.body) {
        (KIND_JOB_START, UserBody::JobStart(j)) => Event::JobStart(j),
        (KIND_JOB_EXIT, UserBody::JobExit(j)) => Event::JobExit(j),
        (KIND_LOST, UserBody::Lost(l)) => Event::Lost(l),
        (KIND_CGROUP, UserBody::Cgroup(c)) => Event::Cgroup(c),
        (KIND_NOTE, UserBody::Note(n)) => Event::Note(n),
        (KIND_EXE, UserBody::Exe(x)) => Event::Exe(x),
        (KIND_PRESSURE, UserBody::Pressure(p)) => Event::Pressure(p),
        (KIND_SMAPS, UserBody::Smaps(s)) => Event::Smaps(s),
        (KIND_PROC_INFO, UserBody::ProcInfo(i)) => Event::ProcInfo(i),
        (KIND_SHM, UserBody::Shm(objects)) => Event::Shm(ShmLook {
            objects,
            ..ShmLook::default()
        }),
        (KIND_SHM, UserBody::ShmLook(l)) => Event::Shm(l),
        (KIND_COMPACTED, UserBody::Compacted(c)) => Event::Compacted(c),
        (KIND_LEAK_WARNING, UserBody::LeakWarning(w)) => Event::LeakWarning(w),
        (KIND_SIGNAL_RECEIVED, UserBody::SignalReceived(r)) => Event::SignalReceived(r),
        (KIND_STACKS, UserBody::Stacks(s)) => Event::Stacks(s),
        (KIND_STACK_AT_DEATH, UserBody::StackAtDeath(s)) => Event::StackAtDeath(s),
        (KIND_EBPF_LOG, UserBody::EbpfLog(l)) => Event::EbpfLog(l),
        (KIND_IDENTITY, UserBody::Identity(i)) => Event::Identity(i),
        (KIND_JOB_READS, UserBody::JobReads(r)) => Event::JobReads(r),
        (KIND_VERDICT, UserBody::Verdict(v)) => Event::Verdict(v),
        _ => {
            return Err(DecodeError::Json {
                kind,
                msg: "body does not match the record kind".into(),
            });
        }
    };
    Ok((w.ts_ns, ev))
}
