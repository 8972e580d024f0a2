//! A1: `trainbpf record --all` on a crowded node (issue 28), as the
//! DaemonSet runs it: 10,000 processes alive and 1,000 forks a second
//! (xtask/bench/crowd.c), one in ten of them killed by SIGKILL, a death
//! the recorder must keep. Measured: the recorder's CPU (with its helper
//! processes) over the churn, its peak RSS, the deaths recorded against
//! those made, and every event lost. Targets: 1% of a core, no kill or
//! death record lost, bounded RSS. The churn also runs with no recorder,
//! in the same sitting, for the fork rate it reaches untraced.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use super::{Ctx, proc::Watched};
use crate::util::{run, workspace_root};

/// The crowd: sleepers, seconds of churn, forks a second, one killed in.
struct Crowd {
    sleepers: u32,
    seconds: u32,
    rate: u32,
    kill_every: u32,
}

impl Crowd {
    fn new(smoke: bool) -> Crowd {
        if smoke {
            Crowd {
                sleepers: 100,
                seconds: 2,
                rate: 100,
                kill_every: 10,
            }
        } else {
            Crowd {
                sleepers: 10_000,
                seconds: 30,
                rate: 1_000,
                kill_every: 10,
            }
        }
    }

    fn args(&self) -> [String; 4] {
        [
            self.sleepers.to_string(),
            self.seconds.to_string(),
            self.rate.to_string(),
            self.kill_every.to_string(),
        ]
    }
}

/// crowd.c, built with gcc.
pub(super) fn build(out_dir: &Path) -> Result<std::path::PathBuf> {
    let exe = out_dir.join("crowd");
    run(Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(workspace_root().join("xtask/bench/crowd.c")))
    .context("building the crowd needs gcc")?;
    Ok(exe)
}

/// One churn: what the crowd printed, and when it began and ended.
struct Churn {
    forks: f64,
    killed: f64,
    elapsed_s: f64,
}

fn churn(crowd: &Path, c: &Crowd) -> Result<(Churn, std::time::Instant, std::time::Instant)> {
    let mut w = Watched::spawn(Command::new(crowd).args(c.args()), false)?;
    let from = w.wait_for("churn-start", Duration::from_secs(300))?;
    let to = w.wait_for("churn-end", Duration::from_secs(u64::from(c.seconds) + 300))?;
    let done = w.finish()?;
    done.check("the crowd")?;
    let r = done.result()?;
    let v = |k: &str| r.values.get(k).copied().unwrap_or(f64::NAN);
    Ok((
        Churn {
            forks: v("forks"),
            killed: v("killed"),
            elapsed_s: v("elapsed_s"),
        },
        from,
        to,
    ))
}

impl Ctx {
    /// Renders A1's section.
    pub(super) fn scale(&self, smoke: bool, crowd: &Path) -> Result<String> {
        let c = Crowd::new(smoke);
        eprintln!("bench: A1 the crowd with no recorder");
        let (alone, _, _) = churn(crowd, &c)?;
        super::settle(smoke);
        eprintln!("bench: A1 the crowd beside trainbpf record --all");
        let rec = self.scratch.join("all.rec");
        let mut cmd = Command::new(&self.bin);
        cmd.args(["record", "--all", "-q", "-o"]).arg(&rec);
        let mut recorder = Watched::spawn(&mut cmd, true)?;
        recorder.wait_for("trainbpf: recording to", Duration::from_secs(60))?;
        let (traced, from, to) = churn(crowd, &c)?;
        // The last records are read at the next drains.
        std::thread::sleep(Duration::from_secs(1));
        recorder.interrupt()?;
        let done = recorder.finish()?;
        let usage = done.usage(from, to, self.clk_tck);
        let out = Command::new(&self.bin)
            .args(["report", "--json"])
            .arg(&rec)
            .output()
            .context("running trainbpf report")?;
        ensure!(
            out.status.success(),
            "trainbpf report --json failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: Value = serde_json::from_slice(&out.stdout).context("reading the report")?;
        std::fs::remove_file(&rec)?;
        let deaths = r["deaths"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter(|d| d["comm"] == "crowd" && d["signal"] == 9)
                    .count()
            })
            .unwrap_or(0);
        let lost = &r["lost"];
        let n = |v: &Value| v.as_u64().unwrap_or(0);
        let rate = |ch: &Churn| ch.forks / ch.elapsed_s;
        Ok(format!(
            "\n## A1: `record --all` on a crowded node\n\n\
             `crowd {sleepers} {secs} {rate} {every}` (xtask/bench/crowd.c): {sleepers} processes alive, {rate} forks a second for {secs} s, one in {every} killed by SIGKILL; once with no recorder, then beside `trainbpf record --all -q`.\n\n\
             | | no recorder | beside `record --all` |\n|---|---|---|\n\
             | forks a second reached | {:.0} | {:.0} |\n\
             | recorder CPU over the churn (with its helpers) | – | {:.2}% of a core |\n\
             | recorder peak RSS (with its helpers) | – | {:.1} MB |\n\
             | deaths by SIGKILL made / recorded | – | {:.0} / {deaths} |\n\
             | events lost (all kinds) / on the kill and death ring | – | {} / {} |\n",
            rate(&alone),
            rate(&traced),
            usage.cpu_frac * 100.0,
            usage.peak_rss_kb as f64 / 1000.0,
            traced.killed,
            n(&r["lost_events"]),
            n(&lost["by_ring"]["precious"]),
            sleepers = c.sleepers,
            secs = c.seconds,
            rate = c.rate,
            every = c.kill_every,
        ))
    }
}
