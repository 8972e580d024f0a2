//! Who each process is in a distributed job: its rank, local rank and
//! world size, its run (torchrun's `TORCHELASTIC_RUN_ID`), its Slurm job
//! and step, and its container or pod. Read from the variables and cgroup
//! paths the recorder kept at each exec (`decode::ProcIdentity`); a fork
//! is its parent until it execs.

use std::collections::{HashMap, HashSet};

use crate::decode::{ProcIdentity, ProcKey};

use super::cgroup_path::{self, Origin};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// `RANK`, else `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID`.
    pub rank: Option<u32>,
    /// `LOCAL_RANK`, else `OMPI_COMM_WORLD_LOCAL_RANK`, `SLURM_LOCALID`.
    pub(crate) local_rank: Option<u32>,
    /// `WORLD_SIZE`, else `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`, `SLURM_NTASKS`.
    pub(crate) world_size: Option<u32>,
    /// torchrun's `TORCHELASTIC_RUN_ID`.
    pub(crate) run_id: Option<String>,
    /// `SLURM_JOB_ID`, else the job in a Slurm cgroup path.
    pub(crate) slurm_job_id: Option<u64>,
    /// `SLURM_STEP_ID`, else the step in the path (`0`, `batch`).
    pub(crate) slurm_step_id: Option<String>,
    pub container: Option<Container>,
    /// A process under the one that carries the rank, with the same rank
    /// (a DataLoader worker, a compiler the rank ran): of that rank, not
    /// the rank's own process.
    pub(crate) inherited: bool,
    /// The variable the rank came from: under `srun`, torchrun's agent
    /// has a `SLURM_PROCID` and its workers a `RANK` of the same number,
    /// and the workers are still ranks of their own.
    pub(crate) rank_from: Option<&'static str>,
}

const RANK_VARS: [&str; 4] = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"];

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Container {
    /// `docker`, `podman`, `containerd`, `cri-o`; `kubernetes` for a pod
    /// whose path does not name its runtime (the kubelet's cgroupfs
    /// driver).
    pub(crate) runtime: String,
    /// The container's id (64 hex digits), when the path reaches it.
    pub id: Option<String>,
    pub pod_uid: Option<String>,
    /// A pod's `POD_NAME` (the downward API's usual name), else its
    /// `HOSTNAME`, which is the pod's name unless the spec sets another.
    pub(crate) pod_name: Option<String>,
    /// A pod's `POD_NAMESPACE`: the node cannot tell it otherwise.
    pub(crate) namespace: Option<String>,
}

impl Identity {
    pub(crate) fn is_empty(&self) -> bool {
        *self
            == Identity {
                inherited: self.inherited,
                ..Identity::default()
            }
    }

    /// What the recorder read, made sense of.
    pub fn from_record(rec: &ProcIdentity) -> Identity {
        let var = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| rec.vars.get(*n).map(|v| v.trim()).filter(|v| !v.is_empty()))
        };
        let num = |names: &[&str]| var(names).and_then(|v| v.parse::<u32>().ok());
        let rank = num(&RANK_VARS);
        let rank_from = RANK_VARS
            .into_iter()
            .find(|n| var(&[n]).is_some())
            .filter(|_| rank.is_some());
        let mut id = Identity {
            rank,
            rank_from,
            local_rank: num(&["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"]),
            world_size: num(&[
                "WORLD_SIZE",
                "OMPI_COMM_WORLD_SIZE",
                "PMI_SIZE",
                "SLURM_NTASKS",
            ]),
            run_id: var(&["TORCHELASTIC_RUN_ID"]).map(str::to_string),
            slurm_job_id: var(&["SLURM_JOB_ID"]).and_then(|v| v.parse().ok()),
            slurm_step_id: var(&["SLURM_STEP_ID"]).map(str::to_string),
            container: None,
            inherited: false,
        };
        let origins: Vec<Origin> = rec.cgroups.iter().map(|p| origin(p)).collect();
        for o in &origins {
            if let Origin::Slurm { job, step, .. } = o {
                id.slurm_job_id.get_or_insert(*job);
                if id.slurm_step_id.is_none() {
                    id.slurm_step_id.clone_from(step);
                }
            }
        }
        // A pod's container is also its runtime's: the pod wins.
        let pod = rec
            .cgroups
            .iter()
            .zip(&origins)
            .find_map(|(path, o)| match o {
                Origin::Kubernetes {
                    pod_uid,
                    container_id,
                    ..
                } if pod_uid.is_some() || container_id.is_some() => Some(Container {
                    runtime: runtime_in(path).unwrap_or("kubernetes").to_string(),
                    id: container_id.clone(),
                    pod_uid: pod_uid.clone(),
                    pod_name: var(&["POD_NAME", "HOSTNAME"]).map(str::to_string),
                    namespace: var(&["POD_NAMESPACE"]).map(str::to_string),
                }),
                _ => None,
            });
        id.container = pod.or_else(|| {
            origins.iter().find_map(|o| match o {
                Origin::Docker {
                    engine,
                    container_id,
                } => Some(Container {
                    runtime: engine.to_lowercase(),
                    id: Some(container_id.clone()),
                    ..Container::default()
                }),
                _ => None,
            })
        });
        id
    }
}

