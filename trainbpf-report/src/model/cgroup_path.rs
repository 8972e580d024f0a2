//! What a cgroup's path says about who made it: a Docker container, a
//! Kubernetes pod's container, a systemd unit or user session, a Slurm
//! job step, or trainbpf's own `--memory-limit` cgroup.
//!
//! Each manager names its cgroups its own way, under both of the cgroup
//! drivers it may use (`cgroupfs` directories, or systemd's
//! `.slice`/`.scope` units), and the names are all there is: a recording
//! is read on another machine, long after the cgroup is gone. A memory
//! limit's fix is set where the cgroup was made (`docker run --memory`,
//! a pod's `resources.limits.memory`, `MemoryMax=`, `--mem`), so that is
//! what the report needs to name.

/// Who made a cgroup, from its path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `trainbpf record --memory-limit`: the recorder's pid.
    Trainbpf {
        recorder_pid: u32,
    },
    /// A Kubernetes pod's container (any runtime).
    Kubernetes {
        /// `besteffort`, `burstable`, or `guaranteed` (pods of that class
        /// sit directly under `kubepods`).
        qos: String,
        /// The pod's UID, dashed as the API server writes it.
        pod_uid: Option<String>,
        /// The container's id, when the path reaches the container.
        container_id: Option<String>,
    },
    /// A Docker (or Podman) container.
    Docker {
        engine: String,
        container_id: String,
    },
    /// A Slurm job (and step).
    Slurm {
        job: u64,
        step: Option<String>,
        uid: Option<u32>,
    },
    /// A user's systemd session or user service.
    SystemdUser {
        uid: u32,
        unit: Option<String>,
    },
    /// A systemd unit: a service, scope or slice.
    Systemd {
        unit: String,
    },
    Unknown,
}

impl Origin {
    /// A short name for the manager: "Docker", "Kubernetes", "systemd",
    /// "Slurm", "trainbpf"; `None` when the path does not tell.
    pub(crate) fn manager(&self) -> Option<&str> {
        Some(match self {
            Origin::Trainbpf { .. } => "trainbpf",
            Origin::Kubernetes { .. } => "Kubernetes",
            Origin::Docker { engine, .. } => engine,
            Origin::Slurm { .. } => "Slurm",
            Origin::SystemdUser { .. } | Origin::Systemd { .. } => "systemd",
            Origin::Unknown => return None,
        })
    }

    /// What it is, in a few words: "Docker container 3f2a1b4c5d6e",
    /// "Slurm job 123 step 0".
    pub(crate) fn describe(&self) -> String {
        match self {
            Origin::Trainbpf { recorder_pid } => {
                format!(
                    "trainbpf's own cgroup (record --memory-limit, recorder pid {recorder_pid})"
                )
            }
            Origin::Kubernetes {
                qos,
                pod_uid,
                container_id,
            } => {
                let mut s = format!("Kubernetes {qos} pod");
                if let Some(u) = pod_uid {
                    s.push_str(&format!(" {u}"));
                }
                if let Some(c) = container_id {
                    s.push_str(&format!(", container {}", short_id(c)));
                }
                s
            }
            Origin::Docker {
                engine,
                container_id,
            } => format!("{engine} container {}", short_id(container_id)),
            Origin::Slurm { job, step, .. } => match step {
                Some(s) => format!("Slurm job {job} step {s}"),
                None => format!("Slurm job {job}"),
            },
            Origin::SystemdUser { uid, unit } => match unit {
                Some(u) => format!("systemd unit {u} of user {uid}"),
                None => format!("systemd user slice of user {uid}"),
            },
            Origin::Systemd { unit } => format!("systemd unit {unit}"),
            Origin::Unknown => "a cgroup of unknown origin".into(),
        }
    }
}

/// A container id as `docker ps` shows it: its first 12 characters.
pub fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// Reads a cgroup path (as in `/proc/PID/cgroup`, or a kill's memcg).
pub fn parse(path: &str) -> Origin {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    // trainbpf's cgroup is the innermost wherever it is made (in a
    // container, under Slurm): when it is the one named, its limit is
    // the one set.
    if let Some(pid) = parts.last().and_then(|p| trainbpf_pid(p)) {
        return Origin::Trainbpf { recorder_pid: pid };
    }
    kubernetes(&parts)
        .or_else(|| slurm(&parts))
        .or_else(|| docker(&parts))
        .or_else(|| systemd_user(&parts))
        .or_else(|| systemd(&parts))
        .unwrap_or(Origin::Unknown)
}

/// `trainbpf-PID-RANDOM16` (or the older `trainbpf-PID`).
fn trainbpf_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("trainbpf-")?;
    let pid = match rest.split_once('-') {
        Some((pid, r)) if r.len() == 16 && is_hex(r) => pid,
        Some(_) => return None,
        None => rest,
    };
    pid.parse().ok()
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_hexdigit())
}

