//! The `oom_protect` check: can `record` keep the OOM killer off itself?
//!
//! The recorder sets its own oom_score_adj to -1000 so that it outlives
//! the kill it is there to record. Lowering oom_score_adj needs
//! CAP_SYS_RESOURCE in the initial user namespace (or a floor already set
//! that low by a privileged ancestor), which many containers drop. The
//! check tries it for real in a short-lived forked child, so that it sees
//! exactly what the recorder would, and leaves doctor's own value alone.

use std::fs;

use super::{Check, Status, check, needs_root};

const CAP_SYS_RESOURCE: u32 = 24;

/// What gather() found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomProtect {
    /// The trial write of -1000: `Ok` or the errno's text.
    pub trial: Result<(), String>,
    /// CAP_SYS_RESOURCE in the effective set (`CapEff`).
    pub cap_sys_resource: Option<bool>,
    /// In a user namespace other than the initial one, where capabilities
    /// do not count for oom_score_adj.
    pub user_namespace: bool,
}

pub fn gather() -> OomProtect {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_sys_resource = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .map(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0);
    // The initial namespace maps all of 0..2^32-1 onto itself.
    let user_namespace = fs::read_to_string("/proc/self/uid_map")
        .map(|m| m.split_whitespace().collect::<Vec<_>>() != ["0", "0", "4294967295"])
        .unwrap_or(false);
    OomProtect {
        trial: trial_write(),
        cap_sys_resource,
        user_namespace,
    }
}

/// Forks a child that writes -1000 to its own oom_score_adj and exits with
/// the errno (0 on success).
fn trial_write() -> Result<(), String> {
    use nix::{
        sys::wait::{WaitStatus, waitpid},
        unistd::{ForkResult, fork},
    };
    // SAFETY: the child calls only async-signal-safe functions (open,
    // write, _exit) on data prepared before the fork.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let path = c"/proc/self/oom_score_adj";
            let v = b"-1000";
            // SAFETY: a NUL-terminated path and a buffer of v.len() bytes.
            let code = unsafe {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, v.as_ptr().cast(), v.len()) < 0 {
                    *libc::__errno_location()
                } else {
                    0
                }
            };
            // SAFETY: ends the child without running the parent's atexit
            // handlers or destructors.
            unsafe { libc::_exit(code.clamp(0, 255)) }
        }
        Ok(ForkResult::Parent { child }) => match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, 0)) => Ok(()),
            Ok(WaitStatus::Exited(_, errno)) => {
                Err(std::io::Error::from_raw_os_error(errno).to_string())
            }
            Ok(other) => Err(format!("the trial child ended oddly: {other:?}")),
            Err(e) => Err(format!("waiting for the trial child: {e}")),
        },
        Err(e) => Err(format!("fork: {e}")),
    }
}

pub fn check_oom_protect(root: bool, p: &OomProtect) -> Check {
    let id = "oom_protect";
    let why = "the recorder sets its own oom_score_adj to -1000 so that the OOM killer never picks it and it outlives the kill it records; without that, a machine-wide OOM may kill the recorder instead of, or with, the job, and the end of the recording is lost";
    if !root {
        return needs_root(id, "trying the recorder's protection", why);
    }
    match &p.trial {
        Ok(()) => check(
            id,
            Status::Ok,
            "able",
            "record can set its oom_score_adj to -1000",
            why,
            "",
        ),
        Err(e) => {
            let mut finding = format!("setting oom_score_adj to -1000 fails here ({e})");
            if p.cap_sys_resource == Some(false) {
                finding.push_str(": CAP_SYS_RESOURCE is not in the effective set");
            }
            if p.user_namespace {
                finding.push_str(
                    "; this runs in a user namespace, where capabilities do not count for oom_score_adj",
                );
            }
            check(
                id,
                Status::Warn,
                "unable",
                finding,
                why,
                "run `trainbpf record` with CAP_SYS_RESOURCE: with sudo on the host, or in a container that keeps it (`docker run --cap-add SYS_RESOURCE`, a Kubernetes securityContext adding SYS_RESOURCE) and is not in a user namespace",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_what_is_missing_and_how_to_fix_it() {
        let p = OomProtect {
            trial: Err("Permission denied (os error 13)".into()),
            cap_sys_resource: Some(false),
            user_namespace: true,
        };
        let c = check_oom_protect(true, &p);
        assert_eq!((c.status, c.state.as_str()), (Status::Warn, "unable"));
        assert!(c.finding.contains("CAP_SYS_RESOURCE"), "{}", c.finding);
        assert!(c.finding.contains("user namespace"), "{}", c.finding);
        assert!(c.fix.contains("CAP_SYS_RESOURCE"), "{}", c.fix);
        let ok = OomProtect {
            trial: Ok(()),
            cap_sys_resource: Some(true),
            user_namespace: false,
        };
        assert_eq!(check_oom_protect(true, &ok).state, "able");
        assert_eq!(check_oom_protect(false, &p).state, "not_checked");
    }
}
