//! What the recorder needs of the kernel before it starts: the
//! capabilities to load its probes and run the job as its user, and the
//! OOM killer kept off itself.

use std::fs;

use crate::util::invoker::Invoker;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const CAP_SETUID: u32 = 7;
const CAP_SETGID: u32 = 6;

/// Effective capability set, from /proc/self/status.
pub(super) fn effective_caps() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Names the capabilities that are missing, or None when all are there.
pub fn missing_capabilities(caps: u64, invoker: &Invoker, euid: u32) -> Option<String> {
    let has = |c: u32| caps & (1 << c) != 0;
    let mut missing = Vec::new();
    if !has(CAP_SYS_ADMIN) {
        if !has(CAP_BPF) {
            missing.push("CAP_BPF");
        }
        if !has(CAP_PERFMON) {
            missing.push("CAP_PERFMON");
        }
        if !missing.is_empty() {
            missing.push("(or CAP_SYS_ADMIN)");
        }
    }
    if invoker.uid != euid && !has(CAP_SETUID) {
        missing.push("CAP_SETUID");
    }
    if invoker.uid != euid && !has(CAP_SETGID) {
        missing.push("CAP_SETGID");
    }
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// Sets our own oom_score_adj to -1000 and returns the old value, which the
/// job gets back, and, when that failed, why, for the recording's header
/// (the report then says the recorder was not protected).
pub(super) fn protect_from_oom_killer() -> (i32, Option<trainbpf_report::recording::Fallback>) {
    let old = fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    match fs::write("/proc/self/oom_score_adj", "-1000") {
        Ok(()) => (old, None),
        Err(e) => {
            let reason = format!(
                "{e}; lowering it needs CAP_SYS_RESOURCE (run outside a container that drops it, or grant it), so the OOM killer may pick the recorder"
            );
            eprintln!(
                "trainbpf: warning: could not set the recorder's oom_score_adj to -1000 ({reason})"
            );
            let f = trainbpf_report::recording::Fallback {
                probe: "oom_score_adj -1000 (the recorder's OOM protection)".into(),
                reason,
            };
            (old, Some(f))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_missing_capabilities() {
        let me = Invoker { uid: 0, gid: 0 };
        let all = u64::MAX;
        assert_eq!(missing_capabilities(all, &me, 0), None);
        let m = missing_capabilities(0, &me, 0).unwrap();
        assert!(m.contains("CAP_BPF") && m.contains("CAP_PERFMON"), "{m}");
        // CAP_SYS_ADMIN alone covers BPF on every kernel.
        assert_eq!(missing_capabilities(1 << CAP_SYS_ADMIN, &me, 0), None);
        // Running the job as someone else needs setuid/setgid too.
        let other = Invoker {
            uid: 1000,
            gid: 1000,
        };
        let m = missing_capabilities(1 << CAP_SYS_ADMIN, &other, 0).unwrap();
        assert_eq!(m, "CAP_SETUID, CAP_SETGID");
    }
}
