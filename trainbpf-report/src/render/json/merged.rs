//! `recordings[]` and `first_failure`, and the JSON of several recordings
//! of one job (`report A.rec B.rec --json`): every recording's kills,
//! deaths and processes, each with its `host` and `recording`.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use crate::model::{self, Merged, Report, merge::Happening};
use crate::render::death_phrase;

use super::{JsonReport, Time, processes};

/// One recording of the job.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Recording {
    /// From the job's start (the earliest first event of any recording, on
    /// the wall clock) to this recording's first event, ms: add it (as
    /// seconds) to this recording's `time_s`, `born_s` and `died_s` to
    /// place them on the job's timeline. 0 for one recording.
    pub(crate) clock_offset_ms: f64,
    /// How precisely its clock anchor (the monotonic and wall clocks read
    /// together when recording began) was taken, ns; null in recordings
    /// made before it was kept. How far two hosts' wall clocks disagree is
    /// not in the recordings.
    pub(crate) clock_uncertainty_ns: Option<u64>,
    /// The host it was recorded on (the header's hostname).
    pub host: String,
    /// Events lost in this recording (as the top-level `lost_events`).
    pub(crate) lost_events: u64,
    /// The file, as given to `report`.
    pub(crate) path: String,
    /// Wall-clock time of its first event; null for an empty recording or
    /// one without a clock anchor.
    pub(crate) started: Option<Time>,
}

impl Recording {
    fn new(rec: &model::merge::Recording, r: &Report) -> Recording {
        Recording {
            clock_offset_ms: (rec.clock_offset_ns / 1_000) as f64 / 1e3,
            clock_uncertainty_ns: rec.anchor_uncertainty_ns,
            host: rec.host.clone(),
            lost_events: r.lost_events(),
            path: rec.path.clone(),
            started: rec.started_ns.map(Time::real),
        }
    }

    /// A single report's own entry.
    pub(super) fn alone(r: &Report) -> Vec<Recording> {
        let job_start = r.first_ns.and_then(|t| r.realtime_ns(t));
        vec![Recording::new(
            &model::merge::Recording::of(r, job_start),
            r,
        )]
    }
}

/// A kill or death across the job.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Failure {
    /// The process's command name.
    pub(crate) comm: String,
    pub(crate) host: String,
    /// `oom_kill` for an OOM kill of a job process, else the death's
    /// `cause` (`signal`, `crash`, `exit` with a nonzero code, ...).
    pub(crate) kind: String,
    /// In words, as the text report says it.
    pub(crate) phrase: String,
    pub(crate) pid: u32,
    /// Its index in `recordings`.
    pub(crate) recording: usize,
    /// Wall clock; null when its recording has no clock anchor.
    pub(crate) time: Option<Time>,
}

/// The first failure across the job, and what the other processes did
/// after it.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct FirstFailure {
    pub(crate) comm: String,
    pub(crate) host: String,
    /// As in `then[]`.
    pub(crate) kind: String,
    pub(crate) phrase: String,
    pub(crate) pid: u32,
    pub(crate) recording: usize,
    /// Failures of other processes after it, each process once, in time
    /// order.
    pub(crate) then: Vec<Failure>,
    pub(crate) time: Option<Time>,
}

fn failure(m: &Merged, h: &Happening) -> Failure {
    let anchored = !m.unanchored.contains(&h.recording);
    let (comm, kind, phrase) = match (m.kill(h), m.death(h)) {
        (Some(k), _) => (
            k.victim.comm.clone(),
            "oom_kill".to_string(),
            "OOM-killed".to_string(),
        ),
        (_, Some(d)) => (
            d.comm.clone(),
            d.cause.as_str().to_string(),
            death_phrase(d),
        ),
        _ => (String::new(), String::new(), String::new()),
    };
    Failure {
        comm,
        host: m.host(h.recording).to_string(),
        kind,
        phrase,
        pid: h.pid,
        recording: h.recording,
        time: anchored.then(|| Time::real(h.at_ns)),
    }
}

fn first_failure(m: &Merged) -> Option<FirstFailure> {
    let f = failure(m, &m.timeline[m.first?]);
    Some(FirstFailure {
        comm: f.comm,
        host: f.host,
        kind: f.kind,
        phrase: f.phrase,
        pid: f.pid,
        recording: f.recording,
        then: m.then.iter().map(|&i| failure(m, &m.timeline[i])).collect(),
        time: f.time,
    })
}

