//! trainbpf: record why a training job was OOM-killed, and explain it.
//!
//! Data flows one way: probes (trainbpf-ebpf) → ring buffer → collector
//! ([`record`]) → [`recording`] → [`decode`] → [`model`] → [`render`].
//! [`kernel`] and [`loader`] hold what is specific to the running kernel.

pub mod attach;
pub mod cli;
pub mod compact;
pub mod decode;
pub mod doctor;
pub mod forward;
pub mod fuzzing;
pub mod gpu;
pub mod job;
pub mod kernel;
pub mod loader;
pub mod metrics;
pub mod model;
pub mod mounts;
pub mod pressure;
pub mod procfs;
pub mod python;
pub mod record;
pub mod recording;
pub mod render;
pub mod report;
pub mod rings;
pub mod safe_file;
pub mod sampler;
pub mod shm_look;
pub mod shm_sampler;
pub mod stacks;
pub mod status;
pub mod term;
pub mod trust;
pub mod units;

/// Writes to stdout; a closed pipe (`trainbpf report | head`) is success.
pub fn write_stdout(s: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}
