//! The report as a Chrome trace-event JSON (`report --perfetto PATH`), which
//! ui.perfetto.dev and chrome://tracing open.
//!
//! The format: <https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU>.
//! What goes in:
//!
//! - each charted process is a trace process with its real pid, named
//!   `comm (pid N) ← parent (pid M)` so that the job's tree reads in the
//!   process list, sorted job first by birth; a pid the kernel recycled gets
//!   a synthetic pid above `PID_MAX_LIMIT` for its later process;
//! - its resident memory is one counter track ("C" events, MiB); the
//!   whole-run series is coarse on a long run, so inside each kill's window
//!   the finer window samples replace it;
//! - the machine's MemAvailable and the job cgroup's usage and limit are
//!   counters of a synthetic "system" process;
//! - each kill is a global instant event ("i", scope "g") whose args name
//!   the victim, the trigger and the top grower.
//!
//! Timestamps are µs from the recording's first event.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};

use crate::model::{KillWindow, Pick, ProcLine, Report};
use crate::units::mib;

/// Linux pids never exceed PID_MAX_LIMIT (2^22, include/linux/threads.h), so
/// ids above it cannot collide with a real process.
const PID_MAX_LIMIT: u32 = 1 << 22;
const SYSTEM_PID: u32 = PID_MAX_LIMIT + 1;
const FOLDED_PID: u32 = PID_MAX_LIMIT + 2;
const FIRST_SYNTHETIC: u32 = PID_MAX_LIMIT + 16;

pub fn render(r: &Report) -> Value {
    let s = &r.series;
    let origin = r.first_ns.unwrap_or(0);
    let us = |t: u64| t.saturating_sub(origin) / 1000;
    let mut ev: Vec<Value> = Vec::new();

    let meta = |ev: &mut Vec<Value>, pid: u32, what: &str, args: Value| {
        ev.push(json!({"name": what, "ph": "M", "ts": 0, "pid": pid, "tid": 0, "args": args}));
    };
    let counter = |ev: &mut Vec<Value>, pid: u32, name: &str, t: u64, kb: u64| {
        ev.push(json!({
            "name": name, "ph": "C", "ts": us(t), "pid": pid, "tid": pid,
            "args": {"MiB": mib(kb)},
        }));
    };

    meta(
        &mut ev,
        SYSTEM_PID,
        "process_name",
        json!({"name": "system (machine and job cgroup)"}),
    );
    meta(
        &mut ev,
        SYSTEM_PID,
        "process_sort_index",
        json!({"sort_index": 0}),
    );
    for (t, b) in s.mem_available.points(&s.grid) {
        counter(&mut ev, SYSTEM_PID, "MemAvailable", t, b.pick(Pick::Min));
    }
    for (t, b) in s.cgroup_usage.points(&s.grid) {
        counter(&mut ev, SYSTEM_PID, "cgroup usage", t, b.max_kb);
    }
    for (t, b) in s.cgroup_limit.points(&s.grid) {
        counter(&mut ev, SYSTEM_PID, "cgroup limit", t, b.last_kb);
    }

    // Pids as trace processes; a recycled pid's later process moves aside.
    let mut procs: Vec<&ProcLine> = s.procs.iter().collect();
    procs.sort_by_key(|p| (!p.in_job, p.born_ns.unwrap_or(0), p.pid, p.start_ns));
    let trace_pid = trace_pids(&procs);
    let name_of = |pid: u32, start: u64| {
        s.procs
            .iter()
            .find(|p| p.pid == pid && p.start_ns == start)
            .map(|p| p.name.clone())
            .or_else(|| {
                r.processes
                    .iter()
                    .find(|p| p.pid == pid && p.start_ns == start)
                    .map(|p| r.name(pid, start, &p.comm))
            })
    };

    for (i, p) in procs.iter().enumerate() {
        let id = trace_pid[&(p.pid, p.start_ns)];
        let mut name = format!("{} (pid {})", p.name, p.pid);
        if let Some(parent) = p.parent {
            match name_of(parent.tgid, parent.start_ns) {
                Some(c) => name.push_str(&format!(" ← {c} (pid {})", parent.tgid)),
                None => name.push_str(&format!(" ← pid {}", parent.tgid)),
            }
        }
        if !p.in_job {
            name.push_str(" [outside the job]");
        }
        meta(&mut ev, id, "process_name", json!({"name": name}));
        meta(
            &mut ev,
            id,
            "process_sort_index",
            json!({"sort_index": i + 1}),
        );
        let mut labels = vec![if p.in_job { "job" } else { "outside the job" }];
        if p.oom_killed {
            labels.push("OOM-killed");
        }
        meta(
            &mut ev,
            id,
            "process_labels",
            json!({"labels": labels.join(",")}),
        );
        for (t, kb) in rss_points(r, p) {
            counter(&mut ev, id, "RSS", t, kb);
        }
    }
    if s.folded.count > 0 {
        meta(
            &mut ev,
            FOLDED_PID,
            "process_name",
            json!({"name": format!("{} more ended job processes (the largest of them)", s.folded.count)}),
        );
        meta(
            &mut ev,
            FOLDED_PID,
            "process_sort_index",
            json!({"sort_index": procs.len() + 1}),
        );
        for (t, b) in s.folded.rss.points(&s.grid) {
            counter(&mut ev, FOLDED_PID, "RSS", t, b.max_kb);
        }
    }

    kill_events(&mut ev, r);

    json!({
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "trainbpf report --perfetto",
            "trainbpf_version": r.header.trainbpf_version,
            "kernel": r.header.kernel,
            "command": r.job.as_ref().map(|j| j.argv.join(" ")),
        },
    })
}

