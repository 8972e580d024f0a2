//! trainbpf's pure half: the recording format, and what `trainbpf report`
//! makes of a recording's bytes.
//!
//! Data flows one way: [`recording`] (the file's one reader and one
//! writer) → [`decode`] (bytes to typed events, length-checked) → [`model`]
//! (the timeline: attribution, verdicts, leaks) → [`render`] (text, JSON,
//! HTML, Perfetto, pprof). [`pipeline`] runs those steps on any input;
//! [`units`] and [`term`] format numbers and escape text for all of them.
//!
//! Nothing here loads a probe, runs async, serves HTTP, reads a GPU or
//! needs a privilege, and Cargo keeps it so: this crate depends on none of
//! those crates, and builds with stable Rust without the eBPF object. The
//! recorder (the `trainbpf` crate) writes recordings with [`recording`]'s
//! writer and reports them through [`pipeline`].
#![warn(unreachable_pub)]

pub mod decode;
pub mod fuzzing;
pub mod model;
pub mod pipeline;
pub mod recording;
pub mod render;
pub mod term;
pub mod units;
