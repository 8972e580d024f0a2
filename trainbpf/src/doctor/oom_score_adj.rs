//! The `oom_score_adj` check: processes the OOM killer never picks or picks
//! first, which decide who dies in a machine-wide OOM.

use std::fs;

use super::{Check, Status, check, fmt_bytes, read, read_num};

/// One process with an extreme oom_score_adj.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcAdj {
    pub pid: u32,
    pub comm: String,
    pub adj: i32,
    pub rss_bytes: u64,
}

pub fn check_oom_score_adj(self_adj: Option<i32>, extreme: &[ProcAdj]) -> Check {
    let id = "oom_score_adj";
    let list = |adj: i32| -> (usize, String) {
        let mut v: Vec<&ProcAdj> = extreme.iter().filter(|p| p.adj == adj).collect();
        v.sort_by_key(|p| std::cmp::Reverse(p.rss_bytes));
        let top: Vec<String> = v
            .iter()
            .take(3)
            .map(|p| format!("{} {} ({})", p.pid, p.comm, fmt_bytes(p.rss_bytes)))
            .collect();
        let more = if v.len() > 3 { ", …" } else { "" };
        (v.len(), format!("{}{more}", top.join(", ")))
    };
    let (n_never, never) = list(-1000);
    let (n_first, first) = list(1000);
    let mut finding = match self_adj {
        Some(a) => format!("this shell's processes: {a}"),
        None => "own oom_score_adj unreadable".into(),
    };
    if n_never > 0 {
        finding.push_str(&format!("; {n_never} never killed (-1000): {never}"));
    }
    if n_first > 0 {
        finding.push_str(&format!("; {n_first} killed first (1000): {first}"));
    }
    if n_never == 0 && n_first == 0 {
        finding.push_str("; no process at -1000 or 1000");
    }
    let (status, state, fix) = match self_adj {
        Some(-1000) => (
            Status::Warn,
            "protected",
            "a job started from here inherits -1000 and is never chosen: the kernel kills other processes instead, or panics; reset with `echo 0 > /proc/self/oom_score_adj` in the launching shell",
        ),
        Some(a) if a != 0 => (
            Status::Info,
            "adjusted",
            "jobs started from here inherit this value; set it in the launcher if that is not wanted",
        ),
        _ => (Status::Ok, "default", ""),
    };
    check(
        id,
        status,
        state,
        finding,
        "the kernel kills the process with the highest badness (RSS + swap + page tables, shifted by oom_score_adj × RAM/1000): -1000 is never chosen, 1000 first, so a large protected process makes a smaller job the victim",
        fix,
    )
}

pub(super) fn gather_extreme_adj() -> Vec<ProcAdj> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // Processes come and go while we read: skip the ones that went.
        let Some(adj) = read_num::<i32>(&format!("/proc/{pid}/oom_score_adj")) else {
            continue;
        };
        if adj != -1000 && adj != 1000 {
            continue;
        }
        // statm's second field: resident pages. Kernel threads have none
        // and can't be OOM-killed, so they are left out.
        let rss = read(&format!("/proc/{pid}/statm"))
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            * page;
        if rss == 0 {
            continue;
        }
        let comm = read(&format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim()
            .to_string();
        out.push(ProcAdj {
            pid,
            comm,
            adj,
            rss_bytes: rss,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_score_adj_lists_the_extremes_biggest_first() {
        let p = |pid, comm: &str, adj, mib: u64| ProcAdj {
            pid,
            comm: comm.into(),
            adj,
            rss_bytes: mib << 20,
        };
        let procs = [
            p(10, "sshd", -1000, 5),
            p(11, "postgres", -1000, 900),
            p(12, "dockerd", -1000, 80),
            p(13, "udevd", -1000, 3),
            p(20, "chrome", 1000, 300),
        ];
        let c = check_oom_score_adj(Some(0), &procs);
        assert_eq!((c.state.as_str(), c.status), ("default", Status::Ok));
        assert!(
            c.finding.contains("4 never killed (-1000): 11 postgres (900 MiB), 12 dockerd (80 MiB), 10 sshd (5 MiB), …"),
            "{}",
            c.finding
        );
        assert!(
            c.finding
                .contains("1 killed first (1000): 20 chrome (300 MiB)")
        );
        let c = check_oom_score_adj(Some(-1000), &[]);
        assert_eq!((c.state.as_str(), c.status), ("protected", Status::Warn));
        assert_eq!(check_oom_score_adj(Some(500), &[]).state, "adjusted");
    }
}
