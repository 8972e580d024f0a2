//! What the kernel programs logged (`record --ebpf-log`): shown only when
//! it was asked for, or when the recording has some anyway.

use std::fmt::Write as _;

use crate::model::Report;
use crate::term::escape as esc;

use super::style::Paint;

/// Program and site pairs listed; `report --json` has every message.
const SHOWN: usize = 20;

pub(super) fn section(out: &mut String, r: &Report, p: &Paint) {
    let l = &r.ebpf_log;
    if !l.enabled && l.messages.is_empty() {
        return;
    }
    let total = l.messages.len() as u64 + l.omitted;
    if total == 0 {
        let _ = writeln!(
            out,
            "{}\n",
            p.dim("Kernel programs' log (--ebpf-log): nothing logged")
        );
        return;
    }
    let _ = writeln!(
        out,
        "{}",
        p.bold(&format!(
            "Kernel programs' log (--ebpf-log): {total} message{}",
            if total == 1 { "" } else { "s" }
        ))
    );
    // A condition that holds tends to hold again (the programs log each
    // site's 1st, 2nd, 4th... time per CPU): one line per program and
    // site, its first message, and how many more it logged.
    let mut sites: Vec<(&str, &str, usize, u64)> = Vec::new();
    for (i, (_, m)) in l.messages.iter().enumerate() {
        match sites.iter_mut().find(|s| s.0 == m.program && s.1 == m.site) {
            Some(s) => s.3 += 1,
            None => sites.push((&m.program, &m.site, i, 1)),
        }
    }
    for &(_, _, first, n) in sites.iter().take(SHOWN) {
        let (ts, m) = &l.messages[first];
        // The programs wrote these: escaped like anything a process wrote.
        let mut line = format!(
            "  +{:>7.1} s  {:<5}  {}: {}",
            r.since_start_s(*ts),
            esc(&m.level),
            esc(&m.program),
            esc(&m.message)
        );
        if n > 1 {
            let _ = write!(line, " (and {} more like it)", n - 1);
        }
        let _ = writeln!(
            out,
            "{}",
            if m.level == "error" || m.level == "warn" {
                p.yellow(&line)
            } else {
                line
            }
        );
    }
    if sites.len() > SHOWN || l.omitted > 0 {
        let _ = writeln!(
            out,
            "  … and more (report --json lists the first {})",
            crate::model::EBPF_LOG_KEPT
        );
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::EbpfLog;
    use crate::render::fixture::sample_report;

    fn text(r: &Report) -> String {
        let mut out = String::new();
        section(&mut out, r, &Paint(false));
        out
    }

    fn msg(program: &str, site: &str, message: &str) -> EbpfLog {
        EbpfLog {
            program: program.into(),
            level: "warn".into(),
            site: site.into(),
            message: message.into(),
        }
    }

    #[test]
    fn one_line_per_program_and_site_only_when_asked_for() {
        let mut r = sample_report();
        assert_eq!(text(&r), "", "off and empty: no section");
        r.ebpf_log.enabled = true;
        assert_eq!(
            text(&r),
            "Kernel programs' log (--ebpf-log): nothing logged\n\n"
        );
        let t0 = r.first_ns.unwrap();
        for (dt, m) in [
            (
                1,
                msg("page_alloc", "procs.rs:1", "PROCS full: 7 (1 on this CPU)"),
            ),
            (
                2,
                msg("page_alloc", "procs.rs:1", "PROCS full: 8 (2 on this CPU)"),
            ),
            (
                3,
                msg("sched_exec", "klog.rs:9", "task_struct.tgid \x1b[2J"),
            ),
        ] {
            r.ebpf_log.messages.push((t0 + dt * 1_000_000_000, m));
        }
        let t = text(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "Kernel programs' log (--ebpf-log): 3 messages");
        assert_eq!(
            lines[1],
            "  +    1.0 s  warn   page_alloc: PROCS full: 7 (1 on this CPU) (and 1 more like it)"
        );
        // What the programs wrote is escaped.
        assert_eq!(
            lines[2],
            "  +    3.0 s  warn   sched_exec: task_struct.tgid \\x1b[2J"
        );
        assert_eq!(lines[3..], [""]);
    }
}
