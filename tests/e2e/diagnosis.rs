//! The diagnoses, each from a real job that should earn it.

mod growth;
mod memory;
mod misc;
mod shm;
