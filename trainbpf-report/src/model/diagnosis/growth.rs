//! What `steady_leak` and `fast_growth` both ask of a kill: the limit it
//! ran into, a process's name as the evidence gives it, and where that
//! process's memory came from when `record --stacks` took its stacks.

use crate::model::lead;
use crate::model::{Constraint, GrowthStack, Kill, Report};

/// The limit a kill ran into, kB, and what it was: the memory cgroup's as
/// the kernel printed it (or the job's `--memory-limit`), else for a
/// machine-wide OOM RAM plus swap.
pub(super) fn kill_limit(r: &Report, k: &Kill) -> Option<(u64, &'static str)> {
    if let Some(l) = k.memcg_limit_kb {
        return Some((l, "memory cgroup limit"));
    }
    let job_limit = r
        .job
        .as_ref()
        .and_then(|j| j.memory_limit_bytes)
        .map(|b| b / 1024);
    match k.constraint {
        Constraint::Memcg | Constraint::Unknown if k.victim.in_job => {
            job_limit.map(|l| (l, "memory cgroup limit"))
        }
        Constraint::None => {
            let m = r.header.mem_total_kb + r.header.swap_total_kb;
            (m > 0).then_some((m, "RAM plus swap"))
        }
        _ => None,
    }
}

/// `python3 (pid 700)`, or `rank 1 (pid 700)` for a rank's own process
/// ([`Report::who`]): unescaped, as every diagnosis line is (the renderers
/// escape).
pub(super) fn who(r: &Report, comm: &str, pid: u32, start_ns: u64) -> String {
    r.who(pid, start_ns, comm)
}

/// The heaviest growth stack among `stacks`, those that differ only below
/// the user's own line merged (`lead`), with a frame that names a place:
/// its bytes and that place, as `function (file:line)`.
pub(super) fn heaviest(stacks: &[GrowthStack]) -> Option<(u64, String)> {
    lead::by_lead(stacks)
        .into_iter()
        .filter(|s| s.bytes > 0)
        .find_map(|s| Some((s.bytes, lead::cite(&s.frames[s.lead?]))))
}

/// Where a kill's grower's memory came from, up to the kill; else over the
/// whole run.
pub(super) fn grower_place(r: &Report, k: &Kill, pid: u32, start_ns: u64) -> Option<(u64, String)> {
    let stacks = match k
        .growers
        .iter()
        .find(|g| g.pid == pid && g.start_ns == start_ns)
    {
        Some(g) => r.grower_stacks(k, g),
        None => r.process_stacks(pid, start_ns),
    };
    heaviest(&stacks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::stacks::Frame;

    fn frame(kind: &str, func: &str, file: Option<&str>, module: Option<&str>) -> Frame {
        Frame {
            kind: kind.into(),
            addr: 0x1000,
            function: Some(func.into()),
            file: file.map(Into::into),
            line: file.map(|_| 12),
            module: module.map(Into::into),
            found: None,
        }
    }

    #[test]
    fn the_place_skips_the_allocator_and_prefers_the_users_code() {
        let native = vec![
            frame("native", "malloc", None, Some("/usr/lib/libc.so.6")),
            frame(
                "native",
                "grow_here",
                Some("/tmp/grow.c"),
                Some("/tmp/grow"),
            ),
            frame("native", "main", Some("/tmp/grow.c"), Some("/tmp/grow")),
        ];
        let mut py = native.clone();
        py.insert(1, frame("python", "leak_step", Some("train.py"), None));
        let one = |bytes: u64, frames: Vec<Frame>| GrowthStack {
            bytes,
            count: 1,
            frames,
            error: None,
        };
        assert_eq!(
            heaviest(&[one(1 << 20, py.clone())]),
            Some((1 << 20, "leak_step (train.py:12)".into()))
        );
        let stacks = vec![one(1 << 20, py), one(8 << 20, native)];
        assert_eq!(
            heaviest(&stacks),
            Some((8 << 20, "grow_here (grow.c:12)".into()))
        );
        assert_eq!(heaviest(&[]), None);
    }
}
