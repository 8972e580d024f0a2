//! Kernel log lines (mm/oom_kill.c, mm/memcontrol.c) read as parts of a
//! kill: the constraint, the memcgs, the victim's figures, the memcg's
//! usage and limit. The probe may hand over the line with or without the
//! console's "[  12.345678] " prefix, so each form is found by its marker,
//! not at the start.

use super::Constraint;

/// cgroup v2 prints `PAGE_COUNTER_MAX` pages as the limit of a memcg without
/// one; anything this large (1 EiB) means "no limit".
pub(super) const NO_LIMIT_KB: u64 = 1 << 50;

/// What the kernel log said, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum KernelLine {
    /// `oom-kill:constraint=…,oom_memcg=…,task_memcg=…,task=…,pid=…,uid=…`
    OomKill {
        constraint: Option<Constraint>,
        oom_memcg: Option<String>,
        task_memcg: Option<String>,
        pid: Option<u32>,
    },
    /// `<why>: Killed process PID (COMM) total-vm:…kB, …`
    Killed {
        constraint: Constraint,
        pid: u32,
        total_vm_kb: Option<u64>,
        pgtables_kb: Option<u64>,
    },
    /// `memory: usage NkB, limit NkB, failcnt N`
    Usage {
        usage_kb: u64,
        limit_kb: Option<u64>,
        failcnt: Option<u64>,
    },
    Other,
}

#[derive(Debug)]
pub(super) struct LogLine {
    pub(super) ts: u64,
    pub(super) msg: String,
    pub(super) parsed: KernelLine,
}

pub(super) fn parse_kernel_line(msg: &str) -> KernelLine {
    if let Some(i) = msg.find("oom-kill:") {
        let mut constraint = None;
        let mut oom_memcg = None;
        let mut task_memcg = None;
        let mut pid = None;
        for (k, v) in key_values(&msg[i + "oom-kill:".len()..]) {
            match k {
                "constraint" => constraint = Constraint::from_printk(&v),
                "oom_memcg" => oom_memcg = Some(v),
                "task_memcg" => task_memcg = Some(v),
                "pid" => pid = v.parse().ok(),
                _ => {}
            }
        }
        return KernelLine::OomKill {
            constraint,
            oom_memcg,
            task_memcg,
            pid,
        };
    }
    if let Some(i) = msg.find("Killed process ") {
        let why = &msg[..i];
        let constraint = if why.contains("Memory cgroup out of memory") {
            Constraint::Memcg
        } else if why.contains("Out of memory") {
            Constraint::None
        } else {
            Constraint::Unknown
        };
        let rest = &msg[i + "Killed process ".len()..];
        let Some(pid) = leading_number(rest) else {
            return KernelLine::Other;
        };
        return KernelLine::Killed {
            constraint,
            pid: pid as u32,
            total_vm_kb: field_number(rest, "total-vm:"),
            pgtables_kb: field_number(rest, "pgtables:"),
        };
    }
    if let Some(i) = msg.find("memory: usage ") {
        let rest = &msg[i + "memory: usage ".len()..];
        let Some(usage_kb) = leading_number(rest) else {
            return KernelLine::Other;
        };
        return KernelLine::Usage {
            usage_kb,
            limit_kb: field_number(rest, "limit ").filter(|&l| l < NO_LIMIT_KB),
            failcnt: field_number(rest, "failcnt "),
        };
    }
    KernelLine::Other
}

/// The pid and the constraint a kill's log line names, if it is one:
/// `record --metrics` settles a kill's constraint with it while the job
/// runs, as the report does afterwards. The pid is `None` where the
/// kernel's `oom-kill:` line came in pieces (its `pid=` in a continuation
/// the console tracepoint passes on its own): the line of the kill that
/// follows it.
pub fn kill_constraint(msg: &str) -> Option<(Option<u32>, Constraint)> {
    match parse_kernel_line(msg) {
        KernelLine::OomKill {
            constraint: Some(c),
            pid,
            ..
        } => Some((pid, c)),
        KernelLine::Killed {
            constraint, pid, ..
        } if constraint != Constraint::Unknown => Some((Some(pid), constraint)),
        _ => None,
    }
}

/// The memory cgroup's limit a memcg OOM's `memory: usage …, limit …`
/// line gives, kB: the recorder's line at a kill names it, as the report
/// does.
pub fn memcg_limit(msg: &str) -> Option<u64> {
    match parse_kernel_line(msg) {
        KernelLine::Usage { limit_kb, .. } => limit_kb,
        _ => None,
    }
}

/// `a=1,b=/x,y,c=2` → (a,1) (b,/x,y) (c,2): a piece without `=` belongs to
/// the value before it, since cgroup paths may hold commas.
pub(super) fn key_values(s: &str) -> Vec<(&str, String)> {
    let mut out: Vec<(&str, String)> = Vec::new();
    for piece in s.trim().split(',') {
        match piece.split_once('=') {
            Some((k, v)) if !k.contains('/') => out.push((k.trim(), v.to_string())),
            _ => {
                if let Some((_, v)) = out.last_mut() {
                    v.push(',');
                    v.push_str(piece);
                }
            }
        }
    }
    out
}

pub(super) fn leading_number(s: &str) -> Option<u64> {
    let s = s.trim_start();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s[..end].parse().ok()
}

pub(super) fn field_number(s: &str, name: &str) -> Option<u64> {
    leading_number(&s[s.find(name)? + name.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printk_constraint_parsing() {
        let line = "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/trainbpf-77,task_memcg=/trainbpf-77/a,b,task=python3,pid=1234,uid=0";
        assert_eq!(
            parse_kernel_line(line),
            KernelLine::OomKill {
                constraint: Some(Constraint::Memcg),
                oom_memcg: Some("/trainbpf-77".into()),
                task_memcg: Some("/trainbpf-77/a,b".into()),
                pid: Some(1234),
            }
        );
        assert_eq!(
            parse_kernel_line(
                "[  12.5] Out of memory: Killed process 99 (java) total-vm:10kB, anon-rss:5kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:4kB oom_score_adj:0"
            ),
            KernelLine::Killed {
                constraint: Constraint::None,
                pid: 99,
                total_vm_kb: Some(10),
                pgtables_kb: Some(4),
            }
        );
        assert_eq!(
            parse_kernel_line("memory: usage 307200kB, limit 9007199254740988kB, failcnt 0"),
            KernelLine::Usage {
                usage_kb: 307200,
                limit_kb: None,
                failcnt: Some(0),
            }
        );
        assert_eq!(
            parse_kernel_line("memory+swap: usage 1kB, limit 2kB, failcnt 0"),
            KernelLine::Other
        );
    }
}
