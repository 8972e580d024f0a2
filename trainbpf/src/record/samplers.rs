//! What the recorder reads from /proc and the cgroup beside the probes:
//! each process's USS and PSS (`smaps`), shared memory (`shm`), pressure
//! and the kernel's memory figures (`pressure`), and the job's processes
//! themselves (`procfs`).

pub mod pressure;
pub mod procfs;
pub mod shm;
pub mod smaps;
