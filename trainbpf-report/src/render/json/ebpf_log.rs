//! The report's `ebpf_log` object (docs/report-json.md, "ebpf_log"): what
//! the kernel programs logged with `record --ebpf-log`.

use schemars::JsonSchema;
use serde::Serialize;

use crate::model::Report;

use super::secs_since;

/// What the kernel programs logged: a map that filled, a ring that refused
/// a record, a read at BTF's offset that failed.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct EbpfLog {
    /// `record --ebpf-log` was given. False: nobody asked, and `messages`
    /// is empty.
    pub(crate) enabled: bool,
    /// In the order logged; the first 1000. Each site logs its 1st, 2nd,
    /// 4th, 8th... time on each CPU, so the counts in `lost` are the full
    /// account.
    pub(crate) messages: Vec<EbpfLogMessage>,
    /// Messages past those, not kept.
    pub(crate) omitted: u64,
}

/// One message.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct EbpfLogMessage {
    /// aya-log's level: `error`, `warn`, `info`, `debug` or `trace`.
    pub(crate) level: String,
    pub(crate) message: String,
    /// The program that logged it, e.g. `page_alloc`, `sched_fork`.
    pub(crate) program: String,
    /// Where in the eBPF source, `file:line`.
    pub(crate) site: String,
    /// Seconds since the recording's first event.
    pub(crate) time_s: f64,
}

impl EbpfLog {
    pub(crate) fn new(r: &Report) -> EbpfLog {
        let l = &r.ebpf_log;
        EbpfLog {
            enabled: l.enabled,
            messages: l
                .messages
                .iter()
                .map(|(ts, m)| EbpfLogMessage {
                    level: m.level.clone(),
                    message: m.message.clone(),
                    program: m.program.clone(),
                    site: m.site.clone(),
                    time_s: secs_since(r, *ts),
                })
                .collect(),
            omitted: l.omitted,
        }
    }
}
