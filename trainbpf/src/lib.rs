//! trainbpf: record why a training job was OOM-killed, and explain it.
//!
//! Data flows one way: probes (trainbpf-ebpf) → ring buffer → collector
//! ([`record`]) → the recording, and from there through the pure half,
//! the `trainbpf_report` crate (decode, model, render), which [`report`]
//! drives with the files opened as the invoking user. [`kernel`] and
//! [`loader`] hold what is specific to the running kernel.

pub mod attach;
pub mod cli;
pub mod compact;
pub mod doctor;
pub mod forward;
pub mod gpu;
pub mod job;
pub mod kernel;
pub mod loader;
pub mod metrics;
pub mod mounts;
pub mod pressure;
pub mod procfs;
pub mod python;
pub mod record;
pub mod report;
pub mod rings;
pub mod safe_file;
pub mod sampler;
pub mod shm_look;
pub mod shm_sampler;
pub mod stacks;
pub mod status;
pub mod trust;

/// Writes to stdout; a closed pipe (`trainbpf report | head`) is success.
pub fn write_stdout(s: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}
