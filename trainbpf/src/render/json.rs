//! The report as JSON, schema `trainbpf.report/1` (docs/report-json.md).
//!
//! The schema is written out here key by key rather than derived from the
//! model's types, so that a change to the model cannot silently change what
//! scripts reading the JSON see.

use serde_json::{Value, json};

use crate::decode::{ExitStatus, OomRecordKind};
use crate::model::{Death, Grower, Kill, Process, Report, ns_to_s};
use crate::render::{death_phrase, rfc3339_ms};

/// The `gpu` object.
mod gpu;
/// The `leaks` array and `leak_projection`.
mod leaks;

/// Adding keys keeps this; removing or renaming one, or changing a type or
/// unit, bumps it.
pub const SCHEMA: &str = "trainbpf.report/1";

pub fn render(r: &Report) -> Value {
    let h = &r.header;
    let a = &h.attach;
    json!({
        "schema": SCHEMA,
        "recording": {
            "trainbpf_version": h.trainbpf_version,
            "kernel": h.kernel,
            "hostname": h.hostname,
            "attach": {
                "oom_context": a.oom_context,
                "oom_victim": a.oom_victim,
                "memory": a.memory,
                "faults": a.faults,
                "lifecycle": a.lifecycle,
                "printk": a.printk,
                "signals": a.signals,
                "oom_score_adj": a.oom_score_adj,
                "stalls": a.stalls,
                "pages": a.pages,
                "page_cache": a.page_cache,
                "forks": a.forks,
            },
            "fallbacks": h.fallbacks.iter()
                .map(|f| json!({"probe": f.probe, "reason": f.reason}))
                .collect::<Vec<_>>(),
            "start": r.first_ns.and_then(|t| r.realtime_ns(t)).map(rfc3339_ms),
            "duration_s": secs(r.duration_ns()),
            "events": r.events,
            "window_s": secs(r.window_ns),
            "stopped_early": r.stopped_early.as_ref()
                .map(|s| json!({"offset": s.offset, "reason": s.reason})),
            "skipped": r.skipped.ranges.iter()
                .map(|s| json!({"offset": s.offset, "bytes": s.bytes, "reason": s.reason}))
                .collect::<Vec<_>>(),
            "skipped_ranges": r.skipped.count,
            "skipped_bytes": r.skipped.bytes,
            "compaction": r.compaction.as_ref().map(|c| json!({
                "count": c.count,
                "full_from_s": r.since_start_s(c.full_from_ns),
                "tiers": c.tiers.iter()
                    .map(|[older, bucket]| json!({"older_than_s": older, "bucket_s": bucket}))
                    .collect::<Vec<_>>(),
                "kill_window_bucket_s": c.kill_window_bucket_s,
                "samples_folded": c.samples_folded,
                "bytes_before": c.bytes_before,
                "bytes_after": c.bytes_after,
                "max_size_bytes": c.max_size,
            })),
        },
        "job": r.job.as_ref().map(|j| json!({
            "pid": j.pid,
            "argv": j.argv,
            "cwd": j.cwd,
            "uid": j.uid,
            "exit": j.exit.map(exit),
            "cgroup": j.cgroup,
            "memory_limit_bytes": j.memory_limit_bytes,
        })),
        "kills": r.kills.iter().map(|k| kill(r, k)).collect::<Vec<_>>(),
        "processes": r.processes.iter().map(|p| process(r, p)).collect::<Vec<_>>(),
        "deaths": r.deaths.iter().map(|d| death(r, d)).collect::<Vec<_>>(),
        "groups": r.groups.iter().map(|g| json!({
            "role": g.role,
            "pids": g.pids,
            "count": g.pids.len(),
            "honest_kb": g.honest_kb,
            "peak_rss_kb": g.grew_kb,
        })).collect::<Vec<_>>(),
        "shared_memory": r.shared_memory.iter().map(|o| json!({
            "kind": o.kind,
            "name": o.name,
            "id": o.id,
            "size_kb": o.size_kb,
            "resident_kb": o.resident_kb,
            "owner_pid": o.owner_tgid,
            "mappers": o.mappers,
        })).collect::<Vec<_>>(),
        "attribution_at_peak": r.attribution_at_peak.as_ref().map(sum_check),
        "smaps_cost": {
            "rounds": r.smaps_rounds,
            "total_us": r.smaps_cost_us,
        },
        "top_memory": r.top_memory.iter().map(|u| json!({
            "pid": u.pid,
            "comm": u.comm,
            "peak_rss_kb": u.peak_rss_kb,
            "in_job": u.in_job,
        })).collect::<Vec<_>>(),
        "run": run(r),
        "gpu": gpu::render(r),
        "leaks": leaks::leaks(r),
        "leak_warnings": leaks::warnings(r),
        "leak_projection": leaks::projection(r),
        "lost_events": r.lost_events(),
        "lost": {
            "by_kind": r.lost.by_kind.iter().enumerate()
                .map(|(i, n)| (kind_name(i), json!(n)))
                .collect::<serde_json::Map<_, _>>(),
            "by_ring": {
                "main": r.lost.by_ring().0,
                "precious": r.lost.by_ring().1,
            },
            "undecodable": r.lost.undecodable.saturating_add(r.undecodable),
            "proc_map_full": r.lost.proc_map_full,
            "job_map_full": r.lost.job_map_full,
            "other_map_full": r.lost.other_map_full,
            "dropped_disk_full": r.lost.dropped_disk_full,
        },
    })
}