/// A container id: 64 hex digits, alone or in a runtime's scope name
/// (`docker-ID.scope`, `cri-containerd-ID.scope`, `crio-ID.scope`,
/// `libpod-ID.scope`); with the runtime's prefix when it has one.
fn container_id(name: &str) -> Option<(&str, &str)> {
    let base = name.strip_suffix(".scope").unwrap_or(name);
    let (prefix, id) = match base.rsplit_once('-') {
        Some((p, id)) => (p, id),
        None => ("", base),
    };
    (id.len() == 64 && is_hex(id)).then_some((prefix, id))
}

/// cgroupfs: `/kubepods/burstable/pod<uid>/<id>` (guaranteed pods sit
/// under `/kubepods/pod<uid>`); systemd:
/// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid
/// with underscores>.slice/cri-containerd-<id>.scope`.
fn kubernetes(parts: &[&str]) -> Option<Origin> {
    let at = parts.iter().position(|p| p.starts_with("kubepods"))?;
    let mut qos = "guaranteed".to_string();
    let mut pod_uid = None;
    let mut container = None;
    for p in &parts[at..] {
        let name = p.strip_suffix(".slice").unwrap_or(p);
        let name = name.strip_prefix("kubepods-").unwrap_or(name);
        for class in ["besteffort", "burstable"] {
            if name == class || name.starts_with(&format!("{class}-")) {
                qos = class.to_string();
            }
        }
        let pod = name
            .strip_prefix("besteffort-")
            .or_else(|| name.strip_prefix("burstable-"))
            .unwrap_or(name);
        if let Some(uid) = pod.strip_prefix("pod") {
            // systemd's unit names cannot hold '-': the kubelet writes _.
            pod_uid = Some(uid.replace('_', "-"));
        }
        if let Some((_, id)) = container_id(p) {
            container = Some(id.to_string());
        }
    }
    Some(Origin::Kubernetes {
        qos,
        pod_uid,
        container_id: container,
    })
}

/// `/slurm/uid_1000/job_123/step_0` (cgroup v1's cgroupfs plugin, also
/// `slurm_<node>` with several slurmds), or
/// `/system.slice/slurmstepd.scope/job_123/step_0` (cgroup v2).
fn slurm(parts: &[&str]) -> Option<Origin> {
    let at = parts.iter().position(|p| p.starts_with("slurm"))?;
    let mut job = None;
    let mut step = None;
    let mut uid = None;
    for p in &parts[at + 1..] {
        if let Some(u) = p.strip_prefix("uid_") {
            uid = u.parse().ok();
        } else if let Some(j) = p.strip_prefix("job_") {
            job = j.parse().ok();
        } else if let Some(s) = p.strip_prefix("step_") {
            step = Some(s.to_string());
        }
    }
    Some(Origin::Slurm {
        job: job?,
        step,
        uid,
    })
}

/// cgroupfs: `/docker/<id>`; systemd: `/system.slice/docker-<id>.scope`;
/// Podman: `libpod-<id>.scope`.
fn docker(parts: &[&str]) -> Option<Origin> {
    for (i, p) in parts.iter().enumerate().rev() {
        let Some((prefix, id)) = container_id(p) else {
            continue;
        };
        let engine = match prefix {
            "docker" => "Docker",
            "libpod" => "Podman",
            "" if i > 0 && parts[i - 1] == "docker" => "Docker",
            "" if i > 0 && parts[i - 1] == "libpod_parent" => "Podman",
            _ => continue,
        };
        return Some(Origin::Docker {
            engine: engine.into(),
            container_id: id.to_string(),
        });
    }
    None
}

/// `/user.slice/user-1000.slice/session-3.scope`, or a user service
/// under `user@1000.service`.
fn systemd_user(parts: &[&str]) -> Option<Origin> {
    let uid = parts.iter().find_map(|p| {
        p.strip_prefix("user-")?
            .strip_suffix(".slice")?
            .parse()
            .ok()
    })?;
    let unit = parts
        .iter()
        .rev()
        .find(|p| is_unit(p) && !p.ends_with(".slice") && !p.starts_with("user@"))
        .map(|p| p.to_string());
    Some(Origin::SystemdUser { uid, unit })
}

/// The innermost systemd unit: `/system.slice/train.service`.
fn systemd(parts: &[&str]) -> Option<Origin> {
    let unit = parts.iter().rev().find(|p| is_unit(p))?;
    Some(Origin::Systemd {
        unit: unit.to_string(),
    })
}