/// A cgroup path's origin, below trainbpf's own `--memory-limit` cgroup:
/// a job limited by trainbpf inside a container is still in it.
fn origin(path: &str) -> Origin {
    let mut p = path.trim_end_matches('/');
    while let Some((head, last)) = p.rsplit_once('/') {
        if !last.starts_with("trainbpf-") {
            break;
        }
        p = head;
    }
    cgroup_path::parse(p)
}

/// What a fork is given of its parent's identity.
fn inherit(p: &Identity) -> Identity {
    Identity {
        inherited: p.rank.is_some(),
        ..p.clone()
    }
}

/// The runtime a pod's container scope names (systemd driver).
fn runtime_in(path: &str) -> Option<&'static str> {
    let last = path
        .rsplit('/')
        .find(|p| !p.is_empty() && !p.starts_with("trainbpf-"))?;
    [
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("docker-", "docker"),
    ]
    .iter()
    .find(|(prefix, _)| last.starts_with(prefix))
    .map(|(_, r)| *r)
}

/// Each process's identity while the model reads the recording.
#[derive(Default)]
pub(super) struct Identities {
    by_proc: HashMap<ProcKey, Identity>,
    /// Each process's forks, and when: the recorder reads an identity off
    /// the thread that drains the rings, so its record can come after
    /// forks that followed the exec it describes, and still reaches them.
    forks: HashMap<ProcKey, Vec<(ProcKey, u64)>>,
    nforks: usize,
    /// Processes with a record of their own, which a parent's late one
    /// does not replace.
    own: HashSet<ProcKey>,
}

/// Processes whose identity is kept: a long `--all` sees many.
const MAX_IDENTITIES: usize = 65536;
/// Forks remembered for a late record.
const MAX_FORKS: usize = 65536;

impl Identities {
    fn insert(&mut self, key: ProcKey, id: Identity) {
        if self.by_proc.len() < MAX_IDENTITIES || self.by_proc.contains_key(&key) {
            self.by_proc.insert(key, id);
        }
    }

    /// A fork is its parent until it execs.
    pub(super) fn on_fork(&mut self, ts: u64, child: ProcKey, parent: ProcKey) {
        if let Some(p) = self.by_proc.get(&parent) {
            self.insert(child, inherit(p));
        }
        if self.nforks < MAX_FORKS {
            self.forks.entry(parent).or_default().push((child, ts));
            self.nforks += 1;
        }
    }

    /// What its exec said replaces what it inherited; `parent` tells a
    /// rank's own process from what runs under it. `ts`: the exec's time;
    /// the forks made since, which have not exec'd themselves, are passed
    /// it on, however late it comes.
    pub(super) fn on_record(
        &mut self,
        ts: u64,
        key: ProcKey,
        parent: Option<ProcKey>,
        rec: &ProcIdentity,
    ) {
        let mut id = Identity::from_record(rec);
        let parent = parent.and_then(|p| self.by_proc.get(&p));
        id.inherited = id.rank.is_some()
            && parent.is_some_and(|p| (p.rank, p.rank_from) == (id.rank, id.rank_from));
        if self.own.len() < MAX_IDENTITIES {
            self.own.insert(key);
        }
        self.set(key, (!id.is_empty()).then_some(id));
        self.pass_on(key, ts);
    }

