//! Lines the text and HTML reports share so that a long list of trivia
//! reads as one line: the job's short-lived helpers, and what an attach
//! left out of the job. Raw text: each renderer escapes it its own way.

use crate::model::{LeftOut, ShortLived};

/// Names shown on the folded line; the rest are counted.
const NAMES: usize = 8;

/// "40 short-lived helpers (each under 1 s, added nothing): bash ×34,
/// readlink ×5, basename ×1"; `None` when there are none.
pub(crate) fn short_lived_line(s: &ShortLived) -> Option<String> {
    if s.is_empty() {
        return None;
    }
    let n = s.count();
    let mut names: Vec<String> = s
        .by_comm
        .iter()
        .take(NAMES)
        .map(|(c, k)| format!("{c} ×{k}"))
        .collect();
    let more = s.by_comm.len().saturating_sub(NAMES);
    if more > 0 {
        names.push(format!("{more} more names"));
    }
    Some(format!(
        "{n} short-lived helper{} (each lived under 1 s, added nothing, exited normally): {}",
        if n == 1 { "" } else { "s" },
        names.join(", ")
    ))
}

/// "left out of the job: the recorder (pid 4242) and 2 processes it ran,
/// 37 kernel threads"; `None` when nothing was. The recorder is named
/// where it could have passed for the job's: with `--all`, or when it ran
/// something the job's probes saw.
pub(crate) fn left_out_line(l: &LeftOut, all: bool) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(pid) = l.recorder_pid.filter(|_| all || l.recorder_helpers > 0) {
        parts.push(match l.recorder_helpers {
            0 => format!("the recorder (pid {pid})"),
            1 => format!("the recorder (pid {pid}) and 1 process it ran"),
            n => format!("the recorder (pid {pid}) and {n} processes it ran"),
        });
    } else if l.recorder_helpers > 0 {
        parts.push(format!("{} processes the recorder ran", l.recorder_helpers));
    }
    if l.kernel_threads > 0 {
        parts.push(format!(
            "{} kernel thread{}",
            l.kernel_threads,
            if l.kernel_threads == 1 { "" } else { "s" }
        ));
    }
    (!parts.is_empty()).then(|| format!("left out of the job: {}", parts.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{ExitStatus, ProcKey};
    use crate::model::Process;

    #[test]
    fn helpers_read_as_one_line() {
        let p = |pid: u32, comm: &str| Process {
            pid,
            start_ns: u64::from(pid),
            comm: comm.into(),
            parent: Some(ProcKey {
                tgid: 1,
                start_ns: 1,
            }),
            born_ns: Some(10),
            died_ns: Some(20),
            exit: Some(ExitStatus::Code(0)),
            ..Process::default()
        };
        let mut ps: Vec<Process> = (0..34).map(|i| p(100 + i, "bash")).collect();
        ps.extend((0..5).map(|i| p(200 + i, "readlink")));
        let s = crate::model::short_lived::fold(&ps, &[]);
        assert_eq!(
            short_lived_line(&s).unwrap(),
            "39 short-lived helpers (each lived under 1 s, added nothing, exited normally): bash ×34, readlink ×5"
        );
        assert_eq!(short_lived_line(&ShortLived::default()), None);
    }

    #[test]
    fn what_was_left_out() {
        let l = LeftOut {
            recorder_pid: Some(4242),
            recorder_helpers: 2,
            kernel_threads: 37,
        };
        assert_eq!(
            left_out_line(&l, true).unwrap(),
            "left out of the job: the recorder (pid 4242) and 2 processes it ran, 37 kernel threads"
        );
        // A job the recorder ran, or one --pid attached to: its pid is
        // no news.
        let ran = LeftOut {
            recorder_pid: Some(4242),
            ..LeftOut::default()
        };
        assert_eq!(left_out_line(&ran, false), None);
        assert_eq!(
            left_out_line(&ran, true).unwrap(),
            "left out of the job: the recorder (pid 4242)"
        );
    }
}
