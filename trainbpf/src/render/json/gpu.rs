//! The report's `gpu` object (docs/report-json.md, "gpu"). Written out key
//! by key, like the rest of the schema.

use serde_json::{Value, json};

use crate::model::Report;
use crate::model::gpu::{GpuProcess, Held, KindStats};
use crate::render::rfc3339_ms;

use super::{secs, secs_since};

pub fn render(r: &Report) -> Value {
    let g = &r.gpu;
    let t = |ns: u64| secs_since(r, ns);
    json!({
        "processes": g.processes.iter().map(|p| process(r, p)).collect::<Vec<_>>(),
        "cuda_ooms": g.cuda_ooms.iter().map(|o| json!({
            "pid": o.pid,
            "comm": o.comm,
            "tid": o.tid,
            "time": r.realtime_ns(o.ts_ns).map(rfc3339_ms),
            "time_s": t(o.ts_ns),
            "call": o.op.name(),
            "requested_bytes": o.requested_bytes,
            "error": o.error,
            "held": held(&o.held),
            "holders": o.holders.iter().map(|h| {
                let mut v = held(&h.held);
                v["pid"] = json!(h.pid);
                v["comm"] = json!(h.comm);
                v
            }).collect::<Vec<_>>(),
            "nvml_used_bytes": o.nvml_used_bytes,
            "nvml_total_bytes": o.nvml_total_bytes,
        })).collect::<Vec<_>>(),
        "xid": g.xid.iter().map(|x| json!({
            "time": r.realtime_ns(x.ts_ns).map(rfc3339_ms),
            "time_s": t(x.ts_ns),
            "code": x.code,
            "pci": x.pci,
            "pid": x.pid,
            "name": x.name,
            "msg": x.msg,
            "source": x.source,
        })).collect::<Vec<_>>(),
        "timeline": g.timeline.iter().map(|row| {
            let mut v = held(&row.held);
            v["time_s"] = json!(t(row.ts_ns));
            v["pid"] = json!(row.pid);
            v["comm"] = json!(row.comm);
            v["what"] = json!(row.what);
            v["device_delta_bytes"] = json!(row.delta[0]);
            v["pinned_delta_bytes"] = json!(row.delta[1]);
            v["managed_delta_bytes"] = json!(row.delta[2]);
            v["host_rss_kb"] = json!(row.host_rss_kb);
            v["peak"] = held(&row.peak);
            v["requested_bytes"] = json!(row.requested_bytes);
            v
        }).collect::<Vec<_>>(),
        "timeline_dropped": g.timeline_dropped,
        "at_kills": g.at_kills.iter().map(|k| json!({
            "time_s": t(k.kill_ts_ns),
            "window_s": secs(k.window_ns),
            "processes": k.processes.iter().map(|p| {
                let mut v = held(&p.held);
                v["pid"] = json!(p.pid);
                v["comm"] = json!(p.comm);
                v["device_grew_bytes"] = json!(p.grew[0]);
                v["pinned_grew_bytes"] = json!(p.grew[1]);
                v["managed_grew_bytes"] = json!(p.grew[2]);
                v
            }).collect::<Vec<_>>(),
            "contexts": k.contexts.iter().map(|(pid, comm, c)| json!({
                "pid": pid,
                "comm": comm,
                "time_s": t(c.ts_ns),
                "host_kb": c.host_kb,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "nvml": {
            "samples": g.nvml_samples,
            "devices": g.nvml_devices.iter().map(|d| json!({
                "index": d.index,
                "name": d.name,
                "total_bytes": d.total_bytes,
                "last_used_bytes": d.last_used_bytes,
                "peak_used_bytes": d.peak_used_bytes,
            })).collect::<Vec<_>>(),
        },
        "attach": g.attach.iter().map(|a| json!({
            "path": a.path,
            "found_by": a.found_by,
            "pid": a.pid,
            "attached": a.attached.len(),
            "missing": a.missing,
            "error": a.error,
        })).collect::<Vec<_>>(),
        "sources": g.sources.iter().map(|s| json!({
            "source": s.source,
            "used": s.used,
            "detail": s.detail,
        })).collect::<Vec<_>>(),
        "lost_events": crate::model::gpu::lost_events(r),
        "lost": {
            "cuda": ring_lost(r, trainbpf_common::KIND_CUDA),
            "xid": ring_lost(r, trainbpf_common::KIND_XID),
            "nv_pages": ring_lost(r, trainbpf_common::KIND_NV_PAGES),
            "pending_full": g.lost.pending_full,
            "read_failed": g.lost.read_failed,
            "attach_failed": g.lost.attach_failed,
        },
    })
}

fn ring_lost(r: &Report, kind: u16) -> u64 {
    r.lost.by_kind.get(kind as usize).copied().unwrap_or(0)
}

fn held(h: &Held) -> Value {
    json!({
        "device_bytes": h.device,
        "pinned_bytes": h.pinned,
        "managed_bytes": h.managed,
    })
}

fn stats(s: &KindStats) -> Value {
    json!({
        "allocated_bytes": s.allocated,
        "freed_bytes": s.freed,
        "peak_bytes": s.peak,
        "end_bytes": s.end,
        "freed_at_exit_bytes": s.freed_at_exit,
        "allocs": s.allocs,
        "frees": s.frees,
        "failed": s.failed,
    })
}

fn process(r: &Report, p: &GpuProcess) -> Value {
    json!({
        "pid": p.pid,
        "comm": p.comm,
        "parent": p.parent,
        "is_root": p.is_root,
        "device_bytes_peak": p.device.peak,
        "device_bytes_end": p.device.end,
        "pinned_bytes_peak": p.pinned.peak,
        "pinned_bytes_end": p.pinned.end,
        "managed_bytes_peak": p.managed.peak,
        "managed_bytes_end": p.managed.end,
        "registered_bytes_peak": p.registered_peak,
        "contexts": p.contexts.len(),
        "context_list": p.contexts.iter().map(|c| json!({
            "time_s": secs_since(r, c.ts_ns),
            "call": c.op.name(),
            "device": c.device,
            "host_kb": c.host_kb,
        })).collect::<Vec<_>>(),
        "worker_init": p.worker_init,
        "parent_had_context": p.parent_had_context,
        "cuda_init_s": p.cuda_init_ns.map(|t| secs_since(r, t)),
        "exited_s": p.exited_ns.map(|t| secs_since(r, t)),
        "oom_killed": p.oom_killed,
        "device": stats(&p.device),
        "pinned": stats(&p.pinned),
        "managed": stats(&p.managed),
        "calls": p.calls,
        "failed_calls": p.failed_calls,
        "unknown_frees": p.unknown_frees,
        "host_rss_peak_kb": p.host_rss_peak_kb,
        "nvml": p.nvml.map(|n| json!({
            "samples": n.samples,
            "last_bytes": n.last_nvml_bytes,
            "ledger_bytes": n.last_ledger_bytes,
            "difference_bytes": n.difference(),
            "peak_bytes": n.peak_nvml_bytes,
        })),
        "nv_pages": {"alloc": p.nv_pages_alloc, "free": p.nv_pages_free},
    })
}
