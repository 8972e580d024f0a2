//! Who grew memory: per-process figures against the kernel's own.

mod growth;
mod truth;
