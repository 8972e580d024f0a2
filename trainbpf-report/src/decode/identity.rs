//! A process's distributed identity as the recorder read it at its exec
//! (or when it first saw a process that was running before it): the few
//! environment variables that name a rank, a run or a Slurm step, and its
//! cgroup paths. Raw facts, bounded by the collector; the model reads them
//! (`model/identity.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The environment variables the recorder keeps, and no other: an
/// environment also holds tokens and passwords, which never reach a
/// recording.
pub const IDENTITY_VARS: &[&str] = &[
    // torchrun (and most launchers that copy its conventions).
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    // Slurm.
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    // Open MPI and MPICH/Intel MPI (PMI).
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    // Kubernetes: the pod's hostname is its name unless the spec sets
    // another; POD_NAME and POD_NAMESPACE are the downward API's usual
    // names.
    "HOSTNAME",
    "POD_NAME",
    "POD_NAMESPACE",
];

/// The longest value kept, bytes: every value named above is short.
pub const MAX_VAR_BYTES: usize = 128;
/// The most cgroup paths kept (one per hierarchy), and their length.
pub const MAX_CGROUPS: usize = 16;
pub const MAX_CGROUP_BYTES: usize = 512;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcIdentity {
    pub tgid: u32,
    /// The process's start time (the exec's record); 0: match by pid.
    #[serde(default)]
    pub start_ns: u64,
    /// Only names in [`IDENTITY_VARS`], each value at most
    /// [`MAX_VAR_BYTES`].
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    /// The paths of /proc/PID/cgroup, each once, in the file's order.
    #[serde(default)]
    pub cgroups: Vec<String>,
}
