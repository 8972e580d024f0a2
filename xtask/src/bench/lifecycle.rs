//! L1: how long `trainbpf record` takes to start a job and to leave after
//! it (issue 28), with the parts the recorder says with `-v`: the kernel's
//! BTF, the object and its maps, the programs' verifier and attach time,
//! the GPU probes, the job's first records; at the end, the last drains,
//! the recording's sync and the probes' detach. Each arm runs round after
//! round, interleaved: the job alone, the recorder on a machine with no
//! CUDA library found, and the recorder with the stand-in driver probed
//! (the CUDA uprobes attached to one library).

use std::{
    collections::BTreeMap,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Result, bail, ensure};

use super::{Ctx, proc::Watched};

/// The job: a line at its start and one at its end, a second apart.
const JOB: &str = "echo trainbpf-bench-start; sleep 1; echo trainbpf-bench-end";

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Arm {
    Alone,
    Plain,
    Cuda,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Alone => "the job alone",
            Arm::Plain => "trainbpf record, no CUDA library",
            Arm::Cuda => "trainbpf record, stand-in driver probed",
        }
    }
}

/// One run: start-up and exit, and the parts the recorder named.
struct Run {
    start: Duration,
    exit: Duration,
    parts: Vec<(String, f64)>,
}

impl Ctx {
    fn lifecycle_run(&self, arm: Arm) -> Result<Run> {
        let rec = self.scratch.join("lifecycle.rec");
        let mut cmd = match arm {
            Arm::Alone => Command::new("/bin/sh"),
            _ => {
                let mut c = Command::new(&self.bin);
                c.args(["record", "-v", "-o"])
                    .arg(&rec)
                    .args(["--", "/bin/sh"]);
                c
            }
        };
        cmd.args(["-c", JOB]).env_remove("TRAINBPF_LIBCUDA");
        if arm == Arm::Cuda {
            cmd.env("TRAINBPF_LIBCUDA", &self.standin);
        }
        let t0 = Instant::now();
        let mut w = Watched::spawn(&mut cmd, false)?;
        let started = w.wait_for("trainbpf-bench-start", Duration::from_secs(60))?;
        let ended = w.wait_for("trainbpf-bench-end", Duration::from_secs(60))?;
        // The process's own exit, not its pipes' close (its helpers may
        // hold them a little longer).
        let exited = loop {
            if w.child.try_wait()?.is_some() {
                break Instant::now();
            }
            thread::sleep(Duration::from_millis(1));
        };
        let done = w.finish()?;
        ensure!(
            done.status().success(),
            "{} ended {}; it printed:\n{}",
            arm.name(),
            done.status(),
            super::proc::text(&done.lines)
        );
        let _ = std::fs::remove_file(&rec);
        let mut parts = Vec::new();
        for (prefix, side) in [
            ("trainbpf: started the job in ", "start"),
            ("trainbpf: left the job's end in ", "exit"),
        ] {
            let line = done.lines.iter().find_map(|l| l.text.strip_prefix(prefix));
            match (line, arm) {
                (Some(l), _) => parts.extend(parse_parts(side, l)),
                (None, Arm::Alone) => {}
                (None, _) => bail!("no {prefix:?} line from the recorder"),
            }
        }
        Ok(Run {
            start: started - t0,
            exit: exited.saturating_duration_since(ended),
            parts,
        })
    }
}

/// "N ms: a 1.0 ms, b 2.0 ms (verifier 1.5 ms, attach 0.1 ms), ...; its
/// first records read 0.3 ms later" into named figures, in ms.
fn parse_parts(side: &str, line: &str) -> Vec<(String, f64)> {
    let (_, rest) = line.split_once(": ").unwrap_or(("", line));
    let (rest, first) = match rest.split_once("; its first records read ") {
        Some((r, f)) => (
            r,
            f.strip_suffix(" ms later")
                .and_then(|f| f.trim().parse::<f64>().ok()),
        ),
        None => (rest, None),
    };
    let mut out = Vec::new();
    for item in split_top(rest) {
        let (head, inner) = match item.split_once(" (") {
            Some((h, i)) => (h, i.strip_suffix(')')),
            None => (item, None),
        };
        let Some((name, v)) = named(head) else {
            continue;
        };
        out.push((format!("{side}: {name}"), v));
        for (sub, v) in inner
            .into_iter()
            .flat_map(|i| i.split(", "))
            .filter_map(named)
        {
            out.push((format!("{side}: {name} {sub}"), v));
        }
    }
    if let Some(f) = first {
        out.push((format!("{side}: the job's first records read"), f));
    }
    out
}

