//! Child processes the bench watches: their output lines, timestamped as
//! they come, and their CPU and RSS, sampled from /proc while they run.

use std::{
    fs,
    io::{BufRead, BufReader, Read},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use super::{JobResult, Usage};

/// How often a tool's CPU and RSS are read from /proc.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

pub(super) struct Line {
    pub at: Instant,
    pub err: bool,
    pub text: String,
}

/// A child whose stdout and stderr lines are timestamped as they come, and
/// whose CPU and RSS are sampled while it runs.
pub(super) struct Watched {
    pub child: Child,
    lines: mpsc::Receiver<Line>,
    seen: Vec<Line>,
    sampler: Option<Sampler>,
}

pub(super) struct Finished {
    status: ExitStatus,
    pub lines: Vec<Line>,
    samples: Vec<ProcSample>,
}

impl Watched {
    pub fn spawn(cmd: &mut Command, sample: bool) -> Result<Watched> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        forward_lines(out, false, tx.clone());
        forward_lines(err, true, tx);
        let sampler = sample.then(|| Sampler::start(child.id()));
        Ok(Watched {
            child,
            lines,
            seen: Vec::new(),
            sampler,
        })
    }

    /// Waits for a line containing `needle`; fails if the process closes
    /// its output (exits) first, or on timeout.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> Result<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.text.contains(needle);
                    let at = l.at;
                    self.seen.push(l);
                    if hit {
                        return Ok(at);
                    }
                }
                Err(e) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    bail!(
                        "no {needle:?} from {:?} ({}); it printed:\n{}",
                        self.child,
                        if e == mpsc::RecvTimeoutError::Timeout {
                            "timed out"
                        } else {
                            "it exited"
                        },
                        text(&self.seen)
                    );
                }
            }
        }
    }

    /// Stops the process as Ctrl-C would, and waits for it to exit.
    /// bpftrace was seen to miss a SIGINT (it sat in epoll_wait for four
    /// minutes until a second one ended it), so the signal is sent again
    /// every 5 s, and the process killed after a minute.
    pub fn interrupt(&mut self) -> Result<()> {
        let pid = self.child.id() as libc::pid_t;
        for _ in 0..12 {
            // SAFETY: kill(2) on our own child, which is not yet reaped (its
            // pid cannot have been reused).
            if unsafe { libc::kill(pid, libc::SIGINT) } != 0 {
                return Err(std::io::Error::last_os_error()).context("sending SIGINT");
            }
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until {
                if self.child.try_wait()?.is_some() {
                    return Ok(());
                }
                thread::sleep(Duration::from_millis(20));
            }
            eprintln!("bench: pid {pid} still runs 5 s after SIGINT; sending it again");
        }
        let _ = self.child.kill();
        bail!("pid {pid} ignored SIGINT for a minute; killed")
    }

    pub fn finish(mut self) -> Result<Finished> {
        // Ends when both pipes are closed: the process and whatever it ran
        // are done writing.
        self.seen.extend(self.lines.iter());
        let status = self.child.wait()?;
        let samples = self.sampler.map(Sampler::finish).unwrap_or_default();
        Ok(Finished {
            status,
            lines: self.seen,
            samples,
        })
    }
}

fn forward_lines(pipe: impl Read + Send + 'static, err: bool, tx: mpsc::Sender<Line>) {
    thread::spawn(move || {
        let mut pipe = BufReader::new(pipe);
        let mut buf = Vec::new();
        // Bytes, not `lines()`: one line that isn't UTF-8 must not end the
        // reading, or the lines after it (perf's summary) would be lost.
        while matches!(pipe.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
            let line = Line {
                at: Instant::now(),
                err,
                text: String::from_utf8_lossy(&buf).trim_end().to_string(),
            };
            buf.clear();
            if tx.send(line).is_err() {
                break;
            }
        }
    });
}

pub(super) fn text(lines: &[Line]) -> String {
    lines.iter().map(|l| format!("  {}\n", l.text)).collect()
}

impl Finished {
    /// How the process ended, for one whose success is not exit 0.
    pub fn status(&self) -> ExitStatus {
        self.status
    }