    /// Tells each process with a record of its own from one under a rank
    /// that carries the same, over every fork recorded. Records come from
    /// a reader thread in no set order, and a helper's (a pyenv shim's
    /// `bash` and `readlink`, a compiler) can come before its rank's, or
    /// before its fork was known: it was then a rank of its own (a
    /// two-rank job counted four). Run once the records are in.
    pub(super) fn settle_inherited(&mut self) {
        let mut under = Vec::new();
        for (parent, kids) in &self.forks {
            let Some(p) = self.by_proc.get(parent).filter(|p| p.rank.is_some()) else {
                continue;
            };
            let same = (p.rank, p.rank_from);
            under.extend(kids.iter().map(|(c, _)| *c).filter(|c| {
                self.own.contains(c)
                    && self
                        .by_proc
                        .get(c)
                        .is_some_and(|id| (id.rank, id.rank_from) == same)
            }));
        }
        for c in under {
            if let Some(id) = self.by_proc.get_mut(&c) {
                id.inherited = true;
            }
        }
    }

    fn set(&mut self, key: ProcKey, id: Option<Identity>) {
        match id {
            Some(id) => self.insert(key, id),
            None => {
                self.by_proc.remove(&key);
            }
        }
    }

    /// Gives `from`'s identity to its forks since `since` (and theirs)
    /// that have none of their own.
    fn pass_on(&mut self, from: ProcKey, since: u64) {
        let mut work = vec![from];
        let mut steps = 0;
        while let Some(p) = work.pop() {
            let id = self.by_proc.get(&p).map(inherit);
            let kids: Vec<ProcKey> = self
                .forks
                .get(&p)
                .into_iter()
                .flatten()
                .filter(|(c, at)| *at >= since && !self.own.contains(c))
                .map(|(c, _)| *c)
                .collect();
            for c in kids {
                steps += 1;
                if steps > MAX_FORKS {
                    return;
                }
                self.set(c, id.clone());
                work.push(c);
            }
        }
    }

    pub(super) fn get(&self, key: &ProcKey) -> Option<&Identity> {
        self.by_proc.get(key)
    }

    pub(super) fn finish(self) -> HashMap<ProcKey, Identity> {
        self.by_proc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f2a1b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708";
    const UID: &str = "8d3c2b1a-0f9e-4d8c-b7a6-954433221100";

    fn rec(vars: &[(&str, &str)], cgroups: &[&str]) -> ProcIdentity {
        ProcIdentity {
            tgid: 7,
            start_ns: 1,
            vars: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cgroups: cgroups.iter().map(|c| c.to_string()).collect(),
        }
    }

    fn key(tgid: u32) -> ProcKey {
        ProcKey {
            tgid,
            start_ns: u64::from(tgid) * 10,
        }
    }

    #[test]
    fn torchrun_slurm_and_mpi_variables() {
        let id = Identity::from_record(&rec(
            &[
                ("RANK", "3"),
                ("LOCAL_RANK", "1"),
                ("WORLD_SIZE", "8"),
                ("TORCHELASTIC_RUN_ID", "run-42"),
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_JOB_ID", "991"),
                ("SLURM_STEP_ID", "0"),
            ],
            &["/"],
        ));
        assert_eq!(
            (id.rank, id.local_rank, id.world_size),
            (Some(3), Some(1), Some(8)),
            "torchrun's variables win over srun's task ids"
        );
        assert_eq!(id.run_id.as_deref(), Some("run-42"));
        assert_eq!(
            (id.slurm_job_id, id.slurm_step_id.as_deref()),
            (Some(991), Some("0"))
        );
        let srun = Identity::from_record(&rec(
            &[
                ("SLURM_PROCID", "5"),
                ("SLURM_LOCALID", "1"),
                ("SLURM_NTASKS", "16"),
            ],
            &["/slurm/uid_1000/job_77/step_batch"],
        ));
        assert_eq!(
            (srun.rank, srun.local_rank, srun.world_size),
            (Some(5), Some(1), Some(16))
        );
        assert_eq!(
            (srun.slurm_job_id, srun.slurm_step_id.as_deref()),
            (Some(77), Some("batch"))
        );
        let mpi = Identity::from_record(&rec(
            &[
                ("OMPI_COMM_WORLD_RANK", "2"),
                ("OMPI_COMM_WORLD_SIZE", "4"),
                ("RANK", ""),
            ],
            &[],
        ));
        assert_eq!(
            (mpi.rank, mpi.world_size),
            (Some(2), Some(4)),
            "an empty RANK is none"
        );
        // Garbage is no rank.
        let bad = Identity::from_record(&rec(&[("RANK", "-1"), ("WORLD_SIZE", "x")], &[]));
        assert!(bad.is_empty(), "{bad:?}");
    }

    #[test]
    fn pods_and_containers_from_cgroups() {
        let pod = Identity::from_record(&rec(
            &[("HOSTNAME", "trainer-0"), ("POD_NAMESPACE", "ml")],
            &["/user.slice", &format!("/kubepods/burstable/pod{UID}/{ID}")],
        ));
        assert_eq!(
            pod.container,
            Some(Container {
                runtime: "kubernetes".into(),
                id: Some(ID.into()),
                pod_uid: Some(UID.into()),
                pod_name: Some("trainer-0".into()),
                namespace: Some("ml".into()),
            })
        );
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope/trainbpf-9-0123456789abcdef",
            UID.replace('-', "_")
        );
        let c = Identity::from_record(&rec(&[("POD_NAME", "p")], &[&systemd]))
            .container
            .unwrap();
        assert_eq!(
            (c.runtime.as_str(), c.pod_uid.as_deref()),
            ("containerd", Some(UID))
        );
        assert_eq!(c.pod_name.as_deref(), Some("p"));
        let docker = Identity::from_record(&rec(
            &[("HOSTNAME", "3f2a1b4c5d6e")],
            &[&format!("/system.slice/docker-{ID}.scope")],
        ));
        let c = docker.container.unwrap();
        assert_eq!(
            (c.runtime.as_str(), c.id.as_deref(), c.pod_name),
            ("docker", Some(ID), None)
        );
        assert!(Identity::from_record(&rec(&[], &["/user.slice/user-1000.slice"])).is_empty());
    }