/// "name 12.3 ms" into its name and figure.
fn named(s: &str) -> Option<(&str, f64)> {
    let (n, v) = s.trim().strip_suffix(" ms")?.rsplit_once(' ')?;
    Some((n, v.parse().ok()?))
}

/// Splits "a, b (c, d), e" at the commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut from) = (Vec::new(), 0, 0);
    for (i, ch) in s.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[from..i].trim());
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[from..].trim());
    out
}

/// Runs L1 `runs` times per arm, interleaved, and renders its section.
pub(super) fn measure(ctx: &Ctx, runs: usize) -> Result<String> {
    let arms = [Arm::Alone, Arm::Plain, Arm::Cuda];
    let mut all: BTreeMap<Arm, Vec<Run>> = BTreeMap::new();
    for round in 1..=runs {
        for arm in arms {
            eprintln!(
                "bench: L1 start-up and exit, {}, run {round}/{runs}",
                arm.name()
            );
            let r = ctx.lifecycle_run(arm)?;
            eprintln!(
                "bench:   start {:.1} ms, exit {:.1} ms",
                ms(r.start),
                ms(r.exit)
            );
            all.entry(arm).or_default().push(r);
        }
    }
    Ok(render(&all, runs))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn render(all: &BTreeMap<Arm, Vec<Run>>, runs: usize) -> String {
    let mut md = format!(
        "\n## L1: start-up and exit\n\n`record -v -- sh -c '{JOB}'`, {runs} interleaved run(s) of each arm; medians, in ms. Start-up: from spawning the command to the job's first line; exit: from the job's last line to the command's exit.\n\n| arm | start-up | exit |\n|---|---|---|\n"
    );
    for (arm, rs) in all {
        md.push_str(&format!(
            "| {} | {:.1} | {:.1} |\n",
            arm.name(),
            median(rs.iter().map(|r| ms(r.start)).collect()),
            median(rs.iter().map(|r| ms(r.exit)).collect()),
        ));
    }
    let recorded: Vec<(&Arm, &Vec<Run>)> = all.iter().filter(|(a, _)| **a != Arm::Alone).collect();
    let mut names: Vec<&str> = Vec::new();
    for (_, rs) in &recorded {
        for (n, _) in rs.iter().flat_map(|r| &r.parts) {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
    }
    md.push_str("\nThe parts, as the recorder says them with `-v` (medians, ms):\n\n| part |");
    for (a, _) in &recorded {
        md.push_str(&format!(" {} |", a.name()));
    }
    md.push_str("\n|---|");
    md.push_str(&"---|".repeat(recorded.len()));
    md.push('\n');
    for n in names {
        md.push_str(&format!("| {n} |"));
        for (_, rs) in &recorded {
            let v: Vec<f64> = rs
                .iter()
                .flat_map(|r| &r.parts)
                .filter(|(p, _)| p == n)
                .map(|(_, v)| *v)
                .collect();
            if v.is_empty() {
                md.push_str(" – |");
            } else {
                md.push_str(&format!(" {:.1} |", median(v)));
            }
        }
        md.push('\n');
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorders_lines_parse_into_parts() {
        let p = parse_parts(
            "start",
            "455.4 ms: set-up 1.0 ms, kernel BTF 178.5 ms, probes 137.0 ms (verifier 131.0 ms, attach 2.7 ms), job started 2.2 ms; its first records read 0.4 ms later",
        );
        let want = [
            ("start: set-up", 1.0),
            ("start: kernel BTF", 178.5),
            ("start: probes", 137.0),
            ("start: probes verifier", 131.0),
            ("start: probes attach", 2.7),
            ("start: job started", 2.2),
            ("start: the job's first records read", 0.4),
        ];
        let got: Vec<(&str, f64)> = p.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        assert_eq!(got, want);
    }
}
