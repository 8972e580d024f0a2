//! trainbpf: record why a training job was OOM-killed, and explain it.
//!
//! Data flows one way: probes (trainbpf-ebpf) → ring buffer → collector
//! ([`record`]) → the recording, and from there through the pure half,
//! the `trainbpf_report` crate (decode, model, render), which [`report`]
//! drives with the files opened as the invoking user. [`kernel`] and
//! [`loader`] hold what is specific to the running kernel.

pub mod cli;
pub mod doctor;
pub mod loader;
pub mod record;
pub mod report;
pub mod util;
