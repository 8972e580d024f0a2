//! What a recorder costs processes outside its job (issue 28): each
//! workload runs untraced, then beside `trainbpf record -- sleep`, as a
//! neighbour's job on a shared machine would. The probes fire for every
//! process on the machine and decide in the kernel whether it is the
//! job's; that decision, and any tracepoint that puts every system call on
//! the kernel's slow path, is what these figures measure. Target: 1.01×.

use std::{process::Command, time::Duration};

use anyhow::{Result, ensure};

use super::{Ctx, Metric, Sample, Tool, Workload, proc::Watched, sample};

/// The bystander workloads: a fault storm (W1's), a system-call loop, a
/// fork storm (W3's) and a wait loop, each a fixed amount of work.
pub(super) fn plan(smoke: bool, nproc: usize) -> Vec<Workload> {
    let passes = if smoke { 4 } else { 100 };
    let forks = if smoke { 16 } else { 200 };
    let calls = if smoke { 100_000 } else { 10_000_000 };
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let w = |id, title: String, args| Workload {
        id,
        title,
        args,
        python: false,
        cuda: false,
        metric: Metric::Elapsed,
        tools: vec![Tool::Untraced, Tool::Bystander],
    };
    vec![
        w(
            "B1",
            "B1 fault storm outside the job, 1 thread".into(),
            s(&["faults", "1", &passes.to_string(), "64"]),
        ),
        w(
            "B2",
            format!("B2 getppid loop outside the job, {calls} calls"),
            s(&["syscalls", &calls.to_string()]),
        ),
        w(
            "B3",
            format!("B3 fork storm outside the job, {forks} workers x 16 MiB"),
            s(&["forks", &forks.to_string(), "16", &nproc.to_string()]),
        ),
        w(
            "B4",
            format!("B4 waitpid loop outside the job, {calls} calls"),
            s(&["waits", &calls.to_string()]),
        ),
    ]
}

impl Ctx {
    /// The workload run untraced while a recorder traces a sleeping job;
    /// the recorder's CPU and RSS over the same time.
    pub(super) fn bystander(&self, w: &Workload) -> Result<Sample> {
        let rec = self.scratch.join("bystander.rec");
        let mut cmd = Command::new(&self.bin);
        cmd.args(["record", "-q", "-o"])
            .arg(&rec)
            .args(["--", "/bin/sleep", "3600"]);
        let mut recorder = Watched::spawn(&mut cmd, true)?;
        let ready = recorder.wait_for("trainbpf: recording to", Duration::from_secs(60))?;
        let job = Watched::spawn(&mut self.workload_cmd(w), false)?.finish()?;
        // Ctrl-C: passed on to the sleeping job, whose status (SIGINT,
        // 128 + 2) the recorder exits with.
        recorder.interrupt()?;
        let done = recorder.finish()?;
        job.check("the workload")?;
        ensure!(
            done.status().code() == Some(130),
            "trainbpf record ended {} at Ctrl-C; it printed:\n{}",
            done.status(),
            super::proc::text(&done.lines)
        );
        let r = job.result()?;
        let usage = done.usage(ready, r.at, self.clk_tck);
        std::fs::remove_file(&rec)?;
        sample(w, &r, None, None, None, Some(usage))
    }
}
