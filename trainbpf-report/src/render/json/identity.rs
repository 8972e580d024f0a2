//! A process's distributed identity on `processes[]`, `kills[].victim` and
//! `kills[].growers[]` (docs/report-json.md, "Identity").

use schemars::JsonSchema;
use serde::Serialize;

use crate::model::{Report, identity};

/// Where its environment or cgroups told: null otherwise. Its fields go
/// on each view in the printed (alphabetical) key order.
#[derive(Debug, Default)]
pub(crate) struct Identity {
    /// Its container, from its cgroup paths (cgroup v1 or v2, cgroupfs or
    /// systemd driver); null outside one.
    pub container: Option<Container>,
    /// `LOCAL_RANK`, else `OMPI_COMM_WORLD_LOCAL_RANK`, `SLURM_LOCALID`.
    pub(crate) local_rank: Option<u32>,
    /// `RANK`, else `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID`,
    /// read at its exec. A process forked from a rank (a DataLoader
    /// worker) carries its rank too.
    pub rank: Option<u32>,
    /// torchrun's `TORCHELASTIC_RUN_ID`.
    pub(crate) run_id: Option<String>,
    /// `SLURM_JOB_ID`, else the job in its Slurm cgroup path.
    pub(crate) slurm_job_id: Option<u64>,
    /// `SLURM_STEP_ID`, else the step in its Slurm cgroup path (`0`,
    /// `batch`).
    pub(crate) slurm_step_id: Option<String>,
    /// `WORLD_SIZE`, else `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`,
    /// `SLURM_NTASKS`.
    pub(crate) world_size: Option<u32>,
}

/// A Docker or Podman container, or a Kubernetes pod's.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Container {
    /// The container's id (64 hex digits); null when the path stops at
    /// the pod.
    pub id: Option<String>,
    /// The pod's `POD_NAMESPACE`; null unless the pod sets it (the
    /// downward API).
    pub(crate) namespace: Option<String>,
    /// The pod's `POD_NAME`, else its `HOSTNAME` (the pod's name unless
    /// its spec sets another hostname); null outside a pod.
    pub(crate) pod_name: Option<String>,
    /// The Kubernetes pod's UID; null outside a pod.
    pub pod_uid: Option<String>,
    /// `docker`, `podman`, `containerd`, `cri-o`, or `kubernetes` for a
    /// pod whose cgroup path does not name its runtime.
    pub(crate) runtime: String,
}

impl Identity {
    pub(crate) fn of(r: &Report, pid: u32, start_ns: u64) -> Identity {
        r.identity(pid, start_ns)
            .map(Identity::new)
            .unwrap_or_default()
    }

    fn new(i: &identity::Identity) -> Identity {
        Identity {
            container: i.container.as_ref().map(|c| Container {
                id: c.id.clone(),
                namespace: c.namespace.clone(),
                pod_name: c.pod_name.clone(),
                pod_uid: c.pod_uid.clone(),
                runtime: c.runtime.clone(),
            }),
            local_rank: i.local_rank,
            rank: i.rank,
            run_id: i.run_id.clone(),
            slurm_job_id: i.slurm_job_id,
            slurm_step_id: i.slurm_step_id.clone(),
            world_size: i.world_size,
        }
    }
}
