//! What the recorder shows while the job runs: the status line on the
//! terminal, Prometheus metrics, and each kill and death as a JSON line.

pub mod kill_line;
pub mod metrics;
pub mod status;