    #[test]
    fn forks_inherit_until_their_exec_says_otherwise() {
        let mut ids = Identities::default();
        let (launcher, rank1, worker, helper) = (key(1), key(2), key(3), key(4));
        // torchrun's agent has no rank; its worker execs with one.
        ids.on_record(
            0,
            launcher,
            None,
            &rec(&[("TORCHELASTIC_RUN_ID", "r")], &[]),
        );
        ids.on_fork(0, rank1, launcher);
        assert_eq!(ids.get(&rank1).unwrap().rank, None);
        ids.on_record(
            0,
            rank1,
            Some(launcher),
            &rec(&[("RANK", "1"), ("WORLD_SIZE", "2")], &[]),
        );
        let own = ids.get(&rank1).unwrap();
        assert_eq!(
            (own.rank, own.inherited, own.run_id.as_deref()),
            (Some(1), false, None)
        );
        // A DataLoader worker: forked, never exec'd.
        ids.on_fork(0, worker, rank1);
        let w = ids.get(&worker).unwrap();
        assert_eq!(
            (w.rank, w.world_size, w.inherited),
            (Some(1), Some(2), true)
        );
        // A helper that execs with the same environment is of rank 1 too;
        // one that execs with a clean environment is no rank's.
        ids.on_fork(0, helper, rank1);
        ids.on_record(0, helper, Some(rank1), &rec(&[("RANK", "1")], &[]));
        assert!(ids.get(&helper).unwrap().inherited);
        ids.on_record(0, helper, Some(rank1), &rec(&[], &[]));
        assert_eq!(ids.get(&helper), None);
        // Under srun, torchrun's agent is task 0 and its first worker
        // rank 0: the worker is a rank of its own.
        let (agent, worker0) = (key(5), key(6));
        ids.on_record(0, agent, None, &rec(&[("SLURM_PROCID", "0")], &[]));
        ids.on_fork(0, worker0, agent);
        ids.on_record(
            0,
            worker0,
            Some(agent),
            &rec(&[("RANK", "0"), ("SLURM_PROCID", "0")], &[]),
        );
        let w0 = ids.get(&worker0).unwrap();
        assert_eq!(
            (w0.rank, w0.rank_from, w0.inherited),
            (Some(0), Some("RANK"), false)
        );
        // An unknown parent passes nothing on.
        ids.on_fork(0, key(9), key(8));
        assert_eq!(ids.get(&key(9)), None);
    }

