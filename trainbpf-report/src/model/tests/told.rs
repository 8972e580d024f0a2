//! A kill's line: the recorder's, told at the kill, where it recorded one.

use super::*;
use crate::decode::KillVerdict;

fn told(secs: f64, victim: ProcKey, line: &str) -> Timed {
    at(
        secs,
        Event::Verdict(KillVerdict {
            proc: victim,
            line: line.into(),
        }),
    )
}

/// The report repeats the line the recorder told at the kill (its stderr,
/// the events log and torchelastic's error file said it), so that every
/// place says the same; without one, the model makes its own.
#[test]
fn the_told_line_is_the_reports_verdict() {
    let own = run(leak_run());
    assert!(
        own.kills[0]
            .verdict
            .starts_with("pt_data_worker (pid 812) was OOM-killed"),
        "{}",
        own.kills[0].verdict
    );
    let w = key(812, s(5.0));
    let mut events = leak_run();
    events.push(told(17.1, w, "rank 1 (pid 812) was OOM-killed: as told"));
    // Another process's line, and one of a kill long before: not this one.
    events.push(told(17.1, key(813, s(5.0)), "someone else"));
    events.push(told(9.0, w, "an earlier line"));
    events.sort_by_key(|t| t.ts_ns);
    let r = run(events);
    assert_eq!(
        r.kills[0].verdict,
        "rank 1 (pid 812) was OOM-killed: as told"
    );
}