fn kill(r: &Report, k: &Kill) -> Value {
    let v = &k.victim;
    json!({
        "time": k.realtime_ns.map(rfc3339_ms),
        "time_s": secs_since(r, k.ts_ns),
        "victim": {
            "pid": v.pid,
            "comm": v.comm,
            "anon_rss_kb": v.rss.anon_kb,
            "file_rss_kb": v.rss.file_kb,
            "shmem_rss_kb": v.rss.shmem_kb,
            "swap_kb": v.rss.swap_kb,
            "total_vm_kb": v.total_vm_kb,
            "pgtables_kb": v.pgtables_kb,
            "oom_score_adj": v.oom_score_adj,
            "uid": v.uid,
            "in_job": v.in_job,
            "tree": v.tree.iter()
                .map(|n| json!({"pid": n.pid, "comm": n.comm}))
                .collect::<Vec<_>>(),
        },
        "constraint": k.constraint.as_str(),
        "memcg": k.memcg,
        "task_memcg": k.task_memcg,
        "memcg_usage_kb": k.memcg_usage_kb,
        "memcg_limit_kb": k.memcg_limit_kb,
        // A process id like every other `pid` here; the thread is `tid`.
        "trigger": {"pid": k.trigger.tgid, "tid": k.trigger.pid, "comm": k.trigger.comm},
        "source": k.sources.iter().map(|s| s.probe.as_str()).collect::<Vec<_>>().join("+"),
        "sources": k.sources.iter().map(|s| json!({
            "record": match s.record {
                OomRecordKind::Kill => "oom_kill_process",
                OomRecordKind::Victim => "mark_victim",
            },
            "probe": s.probe,
        })).collect::<Vec<_>>(),
        "kernel_points": k.kernel_points,
        "totalpages": k.totalpages,
        "candidates": k.ranking.as_ref().map_or(Vec::new(), |rk| rk.candidates.iter().map(|c| json!({
            "pid": c.pid,
            "comm": c.comm,
            "points": c.points,
            "rss_kb": c.rss_kb,
            "swap_kb": c.swap_kb,
            "pgtables_kb": c.pgtables_kb,
            "oom_score_adj": c.oom_score_adj,
            "in_job": c.in_job,
            "is_victim": c.is_victim,
        })).collect::<Vec<_>>()),
        "ranking": k.ranking.as_ref().map(|rk| json!({
            "reconstructed": true,
            "totalpages": rk.totalpages,
            "totalpages_source": rk.totalpages_source.as_str(),
            "victim_points": rk.victim_points,
            "agrees_with_kernel": rk.agrees_with_kernel,
        })),
        "pressure": k.pressure.as_ref().map(|p| json!({
            "span_s": secs(p.span_ns),
            "mem_available_start_kb": p.available_start_kb,
            "mem_available_at_kill_kb": p.available_at_kill_kb,
            "mem_available_min_kb": p.available_min_kb,
            "mem_total_kb": p.mem_total_kb,
            "swap_used_kb": p.swap_used_kb,
            "swap_total_kb": p.swap_total_kb,
            "shmem_kb": p.shmem_kb,
            "committed_as_kb": p.committed_as_kb,
            "commit_limit_kb": p.commit_limit_kb,
            "overcommit_memory": p.overcommit_memory,
            "cgroup_usage_kb": p.cgroup_usage_kb,
            "cgroup_limit_kb": p.cgroup_limit_kb,
            "cgroup_limit_hits": p.cgroup_max_events,
            "psi_some_avg10": p.psi_some_avg10,
            "psi_full_avg10": p.psi_full_avg10,
            "psi_some_stall_ms": p.psi_some_stall_ms,
            "stall_ms": {"direct_reclaim": p.stall_ms[0], "memcg_reclaim": p.stall_ms[1], "compaction": p.stall_ms[2]},
            "stalls": {"direct_reclaim": p.stalls[0], "memcg_reclaim": p.stalls[1], "compaction": p.stalls[2]},
            "reclaim_freed_kb": p.reclaim_freed_kb,
        })),
        "window_s": secs(k.window_ns),
        "groups": k.groups.iter().map(|g| json!({
            "role": g.role,
            "pids": g.pids,
            "count": g.pids.len(),
            "honest_kb": g.honest_kb,
            "grew_kb": g.grew_kb,
            "window_s": secs(g.window_ns),
        })).collect::<Vec<_>>(),
        "sum_check": k.sum_check.as_ref().map(sum_check),
        "growers": k.growers.iter().map(grower).collect::<Vec<_>>(),
        "kernel_log": k.kernel_log,
    })
}