/// Several recordings as one document: the shape of one recording's, with
/// `recordings[]` listing them all, `kills`, `deaths` and `processes` from
/// every recording (on the wall clock, each with its `host` and
/// `recording`), `first_failure`, and `lost_events` summed. The other
/// sections are the first recording's: run `report --json` on each file
/// for its own.
pub(crate) fn render_merged(m: &Merged) -> Value {
    let Some(first) = m.reports.first() else {
        return Value::Null;
    };
    let mut j = JsonReport::new(first);
    let wall = |r: &Report, t: u64| r.realtime_ns(t).unwrap_or(t);
    let mut kills = Vec::new();
    let mut deaths = Vec::new();
    let mut processes = Vec::new();
    for r in &m.reports {
        for k in &r.kills {
            kills.push((wall(r, k.ts_ns), super::kills::Kill::new(r, k)));
        }
        for d in &r.deaths {
            deaths.push((wall(r, d.ts_ns), processes::Death::new(r, d)));
        }
        for p in &r.processes {
            let born = wall(r, p.born_ns.unwrap_or(r.first_ns.unwrap_or(0)));
            processes.push((born, processes::Process::new(r, p)));
        }
    }
    // Stable: one recording's own order is kept at equal times.
    kills.sort_by_key(|(t, k)| (*t, k.recording));
    deaths.sort_by_key(|(t, d)| (*t, d.recording));
    processes.sort_by_key(|(t, p)| (*t, p.recording));
    j.kills = kills.into_iter().map(|(_, k)| k).collect();
    j.deaths = deaths.into_iter().map(|(_, d)| d).collect();
    j.processes = processes.into_iter().map(|(_, p)| p).collect();
    j.lost_events = m.reports.iter().map(|r| r.lost_events()).sum();
    j.recordings = m
        .recordings
        .iter()
        .zip(&m.reports)
        .map(|(rec, r)| Recording::new(rec, r))
        .collect();
    j.first_failure = first_failure(m);
    serde_json::to_value(j).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::merge::merge;

    const SEC: u64 = 1_000_000_000;

    fn node(host: &str, wall_s: u64) -> Report {
        let mut r = crate::render::fixture::sample_report();
        r.header.hostname = host.into();
        r.header.clock.realtime_ns = wall_s * SEC;
        r.header.clock.monotonic_ns = r.first_ns.unwrap();
        for i in 0..r.kills.len() {
            r.kills[i].realtime_ns = r.realtime_ns(r.kills[i].ts_ns);
        }
        r
    }

    #[test]
    fn one_recording_lists_itself_and_labels_its_items() {
        let mut r = node("node1", 1_800_000_000);
        r.source.path = "/run/a.rec".into();
        let j = super::super::render(&r);
        let recs = j["recordings"].as_array().unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0]["host"], "node1");
        assert_eq!(recs[0]["path"], "/run/a.rec");
        assert_eq!(recs[0]["clock_offset_ms"], 0.0);
        assert_eq!(recs[0]["started"], "2027-01-15T08:00:00.000Z");
        assert_eq!(j["kills"][0]["host"], "node1");
        assert_eq!(j["kills"][0]["recording"], 0);
        assert_eq!(j["processes"][0]["host"], "node1");
        assert!(j["first_failure"].is_null());
    }

    #[test]
    fn several_recordings_merge_kills_and_name_the_first() {
        let a = node("node1", 1_800_000_010);
        let b = node("node2", 1_800_000_000);
        let m = merge(vec![("/a.rec".into(), a), ("/b.rec".into(), b)]);
        let j = render_merged(&m);
        let recs = j["recordings"].as_array().unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0]["clock_offset_ms"], 10_000.0);
        assert_eq!(recs[1]["clock_offset_ms"], 0.0);
        let kills = j["kills"].as_array().unwrap();
        assert_eq!(kills.len(), 2);
        // node2 started 10 s earlier: its kill comes first.
        assert_eq!(
            (kills[0]["host"].as_str(), kills[0]["recording"].as_u64()),
            (Some("node2"), Some(1))
        );
        assert_eq!(kills[1]["host"], "node1");
        assert_eq!(j["processes"].as_array().unwrap().len(), 2);
        let f = &j["first_failure"];
        assert_eq!(f["host"], "node2");
        assert_eq!(f["kind"], "oom_kill");
        assert_eq!(f["then"][0]["host"], "node1");
        assert_eq!(
            j["lost_events"],
            2 * super::super::render(&m.reports[0])["lost_events"]
                .as_u64()
                .unwrap()
        );
    }
}
