//! The privileged end-to-end tests, one binary: the real `trainbpf`
//! binary, run as root against the real kernel, with real processes,
//! memory cgroups and OOM kills. They never skip: without root they fail
//! and say how to run them (`cargo xtask test`).
//!
//! One module per feature; `support` holds what they share (the cgroup,
//! the recorder's runs, the stand-ins).

mod support;

mod attach;
mod attribution;
mod deaths;
mod deploy;
mod diagnosis;
mod disk_full;
mod doctor;
mod ebpf_log;
mod evidence;
mod flight;
mod gpu;
mod identity;
mod job;
mod leaks;
mod merge;
mod metrics;
mod oom;
mod outputs;
mod pprof;
mod python;
mod report_readable;
mod security;
mod stack_at_death;
mod stacks;
mod torchrun;
mod volume;
mod wheel;
