//! `gpu.late`: driver libraries a job process mapped after recording
//! started, each held until probed or an uncovered window.

use schemars::JsonSchema;
use serde::Serialize;

use crate::model::Report;

use super::secs_since;

/// A job process mapped a `libcuda.so*` file that was not probed yet.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct GpuLate {
    /// NVIDIA driver calls (ioctls on `/dev/nvidia*`) counted between the
    /// mapping and the attach: CUDA work the ledger did not see. 0 when
    /// held.
    pub calls: u64,
    /// Stopped from its mapping until the probes were on: no call missed.
    pub held: bool,
    /// Mapping to attach, milliseconds: how long it was held, or how long
    /// the window was open (to the recording's end when never probed).
    pub(crate) ms: f64,
    /// When it mapped the library, seconds since the recording began.
    pub(crate) mapped_s: f64,
    /// Why it was not held, or what else happened to the hold.
    pub note: Option<String>,
    /// The file, as the process named it.
    pub path: String,
    pub pid: u32,
    /// Whether the probes went on at all.
    pub(crate) probed: bool,
    pub tid: u32,
}

impl GpuLate {
    pub(crate) fn list(r: &Report) -> Vec<GpuLate> {
        let end = r.last_ns.unwrap_or(0);
        r.gpu
            .late
            .iter()
            .map(|l| GpuLate {
                calls: l.calls,
                held: l.held,
                ms: ms(l.attached_ns.unwrap_or(end).saturating_sub(l.mapped_ns)),
                mapped_s: secs_since(r, l.mapped_ns),
                note: l.note.clone(),
                path: l.path.clone(),
                pid: l.pid,
                probed: l.attached_ns.is_some(),
                tid: l.tid,
            })
            .collect()
    }
}

/// Milliseconds, to the microsecond.
pub(crate) fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e3).round() / 1e3
}
