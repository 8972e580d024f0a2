//! Writes a large synthetic recording with the real writer, for measuring
//! `trainbpf report` on a long run (`cargo xtask bench-report`):
//!
//! ```sh
//! cargo run --release -p trainbpf --example gen_recording -- --hours 24 --procs 8 -o day.rec
//! ```
//!
//! The records are the same `#[repr(C)]` structs the kernel programs write
//! (`trainbpf-common`) and the same JSON the collector writes, framed by
//! `recording::Writer` once a second as the collector does. Memory records
//! are not drawn at a made-up rate: each process's resident memory is
//! simulated every 10 ms, and a record is written when the kernel program
//! would write one at the default thresholds (`record`'s defaults: 4 MiB or
//! 1/64 of the process's size, whichever is larger, or any change once 5 s
//! have passed since its last record). So the record rate follows from the
//! workload:
//!
//! - the trainer (the job's root): 6 GiB and a slow leak, plus each 1-second
//!   training step's 512 MiB of activations, allocated over 0.6 s and freed;
//! - `procs - 1` DataLoader workers, re-spawned every 15 minutes (an epoch)
//!   on recycled pids: 300 MiB at fork, growing 1 MiB/s, plus each 0.5-second
//!   batch's 24 MiB (`--batch-mib`), allocated over 0.3 s and freed;
//! - three times in the run a worker leaks 200 MiB/s until the job's cgroup
//!   (24 GiB) is full and the kernel kills it; the trainer re-spawns it;
//! - a dozen daemons outside the job, and every two hours a burst of
//!   compilers outside the job;
//! - the collector's pressure sample every second (MemAvailable, the cgroup's
//!   usage and limit, PSI, stalls).
//!
//! The generator prints what it wrote: records per kind and per second.

use std::{fs::File, io::BufWriter, path::PathBuf, process::ExitCode, time::Instant};