    pub fn check(&self, what: &str) -> Result<()> {
        ensure!(
            self.status.success(),
            "{what} failed ({}); it printed:\n{}",
            self.status,
            text(&self.lines)
        );
        Ok(())
    }

    /// The workload's `elapsed_s=... ` line.
    pub fn result(&self) -> Result<JobResult> {
        let line = self
            .lines
            .iter()
            .rev()
            .find(|l| !l.err && l.text.starts_with("elapsed_s="))
            .with_context(|| format!("the workload printed no result:\n{}", text(&self.lines)))?;
        let values = line
            .text
            .split_whitespace()
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect();
        Ok(JobResult {
            values,
            at: line.at,
        })
    }

    /// CPU and RSS while the job ran: samples from `from` (the tool attached)
    /// to `to` (the job printed its result).
    pub fn usage(&self, from: Instant, to: Instant, clk_tck: f64) -> Usage {
        let all = &self.samples;
        let window: Vec<&ProcSample> = all.iter().filter(|s| s.at >= from && s.at <= to).collect();
        let cpu_frac = match (window.first(), window.last()) {
            (Some(a), Some(b)) if b.at > a.at => {
                (b.cpu_ticks - a.cpu_ticks) as f64 / clk_tck / (b.at - a.at).as_secs_f64()
            }
            _ => 0.0,
        };
        let rss_growth_kb = match window.last() {
            Some(last) => last.rss_kb as i64 - window[window.len() / 10].rss_kb as i64,
            None => 0,
        };
        Usage {
            cpu_frac,
            cpu_total_s: all.last().map_or(0.0, |s| s.cpu_ticks as f64 / clk_tck),
            peak_rss_kb: all.iter().map(|s| s.hwm_kb).max().unwrap_or(0),
            job_rss_kb: window.iter().map(|s| s.rss_kb).max().unwrap_or(0),
            rss_growth_kb,
        }
    }
}

struct ProcSample {
    at: Instant,
    /// utime + stime, clock ticks.
    cpu_ticks: u64,
    rss_kb: u64,
    /// VmHWM: the peak RSS so far.
    hwm_kb: u64,
}

/// Reads a process's CPU and memory from /proc every [`SAMPLE_EVERY`] until
/// it is gone or told to stop.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<Vec<ProcSample>>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::spawn(move || {
            let mut out = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                // None once the process has exited: a zombie has no VmRSS.
                let Some(s) = read_proc(pid) else { break };
                out.push(s);
                thread::sleep(SAMPLE_EVERY);
            }
            out
        });
        Sampler { stop, handle }
    }

    fn finish(self) -> Vec<ProcSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// The recorder and its helper processes that work for it (the frames'
/// namer, `__name-frames`), summed: its cost is the recorder's. The job,
/// also its child, is left out.
fn read_proc(pid: u32) -> Option<ProcSample> {
    let mut s = read_one(pid)?;
    for h in helpers(pid) {
        if let Some(h) = read_one(h) {
            s.cpu_ticks += h.cpu_ticks;
            s.rss_kb += h.rss_kb;
            s.hwm_kb += h.hwm_kb;
        }
    }
    Some(s)
}

/// `pid`'s children (of any of its threads) that run its helper
/// subcommands.
pub(crate) fn helpers(pid: u32) -> Vec<u32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
                .collect::<Vec<_>>()
        })
        .filter(|c| {
            let cmd = fs::read(format!("/proc/{c}/cmdline")).unwrap_or_default();
            cmd.split(|&b| b == 0).nth(1) == Some(&b"__name-frames"[..])
        })
        .collect()
}

fn read_one(pid: u32) -> Option<ProcSample> {
    let at = Instant::now();
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the `(comm)`, which may itself hold spaces: state is
    // field 3, utime and stime are fields 14 and 15.
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let cpu_ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| -> Option<u64> {
        let v = status.lines().find_map(|l| l.strip_prefix(key))?;
        v.split_whitespace().next()?.parse().ok()
    };
    Some(ProcSample {
        at,
        cpu_ticks,
        rss_kb: kb("VmRSS:")?,
        hwm_kb: kb("VmHWM:")?,
    })
}