fn sum_check(s: &crate::model::SumCheck) -> Value {
    json!({
        "cgroup_delta_kb": s.cgroup_delta_kb,
        "attributed_kb": s.attributed_kb,
        "unattributed_kb": s.unattributed_kb,
        "unattributed": {
            "page_cache_delta_kb": s.file_delta_kb,
            "kernel_delta_kb": s.kernel_delta_kb,
        },
        "ratio": s.ratio().map(|r| (r * 1000.0).round() / 1000.0),
    })
}

/// The whole run, from the bounded series: the charted processes' peaks
/// and the job processes that came and went.
fn run(r: &Report) -> Value {
    let s = &r.series;
    json!({
        "duration_s": secs(r.duration_ns()),
        "peaks": s.job_first().iter().map(|p| json!({
            "pid": p.pid,
            "comm": p.comm,
            "in_job": p.in_job,
            "peak_rss_kb": p.peak_kb,
            "peak_s": secs_since(r, p.peak_ns),
            "born_s": p.born_ns.map(|t| secs_since(r, t)),
            "died_s": p.died_ns.map(|t| secs_since(r, t)),
            "oom_killed": p.oom_killed,
        })).collect::<Vec<_>>(),
        "folded": {"count": s.folded.count, "peak_rss_kb": s.folded.peak_kb},
        "came_and_went": s.came_and_went.iter().map(|c| json!({
            "comm": c.comm,
            "count": c.count,
            "shortest_s": secs(c.shortest_ns),
            "longest_s": secs(c.longest_ns),
            "peak_rss_kb": c.peak_kb,
        })).collect::<Vec<_>>(),
        "uncharted": {"job": s.uncharted_job, "outside": s.uncharted_outside},
    })
}

