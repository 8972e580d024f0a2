//! The status line `record` keeps on a terminal while the job runs: time
//! elapsed, the processes climbing most, and when a suspected leak reaches
//! the limit. Redrawn once a second in place on stderr (`\r`), only when
//! stderr is a terminal; `record --quiet` turns it off.
//!
//! It runs the report's leak model (`model::leaks::Live`) on the records as
//! the collector writes them, so that what it says is what `report` will.

use std::{
    io::{IsTerminal as _, Write as _},
    time::{Duration, Instant},
};

use trainbpf_common as common;

use crate::{
    decode::{self, Event, Timed},
    model::leaks::{Domain, LeakOptions, Live, Projection, Trend},
    pressure::Pressure,
    render::{human_kb, human_rate, text::eta},
};

/// Growers named on the line.
const TOP: usize = 3;
const EVERY: Duration = Duration::from_secs(1);

pub struct Status {
    /// `None` when off: quiet, or not a terminal.
    on: Option<On>,
}

struct On {
    started: Instant,
    last_draw: Option<Instant>,
    /// Made at the first memory record, which tells whether the records
    /// carry honest memory.
    live: Option<Live>,
    leaks: LeakOptions,
    page_kb: u64,
    drawn: bool,
}

impl Status {
    /// `leaks`: what counts as a suspected leak.
    pub fn new(quiet: bool, leaks: LeakOptions) -> Status {
        let on = !quiet && std::io::stderr().is_terminal();
        Status {
            on: on.then(|| On {
                started: Instant::now(),
                last_draw: None,
                live: None,
                leaks,
                page_kb: (page_size() / 1024).max(1),
                drawn: false,
            }),
        }
    }

    /// A kernel record, as the collector writes it.
    pub fn on_record(&mut self, kind: u16, bytes: &[u8]) {
        let Some(on) = &mut self.on else { return };
        if !matches!(
            kind,
            common::KIND_MEM | common::KIND_FORK | common::KIND_EXIT
        ) {
            return;
        }
        let Ok(t) = decode::decode(kind, bytes, on.page_kb) else {
            return;
        };
        if on.live.is_none()
            && let Event::Mem {
                alloc_kb, freed_kb, ..
            } = &t.event
        {
            let honest = *alloc_kb > 0 || *freed_kb > 0;
            on.live = Some(Live::new(on.leaks.clone(), honest));
        }
        if let Some(live) = &mut on.live {
            live.observe(&t);
        }
    }

    /// A pressure sample at `ts_ns` (CLOCK_MONOTONIC).
    pub fn on_pressure(&mut self, ts_ns: u64, p: &Pressure) {
        if let Some(live) = self.on.as_mut().and_then(|o| o.live.as_mut()) {
            live.observe(&Timed {
                ts_ns,
                event: Event::Pressure(Box::new(p.clone())),
            });
        }
    }

    /// Redraws the line, at most once a second.
    pub fn tick(&mut self) {
        let Some(on) = &mut self.on else { return };
        if on.last_draw.is_some_and(|t| t.elapsed() < EVERY) {
            return;
        }
        on.last_draw = Some(Instant::now());
        let (trends, projection) = on
            .live
            .as_ref()
            .map_or((Vec::new(), None), |l| l.snapshot(TOP));
        let s = line(
            on.started.elapsed(),
            &trends,
            projection.as_ref(),
            stderr_width(),
        );
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{s}");
        let _ = err.flush();
        on.drawn = true;
    }

    /// Erases the line, so that what follows starts clean.
    pub fn clear(&mut self) {
        if let Some(on) = &mut self.on
            && on.drawn
        {
            eprint!("\r\x1b[2K");
            on.drawn = false;
        }
    }
}

/// `trainbpf 1:02:03 | OOM in ~14 min (cgroup limit 400 MiB) | python3(700) +8 MiB/s leak, …`,
/// cut to `width` columns.
pub fn line(
    elapsed: Duration,
    trends: &[Trend],
    projection: Option<&Projection>,
    width: usize,
) -> String {
    let secs = elapsed.as_secs();
    let clock = if secs >= 3600 {
        format!("{}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
    } else {
        format!("{}:{:02}", secs / 60, secs % 60)
    };
    let mut parts = vec![format!("trainbpf {clock}")];
    let growers: Vec<String> = trends
        .iter()
        .filter(|t| t.slope_kb_per_s > 0.0)
        .map(|t| {
            format!(
                "{}({}) +{}{}",
                t.comm,
                t.pid.unwrap_or(0),
                human_rate(t.slope_kb_per_s),
                if t.is_leak() { " leak" } else { "" }
            )
        })
        .collect();
    // The projection before the growers: a narrow terminal cuts the end.
    parts.push(match projection {
        Some(p) if p.seconds.is_some() => format!(
            "OOM in {} ({} {})",
            eta(p.seconds.unwrap_or(0.0)),
            match p.domain {
                Domain::Cgroup => "cgroup limit",
                Domain::Machine => "RAM+swap",
            },
            human_kb(p.limit_kb)
        ),
        _ => "no leak suspected".into(),
    });
    parts.push(if growers.is_empty() {
        "nothing growing".into()
    } else {
        growers.join(", ")
    });
    let s = parts.join(" | ");
    match s.char_indices().nth(width.saturating_sub(1)) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { nix::libc::sysconf(nix::libc::_SC_PAGESIZE) };
    if n > 0 { n as u64 } else { 4096 }
}

/// Columns of the terminal on stderr, less one so that the line never
/// wraps; 80 when unknown.
fn stderr_width() -> usize {
    let mut ws = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ fills a winsize; a non-terminal fd just fails.
    let ok = unsafe { nix::libc::ioctl(2, nix::libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_col >= 20 {
        ws.ws_col as usize - 1
    } else {
        79
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::leaks::Verdict;

    fn trend(pid: u32, comm: &str, slope: f64, verdict: Verdict) -> Trend {
        Trend {
            pid: Some(pid),
            start_ns: 1,
            comm: comm.into(),
            group: None,
            members: 1,
            alive: true,
            slope_kb_per_s: slope,
            fit: 0.95,
            since_ns: 0,
            until_ns: 0,
            growth_kb: 0,
            size_kb: 0,
            verdict,
        }
    }

    #[test]
    fn line_names_growers_and_the_time_to_oom() {
        let t = vec![
            trend(700, "python3", 8192.0, Verdict::Leak),
            trend(812, "pt_data_worker", 512.0, Verdict::TooShort),
            trend(813, "pt_data_worker", -5.0, Verdict::NotClimbing),
        ];
        let p = Projection {
            domain: Domain::Cgroup,
            limit_kb: 400 << 10,
            usage_kb: 300 << 10,
            slope_kb_per_s: 8192.0,
            seconds: Some(840.0),
        };
        assert_eq!(
            line(Duration::from_secs(3723), &t, Some(&p), 200),
            "trainbpf 1:02:03 | OOM in ~14 min (cgroup limit 400 MiB) | python3(700) +8 MiB/s leak, pt_data_worker(812) +512 KiB/s"
        );
        assert_eq!(
            line(Duration::from_secs(65), &[], None, 200),
            "trainbpf 1:05 | no leak suspected | nothing growing"
        );
        let cut = line(Duration::from_secs(65), &t, Some(&p), 40);
        assert_eq!(cut.chars().count(), 40, "{cut}");
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn quiet_or_not_a_terminal_is_off() {
        let mut s = Status::new(true, LeakOptions::default());
        assert!(s.on.is_none());
        s.on_record(common::KIND_MEM, &[0; 8]);
        s.tick();
        s.clear();
    }
}
