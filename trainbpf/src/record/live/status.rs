//! The status line `record` keeps on a terminal while the job runs: time
//! elapsed, the processes climbing most, and when a suspected leak reaches
//! the limit. Redrawn once a second in place on stderr (`\r`), only when
//! stderr is a terminal; `record --quiet` turns it off.
//!
//! It runs the report's leak model (`model::leaks::Live`) on the records as
//! the collector writes them, so that what it says is what `report` will.
//! The model is asked on one schedule whether or not a line is drawn: the
//! warnings it gives, which go into the recording, and the projection
//! `--metrics` serves are the same with `--quiet`, without a terminal and
//! with one. Only the drawing differs. The report reads the warnings as
//! evidence; no diagnosis depends on them.

use std::{
    io::{IsTerminal as _, Write as _},
    time::{Duration, Instant},
};

use trainbpf_report::{
    decode::{Event, LeakWarning, MemSample, Timed, samples::Pressure},
    model::leaks::{Domain, LeakOptions, Live, Projection, Trend},
    term::escape as esc,
    units::{clock, eta, human_kb, human_rate},
};

/// Growers named on the line.
const TOP: usize = 3;
/// How often the leak model is asked, and the line redrawn where there is
/// one.
const EVERY: Duration = Duration::from_secs(1);
/// Memory projected to run out within this many seconds is warned of,
/// from any steady climb: a leak that will kill the job in a minute need
/// not have climbed for `--leak-span` first.
const RUNNING_OUT_S: f64 = 300.0;

pub struct Status {
    started: Instant,
    /// The leak model, fed whether or not a line is drawn: a suspected leak
    /// is warned of on stderr (and in the recording) before any kill. Made
    /// at the first memory record, which tells whether the records carry
    /// honest memory.
    live: Option<Live>,
    leaks: LeakOptions,
    /// The line on the terminal; `None` when quiet or not a terminal.
    draw: Option<Draw>,
    last_check: Option<Instant>,
    /// What the last look at the leak model took.
    last_cost: Duration,
    /// Leaks already warned of: (pid, start) or the group's role.
    warned: std::collections::HashSet<(Option<u32>, u64, Option<String>)>,
    /// Memory running out, warned of: the steepest climber's key, and the
    /// time to the limit said then. Said again only once that halves.
    running_out: std::collections::HashMap<(Option<u32>, u64), f64>,
    /// Seconds to the limit at the last look (`record --metrics`).
    projection_s: Option<f64>,
}

struct Draw {
    drawn: bool,
    /// stderr; a sink in tests.
    out: Box<dyn std::io::Write + Send>,
}

impl Status {
    /// `leaks`: what counts as a suspected leak.
    pub fn new(quiet: bool, leaks: LeakOptions) -> Status {
        let on = !quiet && std::io::stderr().is_terminal();
        Status {
            started: Instant::now(),
            live: None,
            leaks,
            draw: on.then(|| Draw {
                drawn: false,
                out: Box::new(std::io::stderr()),
            }),
            last_check: None,
            last_cost: Duration::ZERO,
            warned: Default::default(),
            running_out: Default::default(),
            projection_s: None,
        }
    }

    /// A pressure sample at `ts_ns` (CLOCK_MONOTONIC).
    pub fn on_pressure(&mut self, ts_ns: u64, p: &Pressure) {
        if let Some(live) = self.live.as_mut() {
            live.observe(&Timed {
                ts_ns,
                event: Event::Pressure(Box::new(p.clone())),
            });
        }
    }

    /// Asks the leak model, at most once a second, and returns the leaks
    /// suspected since the last time, each once; redraws the line where
    /// there is one.
    pub fn tick(&mut self) -> Vec<LeakWarning> {
        self.tick_at(Instant::now())
    }