fn grower(g: &Grower) -> Value {
    json!({
        "pid": g.pid,
        "comm": g.comm,
        "grew_kb": g.grew_kb,
        "honest_kb": g.honest_kb,
        "window_s": secs(g.window_ns),
        "rate_kb_per_s": g.rate_kb_per_s.map(|r| (r * 10.0).round() / 10.0),
        "rss_kb": g.rss_kb,
        "in_job": g.in_job,
        "born_in_window": g.born_in_window,
        "victim": g.is_victim,
    })
}

fn process(r: &Report, p: &Process) -> Value {
    json!({
        "pid": p.pid,
        "comm": p.comm,
        "parent": p.parent.map(|k| k.tgid),
        "exec": p.exec,
        "born_s": p.born_ns.map(|t| secs_since(r, t)),
        "died_s": p.died_ns.map(|t| secs_since(r, t)),
        "exit": p.exit.map(exit),
        "peak_rss_kb": p.peak_rss_kb,
        "oom_killed": p.oom_killed,
        "oom_score_adj": p.oom_score_adj,
        "honest_kb": p.honest_kb,
        "honest_peak_kb": p.honest_peak_kb,
        "page_cache_kb": p.page_cache_kb,
        "uss_kb": p.uss_kb,
        "pss_kb": p.pss_kb,
    })
}

fn death(r: &Report, d: &Death) -> Value {
    json!({
        "pid": d.pid,
        "comm": d.comm,
        "time": r.realtime_ns(d.ts_ns).map(rfc3339_ms),
        "time_s": secs_since(r, d.ts_ns),
        "cause": d.cause.as_str(),
        "signal": d.signal,
        "code": d.code,
        "sender": d.sender.as_ref().map(|s| json!({
            "pid": s.pid,
            "comm": s.comm,
            "exe": s.exe,
            "uid": s.uid,
            "terminal": s.terminal.as_ref().map(|t| json!({
                "tty": t.tty,
                "session": t.session,
                "foreground_group": t.foreground_pgrp,
            })),
            "forwarded_by": s.forwarded_by,
        })),
        "memcg": d.memcg,
        "memcg_limit_kb": d.memcg_limit_kb,
        "phrase": death_phrase(d),
    })
}

fn exit(s: ExitStatus) -> Value {
    match s {
        ExitStatus::Code(c) => json!({"code": c}),
        ExitStatus::Signal(n) => json!({"signal": n}),
    }
}

/// Seconds, to the millisecond: more digits would be noise.
fn secs(ns: u64) -> f64 {
    (ns_to_s(ns) * 1000.0).round() / 1000.0
}

/// Seconds since the first event; negative for a birth before it (a job
/// process the recorder met already running).
fn secs_since(r: &Report, ts: u64) -> f64 {
    let first = r.first_ns.unwrap_or(ts);
    let d = ts as f64 - first as f64;
    (d / 1e6).round() / 1000.0
}

