//! The status line, its warnings, and the schedule they keep.

use trainbpf_common as common;
use trainbpf_report::decode;

use super::*;
use crate::record::observe::Observe as _;
// The warning's text is the report's, so that both say the same.
use trainbpf_report::model::leaks::Verdict;
use trainbpf_report::render::text::warning_text;

/// A kernel record as the collector hands it on: decoded, or not at all.
fn feed(s: &mut Status, kind: u16, bytes: &[u8]) {
    if let Ok(t) = decode::decode(kind, bytes, 4) {
        s.observe(&t);
    }
}

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
    feed(&mut s, common::KIND_MEM, &[0; 8]);
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
    feed(s, c::KIND_MEM, &decode::pod_bytes(&m));
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

/// `--quiet` (or no terminal) and a drawn line
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
        feed(&mut s, c::KIND_MEM, &decode::pod_bytes(&m));
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
