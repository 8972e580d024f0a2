//! A memory cgroup of the test's own, with a limit: real OOM kills happen
//! inside it and nowhere else. Removed when dropped, once its processes
//! are gone.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

pub struct Cg(pub PathBuf);

impl Cg {
    /// `trainbpf-test-TAG-PID` under the memory controller's root (v2 or
    /// v1), limited to `limit` (`200M`).
    pub fn new(tag: &str, limit: &str) -> Cg {
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|s| s.contains("memory"));
        let (root, file) = if v2 {
            ("/sys/fs/cgroup", "memory.max")
        } else {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        };
        let dir = Path::new(root).join(format!("trainbpf-test-{tag}-{}", std::process::id()));
        let _ = std::fs::create_dir(&dir);
        std::fs::write(dir.join(file), limit).expect("set the limit");
        Cg(dir)
    }
}

impl Drop for Cg {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