/// Names for the kernel record kinds that index `Lost::by_kind`.
fn kind_name(i: usize) -> String {
    use trainbpf_common as c;
    let name = match u16::try_from(i).unwrap_or(u16::MAX) {
        c::KIND_FORK => "fork",
        c::KIND_EXEC => "exec",
        c::KIND_EXIT => "exit",
        c::KIND_MEM => "mem",
        c::KIND_OOM_VICTIM => "oom_victim",
        c::KIND_OOM_KILL => "oom_kill",
        c::KIND_PRINTK => "printk",
        c::KIND_SIGNAL => "signal",
        c::KIND_OOM_ADJ => "oom_adj",
        c::KIND_CUDA => "cuda",
        c::KIND_XID => "xid",
        c::KIND_NV_PAGES => "nv_pages",
        _ => return format!("kind_{i}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::ClockPair;
    use crate::render::fixture::sample_report;

    #[test]
    fn has_the_documented_keys() {
        let v = render(&sample_report());
        assert_eq!(v["schema"], "trainbpf.report/1");
        for k in [
            "kernel",
            "attach",
            "fallbacks",
            "duration_s",
            "stopped_early",
            "skipped",
            "skipped_ranges",
            "skipped_bytes",
        ] {
            assert!(v["recording"].get(k).is_some(), "recording.{k}");
        }
        assert_eq!(v["recording"]["duration_s"], 21.5);
        assert!(v["recording"]["stopped_early"].is_null());
        assert_eq!(v["recording"]["skipped"], json!([]));
        assert_eq!(v["recording"]["skipped_ranges"], 0);
        assert_eq!(v["job"]["pid"], 700);
        assert_eq!(v["job"]["exit"], json!({"signal": 9}));
        assert_eq!(v["job"]["memory_limit_bytes"], 300 << 20);
        let k = &v["kills"][0];
        assert_eq!(k["time"], "2024-02-29T23:59:59.999Z");
        assert_eq!(k["time_s"], 20.0);
        for key in [
            "pid",
            "comm",
            "anon_rss_kb",
            "file_rss_kb",
            "shmem_rss_kb",
            "swap_kb",
            "oom_score_adj",
            "uid",
            "in_job",
            "tree",
        ] {
            assert!(k["victim"].get(key).is_some(), "victim.{key}");
        }
        assert_eq!(
            k["victim"]["tree"][0],
            json!({"pid": 700, "comm": "python3"})
        );
        assert_eq!(k["constraint"], "memcg");
        assert_eq!(k["memcg"], "/trainbpf-77");
        assert_eq!(k["memcg_limit_kb"], 307_200);
        assert_eq!(k["trigger"]["pid"], 812);
        assert_eq!(k["source"], "fentry+tp_btf");
        assert_eq!(k["kernel_points"], 65_000);
        assert_eq!(k["totalpages"], 76_800);
        let g = &k["growers"][0];
        for key in [
            "pid",
            "comm",
            "grew_kb",
            "window_s",
            "rate_kb_per_s",
            "rss_kb",
            "in_job",
        ] {
            assert!(g.get(key).is_some(), "grower.{key}");
        }
        assert_eq!(g["window_s"], 12.0);
        assert_eq!(v["processes"][0]["born_s"], 0.0);
        // 3 ring-buffer losses, 1 undecodable in the collector, 2 in the file.
        assert_eq!(v["lost_events"], 6);
        assert_eq!(v["lost"]["by_kind"]["mem"], 3);
        assert_eq!(v["lost"]["by_kind"]["kind_0"], 0);
        assert_eq!(v["lost"]["undecodable"], 3);
    }

    #[test]
    fn missing_pieces_are_null_not_absent() {
        let mut r = sample_report();
        r.job = None;
        r.stopped_early = Some(crate::recording::Stop {
            offset: 4096,
            reason: "frame checksum mismatch".into(),
        });
        r.kills[0].kernel_points = None;
        r.header.clock = ClockPair::default();
        r.kills[0].realtime_ns = r.realtime_ns(r.kills[0].ts_ns);
        r.skipped = crate::recording::Skipped {
            ranges: vec![crate::recording::Skip {
                offset: 1024,
                bytes: 300,
                reason: "bad frame magic".into(),
            }],
            count: 1,
            bytes: 300,
        };
        let v = render(&r);
        assert!(v["job"].is_null());
        assert_eq!(v["recording"]["stopped_early"]["offset"], 4096);
        assert_eq!(
            v["recording"]["skipped"],
            json!([{"offset": 1024, "bytes": 300, "reason": "bad frame magic"}])
        );
        assert_eq!(v["recording"]["skipped_bytes"], 300);
        assert!(v["kills"][0]["kernel_points"].is_null());
        assert!(v["kills"][0].get("kernel_points").is_some());
        // Without a clock pair there is no wall-clock time to give.
        assert!(v["kills"][0]["time"].is_null());
    }
}