    /// The recorder reads identities off the draining thread: one can be
    /// recorded after forks that followed its exec. Those forks get it;
    /// one forked before the exec keeps what it had, and one that exec'd
    /// keeps its own.
    /// A helper's own record before its rank's: still of that rank, not a
    /// rank of its own.
    #[test]
    fn a_helpers_record_before_its_ranks_is_still_of_that_rank() {
        let mut ids = Identities::default();
        let (rank, helper) = (key(10), key(11));
        ids.on_fork(1, helper, rank);
        let r = rec(&[("RANK", "0"), ("WORLD_SIZE", "2")], &[]);
        ids.on_record(2, helper, Some(rank), &r);
        ids.on_record(0, rank, None, &r);
        ids.settle_inherited();
        let ids = ids.finish();
        assert_eq!((ids[&rank].rank, ids[&rank].inherited), (Some(0), false));
        assert_eq!((ids[&helper].rank, ids[&helper].inherited), (Some(0), true));
    }

    #[test]
    fn a_late_record_reaches_the_forks_made_since_its_exec() {
        let mut ids = Identities::default();
        let (rank, before, after, grandchild, own) = (key(1), key(2), key(3), key(4), key(5));
        ids.on_record(10, rank, None, &rec(&[("RANK", "7")], &[]));
        ids.on_fork(15, before, rank);
        // The rank execs again at 20 with rank 1; its record comes after
        // three forks made since.
        ids.on_fork(21, after, rank);
        ids.on_fork(22, grandchild, after);
        ids.on_fork(23, own, rank);
        ids.on_record(24, own, Some(rank), &rec(&[("RANK", "9")], &[]));
        ids.on_record(20, rank, None, &rec(&[("RANK", "1")], &[]));
        let rank_of = |ids: &Identities, k: ProcKey| ids.get(&k).and_then(|i| i.rank);
        assert_eq!(rank_of(&ids, rank), Some(1));
        assert_eq!(rank_of(&ids, after), Some(1));
        assert!(ids.get(&after).unwrap().inherited);
        assert_eq!(rank_of(&ids, grandchild), Some(1));
        assert_eq!(rank_of(&ids, before), Some(7), "forked before the exec");
        assert_eq!(rank_of(&ids, own), Some(9), "its own exec's");
        // A late record that says nothing takes the forks' away too.
        ids.on_record(20, rank, None, &rec(&[], &[]));
        assert_eq!(rank_of(&ids, after), None);
        assert_eq!(rank_of(&ids, before), Some(7));
    }

    /// Through the whole model: a rank execs, forks a worker that never
    /// execs; the recording's events in file order, as the collector
    /// writes them (the identity right after its exec).
    #[test]
    fn the_report_carries_each_processs_identity() {
        use crate::decode::{Event, Timed};
        // (Not pid 2: kthreadd's children are kept apart.)
        let (launcher, rank, worker) = (key(100), key(200), key(300));
        let t = |ts_ns, event| Timed { ts_ns, event };
        let fork = |child, parent| Event::Fork {
            child,
            parent,
            comm: "python3".into(),
            kthread: false,
        };
        let mut r = rec(&[("RANK", "1"), ("TORCHELASTIC_RUN_ID", "r")], &[]);
        r.tgid = rank.tgid;
        r.start_ns = 0; // the pid's current process
        let events = vec![
            t(1, fork(rank, launcher)),
            t(
                2,
                Event::Exec {
                    proc: rank,
                    comm: "python3".into(),
                    filename: "/usr/bin/python3".into(),
                    truncated: false,
                    held: false,
                },
            ),
            t(2, Event::Identity(r)),
            t(3, fork(worker, rank)),
        ];
        let report = crate::model::build(
            &crate::recording::RecordingHeader::default(),
            events.into_iter(),
            &crate::model::ModelOptions::default(),
        );
        let of = |k: ProcKey| report.identity(k.tgid, k.start_ns);
        assert_eq!(of(launcher), None);
        let own = of(rank).expect("the rank's own");
        assert_eq!(
            (own.rank, own.inherited, own.run_id.as_deref()),
            (Some(1), false, Some("r"))
        );
        let w = of(worker).expect("the worker's, from its parent");
        assert_eq!((w.rank, w.inherited), (Some(1), true));
    }
}
