//! The kernel programs' own log (`record --ebpf-log`): aya-log reads its
//! ring (`AYA_LOGS`) and hands each record to a `log::Log`; this one keeps
//! them for the collector, which writes them into the recording and to
//! stderr. Nothing goes through the process-wide logger.

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{Arc, Mutex},
};

use aya::Ebpf;
use aya_log::EbpfLogger;

use trainbpf_report::decode::EbpfLog;

/// The reader of the programs' log ring.
pub struct KernelLog {
    logger: Option<EbpfLogger<Capture>>,
    lines: Arc<Mutex<Vec<EbpfLog>>>,
}

impl KernelLog {
    /// Takes the object's `AYA_LOGS` ring.
    pub(super) fn open(ebpf: &mut Ebpf) -> Result<KernelLog, aya_log::Error> {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let logger = EbpfLogger::init_with_logger(ebpf, Capture(lines.clone()))?;
        Ok(KernelLog {
            logger: Some(logger),
            lines,
        })
    }

    /// The messages logged since the last call. The ring holds 128 KiB,
    /// and the programs throttle each site, so a call returns a bounded
    /// few.
    pub fn drain(&mut self) -> Vec<EbpfLog> {
        if let Some(logger) = &mut self.logger {
            // aya-log unwraps its parse of each record: a record it can't
            // read would panic the recorder. Our programs write them
            // through its own macro, so it should never happen; if it
            // does, the log stops and the recording goes on.
            if catch_unwind(AssertUnwindSafe(|| logger.flush())).is_err() {
                self.logger = None;
                self.push(EbpfLog {
                    program: "trainbpf".into(),
                    level: "error".into(),
                    site: String::new(),
                    message: "a kernel log record did not parse; the kernel log stops here".into(),
                });
            }
        }
        std::mem::take(&mut *self.lines.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn push(&self, l: EbpfLog) {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).push(l);
    }
}

/// Keeps each record aya-log decodes: its target is the program's name
/// (`klog!` sets it), its file and line the site.
struct Capture(Arc<Mutex<Vec<EbpfLog>>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let site = match (record.file(), record.line()) {
            (Some(f), Some(l)) => format!("{f}:{l}"),
            (Some(f), None) => f.to_string(),
            _ => String::new(),
        };
        let line = EbpfLog {
            program: record.target().to_string(),
            level: record.level().as_str().to_ascii_lowercase(),
            site,
            message: record.args().to_string(),
        };
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use log::Log as _;

    use super::*;

    #[test]
    fn keeps_the_program_level_site_and_message() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let c = Capture(lines.clone());
        c.log(
            &log::Record::builder()
                .args(format_args!("PROCS full: job process {} not tracked", 42))
                .target("page_alloc")
                .level(log::Level::Warn)
                .file(Some("src/procs.rs"))
                .line(Some(131))
                .build(),
        );
        let got = lines.lock().unwrap();
        assert_eq!(
            got[..],
            [EbpfLog {
                program: "page_alloc".into(),
                level: "warn".into(),
                site: "src/procs.rs:131".into(),
                message: "PROCS full: job process 42 not tracked".into(),
            }]
        );
    }
}
