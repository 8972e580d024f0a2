//! `record --events-jsonl PATH`: each kill and death as one JSON line, for
//! log shippers (Vector, Fluent Bit, an OpenTelemetry collector's filelog
//! receiver). The file is opened as the invoking user, appended to, never
//! through a link (`safe_file::open_append`); each line goes out in one
//! write(2) as it happens. The fields: docs/metrics.md.

use std::{fs::File, io::Write as _, path::Path};

use serde::Serialize;

use super::Finished;
use crate::util::safe_file::{self, FileError, Owner};

pub struct EventsLog {
    pub(super) file: File,
    pub(super) host: String,
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC when opened, ns: a record's
    /// monotonic stamp to wall-clock time.
    pub(super) offset_ns: i128,
    pub(super) failed: bool,
}

/// One line. Absent fields are left out, not null.
#[derive(Serialize)]
struct Line<'a> {
    /// RFC 3339, UTC, milliseconds.
    time: String,
    /// "oom_kill" or "death".
    event: &'static str,
    host: &'a str,
    pid: u32,
    comm: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    rank: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    container: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    constraint: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memcg: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    oom_score_adj: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cause: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    signal: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sender_pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sender_comm: Option<&'a str>,
    /// A death that followed the job's first OOM kill, as its consequence:
    /// that kill's victim, and its rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    after_oom_kill_pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    after_oom_kill_rank: Option<u32>,
    /// The kill in one line, as the recorder told it at the kill (the
    /// report's `kills[].verdict`).
    #[serde(skip_serializing_if = "Option::is_none")]
    verdict: Option<&'a str>,
}

impl EventsLog {
    pub fn open(path: &Path, owner: Owner, host: String) -> Result<EventsLog, FileError> {
        let file = safe_file::open_append(path, owner)?;
        let real = crate::util::clock::realtime_ns() as i128;
        let mono = crate::util::clock::mono_ns() as i128;
        Ok(EventsLog {
            file,
            host,
            offset_ns: real - mono,
            failed: false,
        })
    }

    /// Writes one line; a clean exit (status 0) is no event and is left
    /// out (`trainbpf_deaths_total{cause="exit"}` counts it).
    pub fn write(&mut self, f: &Finished) {
        let Some(line) = self.line(f) else { return };
        if let Err(e) = self.file.write_all(line.as_bytes())
            && !self.failed
        {
            self.failed = true;
            eprintln!("trainbpf: warning: --events-jsonl: {e}; later lines may be missing");
        }
    }

    pub(super) fn line(&self, f: &Finished) -> Option<String> {
        let time = |ts: u64| {
            let real = (ts as i128 + self.offset_ns).max(0) as u64;
            trainbpf_report::render::rfc3339_ms(real)
        };
        let line = match f {
            Finished::Kill(k) => Line {
                time: time(k.ts_ns),
                event: "oom_kill",
                host: &self.host,
                pid: k.pid,
                comm: &k.comm,
                rank: k.rank,
                container: k.container.as_deref(),
                constraint: Some(k.constraint.as_str()),
                memcg: k.memcg.as_deref(),
                rss_bytes: Some(k.rss_bytes),
                oom_score_adj: Some(k.oom_score_adj),
                cause: None,
                signal: None,
                exit_code: None,
                sender_pid: Some(k.trigger_pid),
                sender_comm: Some(&k.trigger_comm),
                after_oom_kill_pid: None,
                after_oom_kill_rank: None,
                verdict: k.verdict.as_deref(),
            },
            Finished::Death(d) => {
                if d.signal.is_none() && d.code == Some(0) {
                    return None;
                }
                Line {
                    time: time(d.ts_ns),
                    event: "death",
                    host: &self.host,
                    pid: d.pid,
                    comm: &d.comm,
                    rank: d.rank,
                    container: None,
                    constraint: None,
                    memcg: None,
                    rss_bytes: None,
                    oom_score_adj: None,
                    cause: Some(d.cause.as_str()),
                    signal: d.signal,
                    exit_code: d.code,
                    sender_pid: d.sender_pid,
                    sender_comm: d.sender_comm.as_deref(),
                    after_oom_kill_pid: d.after_kill.map(|a| a.0),
                    after_oom_kill_rank: d.after_kill.and_then(|a| a.1),
                    verdict: None,
                }
            }
        };
        let mut s = serde_json::to_string(&line).ok()?;
        s.push('\n');
        Some(s)
    }
}