    fn tick_at(&mut self, now: Instant) -> Vec<LeakWarning> {
        // A fit per live series: on a machine-wide recording of a thousand
        // processes that takes a while, so the interval stretches to keep
        // it near half a percent of a core. Drawn or not, the same
        // schedule: what is warned of must not depend on a terminal.
        let every = EVERY.max(self.last_cost * 200);
        if self
            .last_check
            .is_some_and(|t| now.saturating_duration_since(t) < every)
        {
            return Vec::new();
        }
        self.last_check = Some(now);
        let t0 = Instant::now();
        let (trends, projection) = self
            .live
            .as_ref()
            .map_or((Vec::new(), None), |l| l.snapshot(TOP.max(8)));
        let soon = self.live.as_ref().and_then(|l| l.running_out(&trends));
        self.last_cost = t0.elapsed();
        self.projection_s = projection.as_ref().and_then(|p| p.seconds);
        let mut out = Vec::new();
        for t in trends.iter().filter(|t| t.is_leak() && t.alive) {
            if self.warned.insert((t.pid, t.start_ns, t.group.clone())) {
                out.push(warning(t, projection.as_ref()));
            }
        }
        if let Some(w) = soon.and_then(|p| self.running_out(&trends, &p)) {
            out.push(w);
        }
        if let Some(d) = &mut self.draw {
            let top: Vec<Trend> = trends.into_iter().take(TOP).collect();
            let s = line(
                self.started.elapsed(),
                &top,
                projection.as_ref(),
                stderr_width(),
            );
            // The line's names are escaped; this guards the rest of it. A
            // terminal gone is no reason to stop recording.
            let _ = write!(d.out, "\r\x1b[2K{}", trainbpf_report::term::sanitize(&s));
            let _ = d.out.flush();
            d.drawn = true;
        }
        out
    }

    /// Seconds until memory reaches its limit at the rate of the steady
    /// climbs, at the last look; `None` when nothing climbs.
    pub fn projection_seconds(&self) -> Option<f64> {
        self.projection_s
    }

    /// Erases the line, so that what follows starts clean.
    pub fn clear(&mut self) {
        if let Some(d) = &mut self.draw
            && d.drawn
        {
            let _ = write!(d.out, "\r\x1b[2K");
            let _ = d.out.flush();
            d.drawn = false;
        }
    }
}

impl Status {
    /// The warning that memory runs out within [`RUNNING_OUT_S`] at the
    /// rate of every steady climb (`p`, from `trends`), naming the
    /// steepest: once per climber, again when the time left has halved.
    /// None when every climb is a suspected leak: its leak warning says
    /// when the limit comes.
    fn running_out(&mut self, trends: &[Trend], p: &Projection) -> Option<LeakWarning> {
        let secs = p.seconds.filter(|&s| s <= RUNNING_OUT_S)?;
        let climbing = || trends.iter().filter(|t| t.is_climbing() && t.alive);
        // Suspected leaks are warned of as leaks, with this projection.
        if climbing().all(Trend::is_leak) {
            return None;
        }
        let top = climbing().max_by(|a, b| a.slope_kb_per_s.total_cmp(&b.slope_kb_per_s))?;
        let key = (top.pid, top.start_ns);
        // Under ten seconds a new warning could not be acted on.
        if self
            .running_out
            .get(&key)
            .is_some_and(|&said| secs > said / 2.0 || secs < 10.0)
        {
            return None;
        }
        self.running_out.insert(key, secs);
        Some(LeakWarning {
            slope_bytes_per_s: (p.slope_kb_per_s.max(0.0) * 1024.0) as u64,
            running_out: true,
            ..warning(top, Some(p))
        })
    }
}

/// The record of a warning about `t`.
fn warning(t: &Trend, p: Option<&Projection>) -> LeakWarning {
    LeakWarning {
        pid: t.pid,
        start_ns: t.start_ns,
        comm: t.comm.clone(),
        group: t.group.clone(),
        members: t.members as u64,
        slope_bytes_per_s: (t.slope_kb_per_s.max(0.0) * 1024.0) as u64,
        fit_permille: (t.fit.clamp(0.0, 1.0) * 1000.0).round() as u32,
        since_ns: t.since_ns,
        projected_oom_s: p.and_then(|p| p.seconds).map(|s| s.round() as u64),
        limit_kb: p.map(|p| p.limit_kb),
        limit_of: p.map(|p| {
            match p.domain {
                Domain::Cgroup => "cgroup",
                Domain::Machine => "machine",
            }
            .to_string()
        }),
        running_out: false,
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
    let mut parts = vec![format!("trainbpf {}", clock(secs))];
    let growers: Vec<String> = trends
        .iter()
        .filter(|t| t.slope_kb_per_s > 0.0)
        .map(|t| {
            format!(
                "{}({}) +{}{}",
                esc(&t.comm),
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
mod tests;

/// The leak model sees each process's memory, and its forks and exits.
impl crate::record::observe::Observe for Status {
    fn observe(&mut self, t: &Timed) {
        if !matches!(
            t.event,
            Event::Mem(_) | Event::Fork { .. } | Event::Exit { .. }
        ) {
            return;
        }
        if self.live.is_none()
            && let Event::Mem(MemSample {
                alloc_kb, freed_kb, ..
            }) = &t.event
        {
            let honest = *alloc_kb > 0 || *freed_kb > 0;
            self.live = Some(Live::new(self.leaks.clone(), honest));
        }
        if let Some(live) = &mut self.live {
            live.observe(t);
        }
    }
}