/// The first trace pid of a merged trace's hosts; each host is one.
const FIRST_HOST: u32 = PID_MAX_LIMIT + 4096;

/// Several recordings of one job: one trace process per host (Perfetto's
/// track group), holding every counter of that recording (each named
/// after its process) and its kills, on the job's timeline (µs from the
/// earliest recording's first event, by the wall clock).
pub fn render_merged(m: &crate::model::Merged) -> Value {
    let mut ev: Vec<Value> = Vec::new();
    for (rec, r) in m.recordings.iter().zip(&m.reports) {
        let host_pid = FIRST_HOST + rec.index as u32;
        let shift = rec.clock_offset_ns / 1000;
        let one = render(r);
        let Some(events) = one["traceEvents"].as_array() else {
            continue;
        };
        let names: HashMap<u64, &str> = events
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
            .filter_map(|e| Some((e["pid"].as_u64()?, e["args"]["name"].as_str()?)))
            .collect();
        for (what, args) in [
            (
                "process_name",
                json!({"name": format!("{} (recording {}: {})", rec.host, rec.index, rec.path)}),
            ),
            ("process_sort_index", json!({"sort_index": rec.index})),
            (
                "process_labels",
                json!({"labels": format!("host {}", rec.host)}),
            ),
        ] {
            ev.push(
                json!({"name": what, "ph": "M", "ts": 0, "pid": host_pid, "tid": 0, "args": args}),
            );
        }
        for e in events.iter().filter(|e| e["ph"] != "M") {
            let mut e = e.clone();
            let from = e["pid"].as_u64().unwrap_or(0);
            let ts = e["ts"].as_u64().unwrap_or(0) + shift;
            let name = e["name"].as_str().unwrap_or("").to_string();
            e["name"] = match names.get(&from) {
                Some(p) if e["ph"] == "C" => json!(format!("{p} · {name}")),
                _ if e["ph"] == "i" => json!(format!("{}: {name}", rec.host)),
                _ => json!(name),
            };
            e["ts"] = json!(ts);
            e["pid"] = json!(host_pid);
            e["tid"] = json!(host_pid);
            if e["ph"] == "i" {
                // On its host's track, not across every host's.
                e["s"] = json!("p");
            }
            ev.push(e);
        }
    }
    json!({
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "trainbpf report --perfetto",
            "hosts": m.recordings.iter().map(|r| r.host.as_str()).collect::<Vec<_>>(),
            "trainbpf_version": m.reports.first().map(|r| r.header.trainbpf_version.as_str()),
        },
    })
}

/// Trace pids: a process's own pid, and a synthetic one for a recycled
/// pid's later process.
fn trace_pids(procs: &[&ProcLine]) -> HashMap<(u32, u64), u32> {
    let mut used: HashSet<u32> = HashSet::new();
    let mut next = FIRST_SYNTHETIC;
    let mut trace_pid: HashMap<(u32, u64), u32> = HashMap::new();
    for p in procs {
        let id = if used.insert(p.pid) {
            p.pid
        } else {
            next += 1;
            next
        };
        trace_pid.insert((p.pid, p.start_ns), id);
    }
    trace_pid
}

/// Each kill as a global instant event, with its victim and top grower.
fn kill_events(ev: &mut Vec<Value>, r: &Report) {
    let origin = r.first_ns.unwrap_or(0);
    let us = |t: u64| t.saturating_sub(origin) / 1000;
    for (i, k) in r.kills.iter().enumerate() {
        let top = k.growers.first();
        ev.push(json!({
            "name": format!("OOM kill {}: {}", i + 1, r.who(k.victim.pid, k.victim.start_ns, &k.victim.comm)),
            "ph": "i",
            "s": "g",
            "ts": us(k.ts_ns),
            "pid": SYSTEM_PID,
            "tid": 0,
            "args": {
                "victim": r.who(k.victim.pid, k.victim.start_ns, &k.victim.comm),
                "victim_comm": k.victim.comm,
                "victim_pid": k.victim.pid,
                "trigger": r.who(k.trigger.tgid, k.trigger.start_ns, &k.trigger.comm),
                "top_grower": top.map(|g| r.who(g.pid, g.start_ns, &g.comm)),
                "top_grower_comm": top.map(|g| g.comm.as_str()),
                "top_grower_pid": top.map(|g| g.pid),
                "top_grower_grew_mib": top.map(|g| mib(g.grew_kb)),
                "constraint": k.constraint.as_str(),
                "memcg": k.memcg,
                "victim_rss_mib": mib(k.victim.rss.resident_kb()),
            },
        }));
    }
}

