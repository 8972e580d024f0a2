use std::io::Cursor;

use trainbpf_common as c;
use trainbpf_report::{decode::pod_bytes, fuzzing::hdr, recording::RecordingHeader};

use super::*;

/// A record with every field zero.
fn zeroed<T: Copy>() -> T {
    // SAFETY: only used for trainbpf-common's records, plain integer
    // #[repr(C)] structs, for which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

const HOUR: u64 = 3600 * SEC;

fn mem(w: &mut Writer<Vec<u8>>, tgid: u32, ts: u64, anon_pages: i64, net_pages: u64) {
    let mut m: c::MemEvent = zeroed();
    m.hdr = hdr(c::KIND_MEM, tgid, ts);
    m.counters[c::MM_ANONPAGES] = anon_pages;
    m.alloc_pages = net_pages + 100;
    m.freed_pages = 100;
    w.record(c::KIND_MEM, &pod_bytes(&m));
}

/// Two hours of two processes sampled every second: 700 climbs steadily,
/// 701 saws up to a brief peak in the 10th second of each minute; 702
/// is forked at 30 min and exits at 31; at 45 min 700 is OOM-killed.
fn two_hours() -> Vec<u8> {
    let header = RecordingHeader {
        page_size: 4096,
        ..Default::default()
    };
    let mut w = Writer::new(Vec::new(), &header).unwrap();
    for s in 0..2 * 3600u64 {
        let ts = HOUR + s * SEC;
        mem(&mut w, 700, ts, 1000 + s as i64, 1000 + s);
        let saw = if s % 60 == 10 { 50_000 } else { 2_000 };
        mem(&mut w, 701, ts, saw, saw as u64);
        let (k, b) = decode::encode_user(
            ts,
            UserBody::Note(format!("note {s}")), // kept whatever its age
        );
        w.record(k, &b);
        if s == 1800 {
            let mut f: c::ForkEvent = zeroed();
            f.hdr = hdr(c::KIND_FORK, 702, ts);
            f.parent_tgid = 700;
            w.record(c::KIND_FORK, &pod_bytes(&f));
        }
        if s == 1860 {
            let mut e: c::ExitEvent = zeroed();
            e.hdr = hdr(c::KIND_EXIT, 702, ts);
            w.record(c::KIND_EXIT, &pod_bytes(&e));
        }
        if s == 2700 {
            let mut o: c::OomEvent = zeroed();
            o.hdr = hdr(c::KIND_OOM_VICTIM, 700, ts);
            o.victim_pid = 700;
            w.record(c::KIND_OOM_VICTIM, &pod_bytes(&o));
        }
        w.flush().unwrap();
    }
    w.into_inner()
}

fn run(input: &[u8], policy: &Policy, now_ns: u64) -> (Vec<u8>, Stats) {
    compact(
        Cursor::new(input),
        Cursor::new(input),
        Vec::new(),
        policy,
        now_ns,
        1 << 30,
        input.len() as u64,
        false,
    )
    .unwrap()
}

/// Every record of the output, decoded, in file order.
fn events(bytes: &[u8]) -> Vec<decode::Timed> {
    let mut r = Reader::new(Cursor::new(bytes)).unwrap();
    let v: Vec<_> = r.by_ref().collect();
    assert!(r.stop().is_none() && r.skipped().count == 0 && r.undecodable == 0);
    v
}

/// A victim's exit record, right after its kill and above all its
/// samples, folded at a second's buckets in the kill's window: its
/// growth up to the kill stays beside it.
#[test]
fn a_victims_exit_record_does_not_replace_its_growth_before_the_kill() {
    let header = RecordingHeader {
        page_size: 4096,
        ..Default::default()
    };
    let mut w = Writer::new(Vec::new(), &header).unwrap();
    let ms = SEC / 1000;
    for i in 0..90u64 {
        mem(
            &mut w,
            800,
            10 * SEC + i * 10 * ms,
            1000 + 700 * i as i64,
            1000 + 700 * i,
        );
    }
    let kill = 10 * SEC + 950 * ms;
    let mut o: c::OomEvent = zeroed();
    o.hdr = hdr(c::KIND_OOM_VICTIM, 800, kill);
    o.victim_pid = 800;
    w.record(c::KIND_OOM_VICTIM, &pod_bytes(&o));
    mem(&mut w, 800, kill + 10 * ms, 70_000, 70_000);
    w.flush().unwrap();
    let input = w.into_inner();
    let policy = Policy {
        tiers: vec![Tier {
            older_than_ns: SEC,
            bucket_ns: 60 * SEC,
        }],
        protect_bucket_ns: SEC,
    };
    let (out, _) = run(&input, &policy, 20 * SEC);
    let kept = mem_samples(&events(&out), 800);
    let before: Vec<_> = kept.iter().filter(|s| s.0 < kill).collect();
    assert!(
        before.iter().any(|s| s.1 == (1000 + 700 * 89) * 4),
        "its last and peak sample before the kill: {kept:?}"
    );
    assert!(
        kept.iter().any(|s| s.0 > kill),
        "and its exit record: {kept:?}"
    );
}

fn mem_samples(ev: &[decode::Timed], tgid: u32) -> Vec<(u64, u64, u64)> {
    ev.iter()
        .filter_map(|t| match &t.event {
            Event::Mem(MemSample {
                proc,
                rss,
                alloc_kb,
                ..
            }) if proc.tgid == tgid => Some((t.ts_ns, rss.anon_kb, *alloc_kb)),
            _ => None,
        })
        .collect()
}

#[test]
fn the_ladder_tightens_step_by_step() {
    let l = Policy::ladder(HOUR);
    assert_eq!(l[0].bucket_for(HOUR - 1), None, "recent: full resolution");
    assert_eq!(l[0].bucket_for(HOUR), Some(60 * SEC));
    assert_eq!(l[0].bucket_for(25 * HOUR), Some(600 * SEC));
    assert_eq!(l[0].protect_bucket_ns, 0, "kill windows whole");
    assert_eq!(l[1].protect_bucket_ns, SEC);
    assert_eq!(l[2].bucket_for(2 * HOUR), Some(600 * SEC));
    assert_eq!(l[3].bucket_for(2 * HOUR), Some(3600 * SEC));
    assert_eq!(l[4].full_span_ns(), HOUR / 2);
    assert_eq!(l[4].protect_bucket_ns, 10 * SEC);
    assert_eq!(l.last().unwrap().full_span_ns(), HOUR / 64);
    for p in l.windows(2) {
        assert!(p[1].full_span_ns() <= p[0].full_span_ns());
    }
}

#[test]
fn older_samples_fold_to_minutes_and_the_rest_stays() {
    let input = two_hours();
    let now = 3 * HOUR; // the last record's time
    let (out, st) = run(&input, &Policy::ladder(HOUR)[0], now);
    let before = events(&input);
    let after = events(&out);
    assert!(
        out.len() < input.len() * 2 / 3,
        "{} of {}",
        out.len(),
        input.len()
    );
    // The last hour is whole.
    let recent = |v: &[(u64, u64, u64)]| v.iter().filter(|s| s.0 >= 2 * HOUR).count();
    assert_eq!(recent(&mem_samples(&after, 700)), 3600);
    // The first hour: a minute's samples or so each, except the five
    // minutes before the kill at 90 min, whole.
    let old: Vec<_> = mem_samples(&after, 700)
        .into_iter()
        .filter(|s| s.0 < 2 * HOUR)
        .collect();
    let protected = old
        .iter()
        .filter(|s| (HOUR + 2400 * SEC..=HOUR + 2700 * SEC).contains(&s.0))
        .count();
    assert_eq!(protected, 301, "the 5 minutes before the kill");
    // A steady climber's last, peak and peak-growth samples are one.
    assert_eq!(
        old.len(),
        301 + 55,
        "one a minute outside the kill's window"
    );
    // The sawtooth's peaks survive: each minute's peak of 701.
    let peaks = mem_samples(&after, 701)
        .iter()
        .filter(|s| s.1 == 50_000 * 4)
        .count();
    assert_eq!(peaks, 120, "every minute's peak");
    // Cumulative counters stay exact at each kept sample: the last
    // sample of each minute still says how much 700 allocated by then.
    for s in mem_samples(&after, 700) {
        let secs = (s.0 - HOUR) / SEC;
        assert_eq!(s.2, (1100 + secs) * 4, "alloc at {secs}s");
    }
    // Nothing but samples went: notes, fork, exit and the kill.
    let not_mem = |v: &[decode::Timed]| {
        v.iter()
            .filter(|t| !matches!(t.event, Event::Mem(MemSample { .. }) | Event::Compacted(_)))
            .map(|t| format!("{:?}", t))
            .collect::<Vec<_>>()
    };
    assert_eq!(not_mem(&before), not_mem(&after));
    assert_eq!(
        st.samples_folded as usize,
        before.len() - (after.len() - 1),
        "counted"
    );
    // In file order, still.
    assert!(after.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
    // And it says so.
    let Some(Event::Compacted(cp)) = after.last().map(|t| &t.event) else {
        panic!("no compaction record")
    };
    assert_eq!(cp.count, 1);
    assert_eq!(cp.full_from_ns, 2 * HOUR);
    assert_eq!(cp.tiers, vec![[3600, 60], [86400, 600]]);
    assert_eq!(cp.samples_folded, st.samples_folded);
    assert_eq!(cp.bytes_before, input.len() as u64);
}

#[test]
fn compacting_again_is_stable_and_coarser_policies_fold_more() {
    let input = two_hours();
    let now = 3 * HOUR;
    let l = Policy::ladder(HOUR);
    let (once, _) = run(&input, &l[0], now);
    let (twice, st2) = run(&once, &l[0], now);
    assert_eq!(
        st2.samples_folded, 0,
        "nothing more to fold at the same policy"
    );
    let a = events(&once);
    let b = events(&twice);
    assert_eq!(a.len(), b.len());
    let Some(Event::Compacted(cp)) = b.last().map(|t| &t.event) else {
        panic!()
    };
    assert_eq!(cp.count, 2, "one record, counting both");
    assert_eq!(
        b.iter()
            .filter(|t| matches!(t.event, Event::Compacted(_)))
            .count(),
        1
    );
    let (coarser, st3) = run(&once, &l[3], now);
    assert!(st3.samples_folded > 0);
    assert!(coarser.len() < once.len());
    // The kill's window survives, at a second's resolution (the
    // fixture's own).
    let protected = mem_samples(&events(&coarser), 700)
        .iter()
        .filter(|s| (HOUR + 2400 * SEC..=HOUR + 2700 * SEC).contains(&s.0))
        .count();
    assert_eq!(protected, 301);
    // At ten seconds', a tenth of it, with 701's peaks.
    let strict = l.last().unwrap();
    assert_eq!(strict.protect_bucket_ns, 10 * SEC);
    let (tight, _) = run(&once, strict, now);
    let ev = events(&tight);
    let in_window = |v: Vec<(u64, u64, u64)>| {
        v.into_iter()
            .filter(|s| (HOUR + 2400 * SEC..=HOUR + 2700 * SEC).contains(&s.0))
            .collect::<Vec<_>>()
    };
    let w700 = in_window(mem_samples(&ev, 700));
    assert!((30..=32).contains(&w700.len()), "{}", w700.len());
    let w701 = in_window(mem_samples(&ev, 701));
    assert_eq!(
        w701.iter().filter(|s| s.1 == 50_000 * 4).count(),
        5,
        "one peak a minute"
    );
    let Some(Event::Compacted(cp)) = ev.last().map(|t| &t.event) else {
        panic!()
    };
    assert_eq!(cp.kill_window_bucket_s, 10);
}

#[test]
fn a_cut_short_input_compacts_what_is_readable() {
    let input = two_hours();
    let cut = &input[..input.len() - 100];
    let (out, st) = run(cut, &Policy::ladder(HOUR)[0], 3 * HOUR);
    assert!(st.records_in > 0);
    let ev = events(&out);
    assert!(matches!(ev.last().unwrap().event, Event::Compacted(_)));
}