fn is_unit(p: &str) -> bool {
    [".service", ".scope", ".slice"]
        .iter()
        .any(|s| p.len() > s.len() && p.ends_with(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f2a1b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708";

    #[test]
    fn docker_under_both_drivers() {
        let want = Origin::Docker {
            engine: "Docker".into(),
            container_id: ID.into(),
        };
        assert_eq!(parse(&format!("/docker/{ID}")), want);
        assert_eq!(parse(&format!("/system.slice/docker-{ID}.scope")), want);
        assert_eq!(want.describe(), "Docker container 3f2a1b4c5d6e");
        assert_eq!(
            parse(&format!("/machine.slice/libpod-{ID}.scope")),
            Origin::Docker {
                engine: "Podman".into(),
                container_id: ID.into()
            }
        );
    }

    #[test]
    fn kubernetes_under_both_drivers() {
        let uid = "8d3c2b1a-0f9e-4d8c-b7a6-954433221100";
        let want = Origin::Kubernetes {
            qos: "burstable".into(),
            pod_uid: Some(uid.into()),
            container_id: Some(ID.into()),
        };
        assert_eq!(parse(&format!("/kubepods/burstable/pod{uid}/{ID}")), want);
        let underscored = uid.replace('-', "_");
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{underscored}.slice/cri-containerd-{ID}.scope"
        );
        assert_eq!(parse(&systemd), want);
        assert_eq!(
            want.describe(),
            format!("Kubernetes burstable pod {uid}, container 3f2a1b4c5d6e")
        );
        // A guaranteed pod has no class of its own in the path.
        assert_eq!(
            parse(&format!("/kubepods/pod{uid}")),
            Origin::Kubernetes {
                qos: "guaranteed".into(),
                pod_uid: Some(uid.into()),
                container_id: None,
            }
        );
        let besteffort = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{underscored}.slice/crio-{ID}.scope"
        );
        assert!(
            matches!(parse(&besteffort), Origin::Kubernetes { qos, .. } if qos == "besteffort")
        );
    }

    #[test]
    fn slurm_under_both_layouts() {
        let want = Origin::Slurm {
            job: 123,
            step: Some("0".into()),
            uid: Some(1000),
        };
        assert_eq!(parse("/slurm/uid_1000/job_123/step_0"), want);
        assert_eq!(
            parse("/system.slice/slurmstepd.scope/job_123/step_0"),
            Origin::Slurm {
                job: 123,
                step: Some("0".into()),
                uid: None
            }
        );
        assert_eq!(
            parse("/system.slice/slurmstepd.scope/job_77/step_batch/user/task_0"),
            Origin::Slurm {
                job: 77,
                step: Some("batch".into()),
                uid: None
            }
        );
        assert_eq!(want.describe(), "Slurm job 123 step 0");
        // slurmstepd's own scope, outside any job, is a systemd unit.
        assert_eq!(
            parse("/system.slice/slurmstepd.scope"),
            Origin::Systemd {
                unit: "slurmstepd.scope".into()
            }
        );
    }

    #[test]
    fn systemd_units_and_user_sessions() {
        assert_eq!(
            parse("/user.slice/user-1000.slice/session-3.scope"),
            Origin::SystemdUser {
                uid: 1000,
                unit: Some("session-3.scope".into())
            }
        );
        assert_eq!(
            parse("/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1234.scope"),
            Origin::SystemdUser {
                uid: 1000,
                unit: Some("run-r1234.scope".into())
            }
        );
        assert_eq!(
            parse("/user.slice/user-1000.slice"),
            Origin::SystemdUser {
                uid: 1000,
                unit: None
            }
        );
        assert_eq!(
            parse("/system.slice/train.service"),
            Origin::Systemd {
                unit: "train.service".into()
            }
        );
    }

    #[test]
    fn trainbpfs_own_wherever_it_is_made() {
        assert_eq!(
            parse("/trainbpf-4242-0123456789abcdef"),
            Origin::Trainbpf { recorder_pid: 4242 }
        );
        // Inside a container (as on the machines these tests run on).
        assert_eq!(
            parse("/process_api/cfe0ec50fa8cbe6009494184b24506e4/trainbpf-20137-a32aaebe169ffa2b"),
            Origin::Trainbpf {
                recorder_pid: 20137
            }
        );
        assert_eq!(
            parse(&format!("/docker/{ID}/trainbpf-9")),
            Origin::Trainbpf { recorder_pid: 9 }
        );
        // Its name in the middle is not the cgroup that was limited.
        assert!(matches!(
            parse("/trainbpf-9/inner.scope"),
            Origin::Systemd { .. }
        ));
    }

    #[test]
    fn what_the_path_does_not_tell() {
        for p in [
            "/",
            "",
            "/process_api/cfe0ec50fa8cbe6009494184b24506e4",
            "/trainbpf/job",
            "/docker",
            &format!("/other/{ID}"),
            "/slurm/uid_1000",
        ] {
            assert_eq!(parse(p), Origin::Unknown, "{p}");
            assert_eq!(parse(p).manager(), None);
        }
    }
}
