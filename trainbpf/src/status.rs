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

use trainbpf_common as common;

use crate::{
    decode::{self, Event, LeakWarning, Timed, samples::Pressure},
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
    page_kb: u64,
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
            page_kb: (page_size() / 1024).max(1),
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

    /// A kernel record, as the collector writes it.
    pub fn on_record(&mut self, kind: u16, bytes: &[u8]) {
        if !matches!(
            kind,
            common::KIND_MEM | common::KIND_FORK | common::KIND_EXIT
        ) {
            return;
        }
        let Ok(t) = decode::decode(kind, bytes, self.page_kb) else {
            return;
        };
        if self.live.is_none()
            && let Event::Mem {
                alloc_kb, freed_kb, ..
            } = &t.event
        {
            let honest = *alloc_kb > 0 || *freed_kb > 0;
            self.live = Some(Live::new(self.leaks.clone(), honest));
        }
        if let Some(live) = &mut self.live {
            live.observe(&t);
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
            let _ = write!(d.out, "\r\x1b[2K{}", crate::term::sanitize(&s));
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
    // The warning's text is the report's, so that both say the same.
    use crate::model::leaks::Verdict;
    use crate::render::text::warning_text;

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
    fn names_on_the_line_and_in_warnings_are_escaped() {
        let t = vec![trend(700, "\x1b]0;pwned\x07", 8192.0, Verdict::Leak)];
        let l = line(Duration::from_secs(5), &t, None, 200);
        assert!(l.contains("\\x1b]0;pwned\\x07(700) +8 MiB/s leak"), "{l}");
        let w = warning_text(&warning(&t[0], None), 1);
        assert!(!w.contains('\x1b'), "{w}");
    }

    #[test]
    fn quiet_or_not_a_terminal_draws_nothing_but_still_watches() {
        let mut s = Status::new(true, LeakOptions::default());
        assert!(s.draw.is_none());
        s.on_record(common::KIND_MEM, &[0; 8]);
        assert_eq!(s.tick(), vec![], "nothing seen, nothing to warn of");
        s.clear();
    }

    #[test]
    fn a_warning_names_the_leak_and_the_time_to_the_limit() {
        let t = trend(700, "python3", 2048.0, Verdict::Leak);
        let p = Projection {
            domain: Domain::Cgroup,
            limit_kb: 100 << 10,
            usage_kb: 40 << 10,
            slope_kb_per_s: 2048.0,
            seconds: Some(30.0),
        };
        let w = warning(&t, Some(&p));
        assert_eq!(w.slope_bytes_per_s, 2 << 20);
        assert_eq!(w.fit_permille, 950);
        assert_eq!(w.projected_oom_s, Some(30));
        assert_eq!(
            warning_text(&w, 40_000_000_000),
            "leak suspected: python3 (pid 700) has climbed +2 MiB/s for 40 s (fit 0.95); at this rate the job's cgroup limit of 100 MiB is reached in ~30 s"
        );
        let bare = warning(&t, None);
        assert_eq!(
            warning_text(&bare, 40_000_000_000),
            "leak suspected: python3 (pid 700) has climbed +2 MiB/s for 40 s (fit 0.95)"
        );
    }

    /// Second `i` of a climb of 4 MiB/s from 1 s on, a record a second,
    /// under a 200 MiB cgroup whose usage follows.
    fn second(s: &mut Status, i: u64) {
        use trainbpf_common as c;
        let ts = 1_000_000_000 + i * 1_000_000_000;
        // SAFETY: plain integer #[repr(C)] struct.
        let mut m: c::MemEvent = unsafe { std::mem::zeroed() };
        m.hdr = c::Header {
            kind: c::KIND_MEM,
            flags: c::FLAG_IN_JOB,
            tgid: 700,
            ts_ns: ts,
            start_ns: 5,
        };
        m.counters[c::MM_ANONPAGES] = 1000 + i as i64 * 1024;
        m.alloc_pages = 1000 + i * 1024;
        m.comm = *b"python3\0\0\0\0\0\0\0\0\0";
        s.on_record(c::KIND_MEM, &decode::pod_bytes(&m));
        let p = Pressure {
            mem_total_kb: 64 << 20,
            mem_available_kb: 60 << 20,
            cgroup: Some(decode::samples::CgroupPressure {
                usage_kb: 4000 + i * 4096,
                limit_kb: Some(200 << 10),
                ..Default::default()
            }),
            ..Default::default()
        };
        s.on_pressure(ts, &p);
    }

    /// `secs` seconds of that climb; the warnings of a `tick` after each.
    fn climbing_toward(s: &mut Status, secs: u64) -> Vec<(u64, LeakWarning)> {
        let mut said = Vec::new();
        for i in 0..secs {
            second(s, i);
            s.last_check = None;
            said.extend(s.tick().into_iter().map(|w| (i + 1, w)));
        }
        said
    }

    /// What a line was drawn to, for a test to read.
    #[derive(Clone, Default)]
    struct Screen(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Screen {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Issue 24, finding 9: `--quiet` (or no terminal) and a drawn line
    /// ask the leak model on one schedule, so that the warnings written
    /// into the recording, and the projection `--metrics` serves, are the
    /// same: only the drawing differs.
    #[test]
    fn drawn_or_quiet_the_same_warnings_at_the_same_looks() {
        let opts = LeakOptions {
            min_span_ns: 10_000_000_000,
            ..Default::default()
        };
        let mut quiet = Status::new(true, opts.clone());
        assert!(quiet.draw.is_none());
        let mut drawn = Status::new(true, opts);
        let screen = Screen::default();
        drawn.draw = Some(Draw {
            drawn: false,
            out: Box::new(screen.clone()),
        });
        let t0 = Instant::now();
        let (mut said, mut looks) = (0, 0);
        // Ticks four times a second, as the collector's may come, over
        // 45 s of the climb.
        for step in 0..45 * 4u32 {
            if step % 4 == 0 {
                second(&mut quiet, u64::from(step / 4));
                second(&mut drawn, u64::from(step / 4));
            }
            let now = t0 + Duration::from_millis(250) * step;
            // The stretch for a slow look is measured: the same here.
            quiet.last_cost = Duration::ZERO;
            drawn.last_cost = Duration::ZERO;
            let (a, b) = (quiet.tick_at(now), drawn.tick_at(now));
            assert_eq!(a, b, "at {step}");
            assert_eq!(quiet.last_check, drawn.last_check, "at {step}");
            assert_eq!(quiet.projection_s, drawn.projection_s, "at {step}");
            said += a.len();
            looks += usize::from(quiet.last_check == Some(now));
        }
        assert!(said >= 1, "the climb was warned of");
        assert_eq!(looks, 45, "a look a second, drawn or not");
        let shown = String::from_utf8(screen.0.lock().unwrap().clone()).unwrap();
        assert_eq!(shown.matches("\r\x1b[2Ktrainbpf ").count(), 45, "{shown}");
        assert!(shown.contains("python3(700) +4 MiB/s"), "{shown}");
        drawn.clear();
        assert!(screen.0.lock().unwrap().ends_with(b"\r\x1b[2K"));
    }

    #[test]
    fn memory_running_out_is_warned_of_before_the_leak_span() {
        // The default span, five minutes: no leak in 45 s, yet the limit
        // is under a minute away.
        let mut s = Status::new(true, LeakOptions::default());
        let said = climbing_toward(&mut s, 45);
        assert!(!said.is_empty(), "warned");
        assert!(said.iter().all(|(_, w)| w.running_out), "{said:?}");
        let (at, w) = &said[0];
        assert!(
            *at >= 20 && *at <= 30,
            "once the climb is 20 s long: {said:?}"
        );
        assert_eq!(w.pid, Some(700));
        assert_eq!(w.limit_kb, Some(200 << 10));
        let eta = w.projected_oom_s.unwrap();
        assert!((20..=40).contains(&eta), "{said:?}");
        let text = warning_text(w, *at * 1_000_000_000);
        assert!(
            text.starts_with(&format!(
                "memory will run out in ~{eta} s: python3 (pid 700), +4 MiB/s for "
            )),
            "{text}"
        );
        assert!(
            text.ends_with(", the job's cgroup limit of 200 MiB"),
            "{text}"
        );
        // Said again only when the time left has halved: a handful, not
        // one a check.
        assert!(said.len() <= 3, "{said:?}");
        for pair in said.windows(2) {
            let (a, b) = (&pair[0].1, &pair[1].1);
            assert!(
                b.projected_oom_s.unwrap() * 2 <= a.projected_oom_s.unwrap() + 1,
                "{said:?}"
            );
        }
    }

    #[test]
    fn a_suspected_leak_is_warned_of_as_a_leak_alone() {
        let mut s = Status::new(
            true,
            LeakOptions {
                min_span_ns: 10_000_000_000,
                ..Default::default()
            },
        );
        let said = climbing_toward(&mut s, 45);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(!said[0].1.running_out, "{said:?}");
        assert!(said[0].1.projected_oom_s.is_some(), "{said:?}");
    }

    #[test]
    fn a_steady_leak_is_warned_of_once() {
        use trainbpf_common as c;
        let mut s = Status::new(
            true,
            LeakOptions {
                min_span_ns: 10_000_000_000,
                ..Default::default()
            },
        );
        // 2 MiB/s for 60 s, a record every 2 s.
        for i in 0..30u64 {
            // SAFETY: plain integer #[repr(C)] struct.
            let mut m: c::MemEvent = unsafe { std::mem::zeroed() };
            m.hdr = c::Header {
                kind: c::KIND_MEM,
                flags: c::FLAG_IN_JOB,
                tgid: 700,
                ts_ns: 1_000_000_000 + i * 2_000_000_000,
                start_ns: 5,
            };
            m.counters[c::MM_ANONPAGES] = 1000 + i as i64 * 1024;
            m.alloc_pages = 1000 + i * 1024;
            m.comm = *b"python3\0\0\0\0\0\0\0\0\0";
            s.on_record(c::KIND_MEM, &decode::pod_bytes(&m));
        }
        let w = s.tick();
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].pid, Some(700));
        assert!(
            (w[0].slope_bytes_per_s as f64 - 2.0 * 1048576.0).abs() < 1e5,
            "{w:?}"
        );
        s.last_check = None;
        assert_eq!(s.tick(), vec![], "once");
    }
}
