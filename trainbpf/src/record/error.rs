//! What can stop `record`, each with what it needs to say.

use std::io;

use crate::{loader, record::job, util::safe_file};

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The recorder lacks a capability it needs.
    #[error(
        "trainbpf record needs {missing} to load its eBPF programs and run the job; run it with sudo: sudo trainbpf record -- CMD"
    )]
    Privileges { missing: String },
    /// Loading or attaching the probes failed.
    #[error(transparent)]
    Load(#[from] loader::LoadError),
    /// Starting or containing the job failed.
    #[error(transparent)]
    Job(#[from] job::JobError),
    /// The recording could not be created safely (util/safe_file.rs).
    #[error(transparent)]
    File(#[from] safe_file::FileError),
    /// `--pid`, `--cgroup` or `--all` reaches what the invoker may not see.
    #[error(transparent)]
    Attach(#[from] crate::record::target::AttachError),
    /// The recording file could not be written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

pub(in crate::record) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> RecordError {
    let what = what.into();
    move |source| RecordError::Io { what, source }
}