/// A process's counter points: its whole-run buckets, with the finer window
/// samples in place of them inside each kill's window, and a drop to 0 when
/// it ended so the track does not hold its last value forever.
fn rss_points(r: &Report, p: &ProcLine) -> Vec<(u64, u64)> {
    let s = &r.series;
    let windows: Vec<(&KillWindow, &[Option<u64>])> = s
        .windows
        .iter()
        .filter_map(|w| {
            let l = w
                .lines
                .iter()
                .find(|l| l.pid == p.pid && l.start_ns == p.start_ns)?;
            Some((w, l.points.as_slice()))
        })
        .collect();
    let inside = |t: u64| {
        windows
            .iter()
            .any(|(w, _)| t >= w.start_ns && t <= w.kill_ns)
    };
    let mut pts: Vec<(u64, u64)> = p
        .rss
        .points(&s.grid)
        .filter(|(t, _)| !inside(*t))
        .map(|(t, b)| (t, b.max_kb))
        .collect();
    for (w, points) in &windows {
        pts.extend(
            points
                .iter()
                .enumerate()
                .filter_map(|(i, v)| Some((w.start_ns + i as u64 * w.step_ns, (*v)?))),
        );
    }
    pts.sort_by_key(|x| x.0);
    pts.dedup_by_key(|x| x.0);
    if let Some(d) = p.died_ns
        && pts.last().is_some_and(|l| l.0 <= d)
    {
        pts.push((d, 0));
    }
    pts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::fixture::sample_report;

    #[test]
    fn a_recycled_pid_is_two_trace_processes() {
        let r = crate::model::build(
            &crate::recording::RecordingHeader::default(),
            crate::model::series::tests::two_kills().into_iter(),
            &crate::model::ModelOptions::default(),
        );
        let v = render(&r);
        let ev = v["traceEvents"].as_array().unwrap();
        let names: Vec<&Value> = ev
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
            .filter(|e| e["args"]["name"].as_str().unwrap().contains("(pid 812)"))
            .collect();
        assert_eq!(names.len(), 3, "{names:#?}");
        let pids: HashSet<u64> = names.iter().map(|e| e["pid"].as_u64().unwrap()).collect();
        assert_eq!(pids.len(), 3, "each its own trace pid: {pids:?}");
        assert!(pids.contains(&812));
        assert!(
            names.iter().all(|e| e["args"]["name"]
                .as_str()
                .unwrap()
                .ends_with("← p700 (pid 700)")),
            "{names:#?}"
        );
        // Each process track drops to 0 when it ended.
        let kills = ev.iter().filter(|e| e["ph"] == "i").count();
        assert_eq!(kills, 2);
    }

    #[test]
    fn a_merged_trace_has_one_process_per_host_on_one_timeline() {
        let node = |host: &str, wall_s: u64| {
            let mut r = sample_report();
            r.header.hostname = host.into();
            r.header.clock.realtime_ns = wall_s * 1_000_000_000;
            r.header.clock.monotonic_ns = r.first_ns.unwrap();
            r
        };
        let m = crate::model::merge::merge(vec![
            ("/a.rec".into(), node("node1", 1_800_000_000)),
            ("/b.rec".into(), node("node2", 1_800_000_002)),
        ]);
        let t = render_merged(&m);
        let ev = t["traceEvents"].as_array().unwrap();
        let groups: Vec<&str> = ev
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            groups,
            vec!["node1 (recording 0: /a.rec)", "node2 (recording 1: /b.rec)"]
        );
        let pids: HashSet<u64> = ev.iter().map(|e| e["pid"].as_u64().unwrap()).collect();
        assert_eq!(pids.len(), 2, "every event in its host's group");
        let kills: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "i").collect();
        assert_eq!(kills.len(), 2);
        assert!(
            kills[1]["name"]
                .as_str()
                .unwrap()
                .starts_with("node2: OOM kill 1")
        );
        // node2 started 2 s later: its kill is 2 s later on the trace.
        let d = kills[1]["ts"].as_u64().unwrap() - kills[0]["ts"].as_u64().unwrap();
        assert_eq!(d, 2_000_000);
    }

    #[test]
    fn kill_is_a_global_instant_naming_victim_and_grower() {
        let v = render(&sample_report());
        let ev = v["traceEvents"].as_array().unwrap();
        let kill = ev.iter().find(|e| e["ph"] == "i").expect("an instant");
        assert_eq!(kill["s"], "g");
        assert_eq!(kill["args"]["victim_comm"], "pt_data_worker");
        assert_eq!(kill["args"]["top_grower_comm"], "pt_data_worker");
        assert_eq!(kill["ts"], 20_000_000, "µs since the first event");
        assert!(ev.iter().any(|e| {
            e["ph"] == "M"
                && e["args"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("system"))
        }));
    }
}