use trainbpf_common as c;
use trainbpf_report::{
    decode::samples::{CgroupPressure, Pressure, Psi},
    decode::{CgroupName, ExitStatus, JobExit, JobStart, Lost, UserBody, encode_user, pod_bytes},
    recording::{Attach, ClockPair, RecordConfig, RecordingHeader, Writer},
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1000 * MS;
const TICK: u64 = 10 * MS;
const MIB_PAGES: i64 = 256;
const PAGE_KB: u64 = 4;
/// `record`'s defaults.
const THRESHOLD_PAGES: i64 = 4 * MIB_PAGES;
const RELATIVE_SHIFT: u32 = 6;
const HEARTBEAT: u64 = 5 * SEC;
const EPOCH: u64 = 15 * 60 * SEC;
const LIMIT_KB: u64 = 24 << 20;
const MEM_TOTAL_KB: u64 = 64 << 20;
const CGROUP_ID: u64 = 77;
/// Start of the run on CLOCK_MONOTONIC: a machine up for a while.
const T0: u64 = 3600 * SEC;
const ROOT: u32 = 4000;

struct Args {
    hours: f64,
    procs: usize,
    /// MiB a worker allocates and frees per batch: the knob for the record
    /// rate.
    batch_mib: i64,
    out: PathBuf,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        hours: 24.0,
        procs: 8,
        batch_mib: 24,
        out: PathBuf::from("synthetic.rec"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--hours" => a.hours = val()?.parse().map_err(|e| format!("--hours: {e}"))?,
            "--procs" => a.procs = val()?.parse().map_err(|e| format!("--procs: {e}"))?,
            "--batch-mib" => {
                a.batch_mib = val()?.parse().map_err(|e| format!("--batch-mib: {e}"))?
            }
            "-o" | "--output" => a.out = PathBuf::from(val()?),
            "-h" | "--help" => {
                return Err(
                    "usage: gen_recording [--hours 24] [--procs 8] [--batch-mib 24] [-o PATH]"
                        .into(),
                );
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.hours <= 0.0 || a.procs < 2 {
        return Err("--hours must be positive and --procs at least 2".into());
    }
    Ok(a)
}

fn comm(s: &str) -> [u8; c::COMM_LEN] {
    let mut b = [0u8; c::COMM_LEN];
    let n = s.len().min(c::COMM_LEN - 1);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
    b
}

/// A kernel struct with every field zero; the generator then sets the ones
/// it knows, so fields added to the struct later read as "not recorded".
fn zeroed<T: Copy>() -> T {
    // SAFETY: only used for the plain integer #[repr(C)] structs of
    // trainbpf-common, for which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

fn header(kind: u16, tgid: u32, start_ns: u64, ts: u64, in_job: bool) -> c::Header {
    c::Header {
        kind,
        flags: if in_job { c::FLAG_IN_JOB } else { 0 },
        tgid,
        ts_ns: ts,
        start_ns,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Role {
    Trainer,
    Worker,
    /// A worker that leaks until the OOM killer takes it.
    Leaker,
    Daemon(u32),
    Compiler,
}

struct Proc {
    batch_pages: i64,
    pid: u32,
    start_ns: u64,
    name: &'static str,
    role: Role,
    born: u64,
    /// Pages the kernel program last reported, and when.
    reported: i64,
    last_emit: u64,
    cur: i64,
    faults: u64,
    alive: bool,
}

impl Proc {
    fn in_job(&self) -> bool {
        matches!(self.role, Role::Trainer | Role::Worker | Role::Leaker)
    }

    /// Resident pages at `t` (anon; file is folded in for simplicity).
    fn pages(&self, t: u64) -> i64 {
        let age = t.saturating_sub(self.born);
        let frac = |period: u64, up: u64, pages: i64| {
            let ph = age % period;
            if ph < up {
                pages * ph as i64 / up as i64
            } else {
                0
            }
        };
        match self.role {
            Role::Trainer => {
                6 * 1024 * MIB_PAGES
                    + (age / SEC) as i64 * 40 * MIB_PAGES / 3600
                    + frac(SEC, 600 * MS, 512 * MIB_PAGES)
            }
            Role::Worker => {
                300 * MIB_PAGES
                    + (age / SEC) as i64 * MIB_PAGES
                    + frac(500 * MS, 300 * MS, self.batch_pages)
            }
            Role::Leaker => 300 * MIB_PAGES + (age * 200 / SEC) as i64 * MIB_PAGES,
            Role::Daemon(i) => {
                (20 + 10 * i as i64) * MIB_PAGES + ((age / (60 * SEC)) % 8) as i64 * MIB_PAGES
            }
            Role::Compiler => 50 * MIB_PAGES + (age * 16 / SEC) as i64 * MIB_PAGES,
        }
    }
}

struct Gen {
    batch_pages: i64,
    w: Writer<BufWriter<File>>,
    frame: Vec<(u64, u16, Vec<u8>)>,
    counts: [u64; 16],
    next_worker_pid: u32,
    next_other_pid: u32,
    failcnt: u64,
    stall: [u64; 3],
    psi_us: u64,
}

impl Gen {
    fn kernel<T: Copy>(&mut self, ts: u64, kind: u16, v: &T) {
        self.counts[kind as usize] += 1;
        self.frame.push((ts, kind, pod_bytes(v)));
    }

    fn user(&mut self, ts: u64, body: UserBody) {
        let (kind, bytes) = encode_user(ts, body);
        self.counts[15] += 1;
        self.frame.push((ts, kind, bytes));
    }

    /// Writes the second's records in time order as one frame, as the
    /// collector does once a second.
    fn flush(&mut self) -> std::io::Result<()> {
        self.frame.sort_by_key(|r| r.0);
        for (_, kind, bytes) in self.frame.drain(..) {
            self.w.record(kind, &bytes);
        }
        self.w.flush()
    }

    fn mem(&mut self, p: &mut Proc, t: u64) {
        let cur = p.pages(t);
        if cur != p.cur {
            p.faults += (cur - p.cur).max(0) as u64;
            p.cur = cur;
        }
        let moved = (cur - p.reported).abs();
        if moved == 0 {
            return;
        }
        let threshold = THRESHOLD_PAGES.max(cur >> RELATIVE_SHIFT);
        let heartbeat = t - p.last_emit >= HEARTBEAT;
        if moved < threshold && !heartbeat {
            return;
        }
        let first = p.reported == 0;
        let mut e: c::MemEvent = zeroed();
        e.hdr = header(c::KIND_MEM, p.pid, p.start_ns, t, p.in_job());
        e.counters[c::MM_ANONPAGES] = cur;
        e.faults = p.faults;
        e.reason = if first {
            c::MEM_REASON_FIRST
        } else if moved >= threshold {
            c::MEM_REASON_THRESHOLD
        } else {
            c::MEM_REASON_HEARTBEAT
        };
        e.comm = comm(p.name);
        e.pgtables_bytes = (cur as u64 / 512) * 4096;
        e.memcg_id = if p.in_job() { CGROUP_ID } else { 1 };
        self.kernel(t, c::KIND_MEM, &e);
        p.reported = cur;
        p.last_emit = t;
    }

    fn fork(&mut self, t: u64, parent: &Proc, name: &'static str, role: Role) -> Proc {
        let pid = self.next_worker_pid;
        // A small pool of pids, so the kernel's recycling shows up.
        self.next_worker_pid = 5000 + (self.next_worker_pid - 5000 + 1) % 48;
        let mut e: c::ForkEvent = zeroed();
        e.hdr = header(c::KIND_FORK, pid, t, t, true);
        e.parent_tgid = parent.pid;
        e.parent_start_ns = parent.start_ns;
        e.comm = comm(parent.name);
        self.kernel(t, c::KIND_FORK, &e);
        Proc {
            batch_pages: self.batch_pages,
            pid,
            start_ns: t,
            name,
            role,
            born: t,
            reported: 0,
            last_emit: t,
            cur: 0,
            faults: 0,
            alive: true,
        }
    }

    fn exit(&mut self, t: u64, p: &mut Proc, status: u32) {
        let mut e: c::ExitEvent = zeroed();
        e.hdr = header(c::KIND_EXIT, p.pid, p.start_ns, t, true);
        e.exit_code = status;
        e.group_exit_code = status;
        e.comm = comm(p.name);
        self.kernel(t, c::KIND_EXIT, &e);
        p.alive = false;
    }

    fn printk(&mut self, t: u64, tgid: u32, msg: &str) {
        let mut e: c::PrintkEvent = zeroed();
        e.hdr = header(c::KIND_PRINTK, tgid, 0, t, false);
        let n = msg.len().min(c::MSG_LEN - 1);
        e.msg[..n].copy_from_slice(&msg.as_bytes()[..n]);
        e.len = n as u32;
        self.kernel(t, c::KIND_PRINTK, &e);
    }

    /// The kernel's memcg OOM kill of `victim`, as the probes and the kernel
    /// log report it.
    fn oom_kill(&mut self, t: u64, victim: &Proc, usage_kb: u64) {
        self.failcnt += 1;
        self.printk(
            t,
            victim.pid,
            &format!(
                "memory: usage {usage_kb}kB, limit {LIMIT_KB}kB, failcnt {}",
                self.failcnt
            ),
        );
        for (kind, source, dt) in [
            (c::KIND_OOM_KILL, c::SRC_FENTRY, 0),
            (c::KIND_OOM_VICTIM, c::SRC_TP_BTF, 50_000),
        ] {
            let mut e: c::OomEvent = zeroed();
            e.hdr = header(kind, victim.pid, victim.start_ns, t + dt, true);
            e.victim_pid = victim.pid;
            e.trigger_pid = victim.pid;
            e.trigger_tgid = victim.pid;
            e.source = source;
            e.counters[c::MM_ANONPAGES] = victim.cur;
            e.total_vm = victim.cur as u64 + 50_000;
            e.pgtables = (victim.cur as u64 / 512) * 4096;
            e.victim_memcg_id = CGROUP_ID;
            if kind == c::KIND_OOM_KILL {
                e.oom_flags = c::OOM_FLAG_HAS_OC;
                e.constraint = 3;
                e.oc_memcg_id = CGROUP_ID;
                e.chosen_points = victim.cur + e.pgtables as i64 / 4096;
                e.totalpages = LIMIT_KB / PAGE_KB;
            }
            e.comm = comm(victim.name);
            e.trigger_comm = comm(victim.name);
            self.kernel(t + dt, kind, &e);
        }
        self.printk(
            t + 60_000,
            victim.pid,
            &format!(
                "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/trainbpf-gen,task_memcg=/trainbpf-gen,task={},pid={},uid=1000",
                victim.name, victim.pid
            ),
        );
        self.printk(
            t + 70_000,
            victim.pid,
            &format!(
                "Memory cgroup out of memory: Killed process {} ({}) total-vm:{}kB, anon-rss:{}kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:{}kB oom_score_adj:0",
                victim.pid,
                victim.name,
                (victim.cur as u64 + 50_000) * PAGE_KB,
                victim.cur as u64 * PAGE_KB,
                victim.cur as u64 / 512 * 4
            ),
        );
    }
}

/// The collector's once-a-second sample for memory `used_kb` on the
/// machine and `usage_kb` in the job's cgroup.
#[allow(
    clippy::field_reassign_with_default,
    reason = "set field by field on a default, so that keys the collector adds later read as not sampled"
)]
fn pressure(g: &Gen, used_kb: u64, usage_kb: u64) -> Pressure {
    let mut cg = CgroupPressure::default();
    cg.usage_kb = usage_kb;
    cg.limit_kb = Some(LIMIT_KB);
    cg.max_events = g.failcnt;
    cg.oom_events = g.failcnt;
    cg.oom_kill_events = g.failcnt;
    let mut p = Pressure::default();
    p.mem_total_kb = MEM_TOTAL_KB;
    p.mem_available_kb = MEM_TOTAL_KB.saturating_sub(used_kb + (6 << 20));
    p.shmem_kb = 1 << 20;
    p.committed_as_kb = used_kb + (8 << 20);
    p.commit_limit_kb = MEM_TOTAL_KB / 2;
    p.overcommit_memory = Some(0);
    p.cgroup = Some(cg);
    p.psi = Some(Psi {
        some_avg10: 0.12,
        full_avg10: 0.0,
        some_total_us: g.psi_us,
        full_total_us: g.psi_us / 4,
    });
    p.stall_ns = g.stall;
    p.stall_count = [g.stall[0] / MS, g.stall[1] / (100 * MS), 0];
    p
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gen_recording: {e}");
            return ExitCode::FAILURE;
        }
    };
    match generate(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gen_recording: {e}");
            ExitCode::FAILURE
        }
    }
}

fn generate(a: &Args) -> std::io::Result<()> {
    let started = Instant::now();
    let rec_header = RecordingHeader {
        trainbpf_version: format!("{} (gen_recording)", env!("CARGO_PKG_VERSION")),
        kernel: "6.8.0-synthetic".into(),
        hostname: "synthetic".into(),
        page_size: PAGE_KB * 1024,
        mem_total_kb: MEM_TOTAL_KB,
        swap_total_kb: 0,
        overcommit: Default::default(),
        clock: ClockPair {
            monotonic_ns: T0,
            // 2025-03-01T00:00:00Z
            realtime_ns: 1_740_787_200 * SEC,
            uncertainty_ns: None,
        },
        attach: Attach {
            oom_context: Some("fentry:oom_kill_process".into()),
            oom_victim: Some("tp_btf:mark_victim".into()),
            memory: Some(trainbpf::loader::RSS_VIA_PAGES.into()),
            lifecycle: Some("tp_btf:sched_process_{fork,exec,exit}".into()),
            printk: Some("tracepoint:printk:console".into()),
            ..Attach::default()
        },
        fallbacks: Vec::new(),
        config: RecordConfig {
            rss_threshold_bytes: (THRESHOLD_PAGES as u64) * PAGE_KB * 1024,
            rss_relative_shift: RELATIVE_SHIFT,
            heartbeat_ms: HEARTBEAT / MS,
            ring_bytes: 4 << 20,
        },
        recorder_pid: None,
    };
    let file = File::create(&a.out)?;
    let w = Writer::new(BufWriter::with_capacity(1 << 20, file), &rec_header)
        .map_err(std::io::Error::other)?;
    let mut g = Gen {
        batch_pages: a.batch_mib * MIB_PAGES,
        w,
        frame: Vec::new(),
        counts: [0; 16],
        next_worker_pid: 5000,
        next_other_pid: 20_000,
        failcnt: 0,
        stall: [0; 3],
        psi_us: 0,
    };
    let end = T0 + (a.hours * 3600.0 * SEC as f64) as u64;
    let kills = [0.23, 0.55, 0.9].map(|f| T0 + ((end - T0) as f64 * f) as u64);

    let mut trainer = Proc {
        batch_pages: 0,
        pid: ROOT,
        start_ns: T0 - SEC,
        name: "python3",
        role: Role::Trainer,
        born: T0,
        reported: 0,
        last_emit: T0,
        cur: 0,
        faults: 0,
        alive: true,
    };
    g.user(
        T0,
        UserBody::JobStart(JobStart {
            pid: ROOT,
            start_ns: 0,
            argv: vec![
                "python3".into(),
                "train.py".into(),
                "--epochs".into(),
                "96".into(),
            ],
            cwd: "/home/ml/run".into(),
            uid: 1000,
            gid: 1000,
            cgroup: Some("/trainbpf-gen".into()),
            memory_limit_bytes: Some(LIMIT_KB * 1024),
            attached: None,
            target: None,
        }),
    );
    g.user(
        T0,
        UserBody::Cgroup(CgroupName {
            id: CGROUP_ID,
            path: "/trainbpf-gen".into(),
        }),
    );
    let mut e: c::ExecEvent = zeroed();
    e.hdr = header(c::KIND_EXEC, ROOT, trainer.start_ns, T0 + MS, true);
    e.comm = comm("python3");
    let f = b"/usr/bin/python3";
    e.filename[..f.len()].copy_from_slice(f);
    g.kernel(T0 + MS, c::KIND_EXEC, &e);

    let mut others: Vec<Proc> = (0..12u32)
        .map(|i| Proc {
            batch_pages: 0,
            pid: 300 + i * 7,
            start_ns: SEC + i as u64,
            name: [
                "systemd",
                "journald",
                "dockerd",
                "containerd",
                "sshd",
                "rsyslogd",
                "cron",
                "node_exporter",
                "nvidia-persist",
                "tailscaled",
                "dbus-daemon",
                "chronyd",
            ][i as usize],
            role: Role::Daemon(i),
            // Up to 55 minutes before the recording began (T0 is an hour
            // after boot).
            born: T0 - i as u64 * 300 * SEC,
            reported: 0,
            last_emit: 0,
            cur: 0,
            faults: 0,
            alive: true,
        })
        .collect();

    let mut workers: Vec<Proc> = Vec::new();
    let mut epoch_start = T0;
    let mut next_kill = 0;
    let mut t = T0;
    while t < end {
        let sec_end = (t + SEC).min(end);
        // A new epoch: the DataLoader's workers exit and new ones are forked.
        if t >= epoch_start {
            for mut w in workers.drain(..) {
                if w.alive {
                    g.exit(t, &mut w, 0);
                }
            }
            for _ in 0..a.procs - 1 {
                let w = g.fork(t + MS, &trainer, "pt_data_worker", Role::Worker);
                workers.push(w);
            }
            epoch_start += EPOCH;
        }
        // The next kill's worker starts leaking a minute before it.
        if next_kill < kills.len()
            && t + 60 * SEC >= kills[next_kill]
            && !workers.iter().any(|w| w.role == Role::Leaker)
        {
            let mut old = workers.remove(0);
            if old.alive {
                g.exit(t, &mut old, 0);
            }
            let l = g.fork(t + MS, &trainer, "pt_data_worker", Role::Leaker);
            workers.insert(0, l);
        }
        // Compilers beside the job, every two hours for ten minutes.
        if (t - T0) % (2 * 3600 * SEC) < 600 * SEC && (t - T0).is_multiple_of(30 * SEC) {
            let pid = g.next_other_pid;
            g.next_other_pid = 20_000 + (g.next_other_pid - 20_000 + 1) % 500;
            others.push(Proc {
                batch_pages: 0,
                pid,
                start_ns: t,
                name: "cc1plus",
                role: Role::Compiler,
                born: t,
                reported: 0,
                last_emit: t,
                cur: 0,
                faults: 0,
                alive: true,
            });
        }
        let mut tick = t;
        while tick < sec_end {
            g.mem(&mut trainer, tick);
            for w in workers.iter_mut().filter(|w| w.alive) {
                g.mem(w, tick);
            }
            for o in others.iter_mut() {
                g.mem(o, tick);
            }
            tick += TICK;
        }
        // A compiler runs for 30 s; its exit is not recorded (outside the job).
        others.retain(|o| o.role != Role::Compiler || t - o.born < 30 * SEC);

        let job_kb: u64 = (trainer.cur as u64
            + workers
                .iter()
                .filter(|w| w.alive)
                .map(|w| w.cur as u64)
                .sum::<u64>())
            * PAGE_KB;
        let cache_kb = 2 << 20;
        let usage_kb = (job_kb + cache_kb).min(LIMIT_KB);
        if let Some(i) = workers
            .iter()
            .position(|w| w.role == Role::Leaker && w.alive)
            && job_kb + cache_kb >= LIMIT_KB
        {
            let kill_t = sec_end - 100 * MS;
            g.stall[1] += 800 * MS;
            let mut victim = workers.remove(i);
            g.oom_kill(kill_t, &victim, usage_kb);
            g.exit(kill_t + 5 * MS, &mut victim, 9);
            next_kill += 1;
            let w = g.fork(kill_t + 500 * MS, &trainer, "pt_data_worker", Role::Worker);
            workers.push(w);
        }
        g.stall[0] += 2 * MS;
        g.psi_us += 1500;
        let others_kb: u64 = others.iter().map(|o| o.cur as u64 * PAGE_KB).sum();
        let p = pressure(&g, job_kb + others_kb, usage_kb);
        g.user(sec_end - MS, UserBody::Pressure(Box::new(p)));
        g.flush()?;
        t = sec_end;
    }
    for mut w in workers.drain(..) {
        if w.alive {
            g.exit(end - 2 * MS, &mut w, 0);
        }
    }
    let mut root = trainer;
    g.exit(end - MS, &mut root, 0);
    g.user(
        end,
        UserBody::JobExit(JobExit {
            pid: ROOT,
            status: ExitStatus::Code(0),
        }),
    );
    g.user(end, UserBody::Lost(Lost::default()));
    g.flush()?;
    let bytes = g.w.bytes_written();
    let secs = (end - T0) as f64 / SEC as f64;
    let mem = g.counts[c::KIND_MEM as usize];
    eprintln!(
        "gen_recording: wrote {} ({:.1} MB) in {:.1} s: {:.1} h of a {}-process job; {} memory records ({:.1}/s), {} forks, {} exits, {} OOM kills, {} collector records (pressure, job, cgroup)",
        a.out.display(),
        bytes as f64 / 1e6,
        started.elapsed().as_secs_f64(),
        secs / 3600.0,
        a.procs,
        mem,
        mem as f64 / secs,
        g.counts[c::KIND_FORK as usize],
        g.counts[c::KIND_EXIT as usize],
        g.counts[c::KIND_OOM_KILL as usize],
        g.counts[15],
    );
    Ok(())
}
