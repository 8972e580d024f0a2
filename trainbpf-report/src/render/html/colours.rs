//! One colour per process for the whole page: the run chart and every
//! kill's window draw a process in the same colour, so a reader can follow
//! it from chart to chart. A kill's victim is red wherever it appears.

use std::collections::HashMap;

use super::draw::{KILL_RED, PALETTE};
use crate::model::Report;

/// Each charted process's colour, by (pid, start time).
#[derive(Debug, Default)]
pub(super) struct Colours {
    by_key: HashMap<(u32, u64), &'static str>,
}

impl Colours {
    /// The page's processes in the order the page charts them (the run
    /// chart, then each kill's window), each new one the next colour.
    pub(super) fn of_page(r: &Report) -> Colours {
        let mut c = Colours::default();
        for k in &r.kills {
            c.by_key.insert((k.victim.pid, k.victim.start_ns), KILL_RED);
        }
        let mut next = 0;
        let mut add = |c: &mut Colours, key: (u32, u64)| {
            c.by_key.entry(key).or_insert_with(|| {
                next += 1;
                PALETTE[(next - 1) % PALETTE.len()]
            });
        };
        for p in crate::render::chart::run_lines(r) {
            add(&mut c, (p.pid, p.start_ns));
        }
        for w in &r.series.windows {
            for l in &w.lines {
                add(&mut c, (l.pid, l.start_ns));
            }
        }
        c
    }

    /// A process's colour; one the page did not plan for (a start time
    /// the kill record lacked) by pid.
    pub(super) fn of(&self, pid: u32, start_ns: u64) -> &'static str {
        self.by_key
            .get(&(pid, start_ns))
            .or_else(|| {
                self.by_key
                    .iter()
                    .filter(|((p, _), _)| *p == pid)
                    .min_by_key(|(k, _)| **k)
                    .map(|(_, c)| c)
            })
            .copied()
            .unwrap_or(PALETTE[PALETTE.len() - 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{KillWindow, ProcLine, WindowLine};

    fn line(pid: u32, peak_kb: u64) -> ProcLine {
        ProcLine {
            pid,
            start_ns: u64::from(pid),
            comm: format!("p{pid}"),
            name: format!("p{pid}"),
            in_job: true,
            parent: None,
            born_ns: None,
            died_ns: None,
            peak_kb,
            peak_ns: 0,
            oom_killed: false,
            rss: Default::default(),
            pinned: false,
            exec_ns: None,
        }
    }

    fn wline(pid: u32) -> WindowLine {
        WindowLine {
            pid,
            start_ns: u64::from(pid),
            comm: format!("p{pid}"),
            name: format!("p{pid}"),
            in_job: true,
            is_victim: false,
            is_top_grower: false,
            points: vec![],
        }
    }

    #[test]
    fn a_process_keeps_its_colour_across_charts() {
        let mut r = crate::render::fixture::sample_report();
        r.kills.clear();
        // The run chart orders by peak; a kill's window by growth: the
        // same processes in another order.
        r.series.procs = vec![line(1, 300), line(2, 200), line(3, 100)];
        r.series.windows = vec![KillWindow {
            kill_ns: 0,
            start_ns: 0,
            step_ns: 1,
            victim_pid: 0,
            lines: vec![wline(3), wline(4), wline(1)],
            mem_available: vec![],
            mem_total_kb: None,
            cgroup_usage: vec![],
            cgroup_limit_kb: None,
        }];
        let c = Colours::of_page(&r);
        let run: Vec<&str> = [1, 2, 3].iter().map(|&p| c.of(p, u64::from(p))).collect();
        assert_eq!(run, vec![PALETTE[0], PALETTE[1], PALETTE[2]]);
        assert_eq!(c.of(3, 3), PALETTE[2], "its run-chart colour in the window");
        assert_eq!(c.of(4, 4), PALETTE[3], "a new process, a new colour");
        assert_eq!(c.of(1, 1), PALETTE[0]);
    }
}
