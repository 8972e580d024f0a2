//! `record --metrics ADDR` and `record --events-jsonl PATH`: what the
//! recorder sees, live, for the monitoring a cluster already runs
//! (docs/metrics.md).
//!
//! The draining thread only bumps counters and stores gauges (atomics)
//! through [`Outputs`]; the HTTP server (`server.rs`) runs on its own
//! thread and formats the registry into memory before it writes a byte
//! to a client, so a slow scraper never holds a metric's lock. Kills and
//! deaths are told apart live in `live.rs`, and written as JSON lines by
//! `jsonl.rs`.
//!
//! Labels follow Prometheus' conventions: no per-pid label, a bounded set
//! of label values. A process's comm is the job's to choose: it is
//! escaped like anything a process wrote ([`trainbpf_report::term::escape`]) and
//! cut to [`MAX_LABEL_CHARS`]; past [`MAX_KILL_SERIES`] distinct label
//! sets, a kill is counted under `comm="other"`, `rank="other"`,
//! `container="other"` (its constraint kept).

mod conns;
mod jsonl;
mod server;
mod settle;

use std::{collections::HashSet, sync::Arc, sync::atomic::AtomicU64};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
    },
    registry::Registry,
};

pub use jsonl::EventsLog;
pub use server::{bind, serve};
pub use settle::{DeathEvent, Finished, KillEvent, Live};

/// Distinct label sets of `trainbpf_oom_kills_total` before the rest fold
/// into "other".
pub const MAX_KILL_SERIES: usize = 64;
/// A label value's length at most, in characters.
pub const MAX_LABEL_CHARS: usize = 64;
/// The label value a kill past [`MAX_KILL_SERIES`] is counted under.
pub const OTHER: &str = "other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KillLabels {
    pub constraint: String,
    pub comm: String,
    pub rank: String,
    pub container: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeathLabels {
    pub cause: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The metrics a recorder serves, shared between the draining thread
/// (which updates them) and the HTTP thread (which formats them).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub kills: Family<KillLabels, Counter>,
    pub deaths: Family<DeathLabels, Counter>,
    pub deaths_after_kill: Counter,
    pub lost: Counter,
    pub job_added: Gauge,
    pub job_resident: Gauge,
    pub job_page_cache: Gauge,
    pub cgroup_usage: Gauge,
    pub cgroup_limit: FloatGauge,
    pub cgroup_page_cache: Gauge,
    pub oom_seconds: FloatGauge,
    pub gpu_device: Gauge,
    pub gpu_pinned: Gauge,
}

impl Metrics {
    /// `cgroup`: the job has a memory cgroup, whose usage and limit are
    /// served (absent otherwise, rather than a made-up zero).
    pub fn new(cgroup: bool) -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            registry: Registry::default(),
            kills: Family::default(),
            deaths: Family::default(),
            deaths_after_kill: Counter::default(),
            lost: Counter::default(),
            job_added: Gauge::default(),
            job_resident: Gauge::default(),
            job_page_cache: Gauge::default(),
            cgroup_usage: Gauge::default(),
            cgroup_limit: FloatGauge::default(),
            cgroup_page_cache: Gauge::default(),
            oom_seconds: FloatGauge::default(),
            gpu_device: Gauge::default(),
            gpu_pinned: Gauge::default(),
        };
        let r = &mut registry;
        r.register(
            "trainbpf_oom_kills",
            "OOM kills of the job's processes, by the OOM's constraint and the victim's comm, rank and container",
            m.kills.clone(),
        );
        r.register(
            "trainbpf_deaths",
            "Deaths of the job's processes by cause: oom_memcg, oom_global, signal, crash, exit",
            m.deaths.clone(),
        );
        r.register(
            "trainbpf_deaths_after_oom_kill",
            "Deaths of the job's processes that followed its first OOM kill as its consequences (ranks the launcher stopped, failed collectives, the launcher's own failed exit), among trainbpf_deaths_total",
            m.deaths_after_kill.clone(),
        );
        // Every cause from the start, at zero: rate() and increase() need
        // the series before its first death.
        for cause in CAUSES {
            let _ = m.deaths.get_or_create(&DeathLabels {
                cause: cause.into(),
            });
        }
        r.register(
            "trainbpf_lost_events",
            "Events the recorder lost (ring buffer full, maps full, undecodable, disk full)",
            m.lost.clone(),
        );
        r.register(
            "trainbpf_job_added_bytes",
            "Memory the job's live processes allocated and did not free, page cache left out",
            m.job_added.clone(),
        );
        r.register(
            "trainbpf_job_resident_bytes",
            "Resident memory (anon + file + shmem) summed over the job's live processes",
            m.job_resident.clone(),
        );
        r.register(
            "trainbpf_job_page_cache_bytes",
            "Page cache the job's live processes added and that was not dropped",
            m.job_page_cache.clone(),
        );
        if cgroup {
            r.register(
                "trainbpf_cgroup_memory_usage_bytes",
                "Usage of the job's memory cgroup",
                m.cgroup_usage.clone(),
            );
            r.register(
                "trainbpf_cgroup_memory_limit_bytes",
                "Limit of the job's memory cgroup (+Inf: none)",
                m.cgroup_limit.clone(),
            );
            r.register(
                "trainbpf_cgroup_memory_page_cache_bytes",
                "Page cache (file memory) charged to the job's memory cgroup",
                m.cgroup_page_cache.clone(),
            );
        }
        r.register(
            "trainbpf_memory_exhausted_projection_seconds",
            "Seconds until the job's memory reaches its limit (cgroup, else RAM+swap) at the current rate of its steady climbs; +Inf when nothing climbs",
            m.oom_seconds.clone(),
        );
        m.oom_seconds.set(f64::INFINITY);
        r.register(
            "trainbpf_gpu_device_bytes",
            "GPU device memory the job's processes hold through the CUDA driver",
            m.gpu_device.clone(),
        );
        r.register(
            "trainbpf_gpu_pinned_bytes",
            "Pinned (page-locked) host memory the job's processes hold through the CUDA driver",
            m.gpu_pinned.clone(),
        );
        r.register_collector(Box::new(Own));
        Metrics { registry, ..m }
    }

    /// The exposition, in Prometheus' text format (version 0.0.4).
    pub fn encode(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut s, &self.registry);
        s
    }
}

/// The causes of `trainbpf_deaths_total` (`model::Cause::as_str`).
const CAUSES: [&str; 5] = ["oom_memcg", "oom_global", "signal", "crash", "exit"];

/// A label value from something a process chose (its comm): escaped,
/// control characters made visible, cut to [`MAX_LABEL_CHARS`].
pub fn label(s: &str) -> String {
    trainbpf_report::term::escape(s)
        .chars()
        .take(MAX_LABEL_CHARS)
        .collect()
}

/// The recorder's own CPU time and resident memory, read at each scrape,
/// under the names every Prometheus client library gives them.
#[derive(Debug)]
struct Own;

impl Collector for Own {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (cpu_s, rss) = own_usage();
        let cpu = ConstCounter::new(cpu_s);
        let e = encoder.encode_descriptor(
            "process_cpu_seconds",
            "CPU time the recorder used, user and system, all threads",
            None,
            cpu.metric_type(),
        )?;
        cpu.encode(e)?;
        let rss = ConstGauge::new(rss as i64);
        let e = encoder.encode_descriptor(
            "process_resident_memory_bytes",
            "The recorder's resident memory",
            None,
            rss.metric_type(),
        )?;
        rss.encode(e)
    }
}

/// (CPU seconds, resident bytes) of this process.
fn own_usage() -> (f64, u64) {
    // SAFETY: getrusage fills the struct it is given; zeroed is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    let cpu = if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0 {
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        t(ru.ru_utime) + t(ru.ru_stime)
    } else {
        0.0
    };
    // statm's second field: resident pages.
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    (cpu, pages * page_size())
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64
}

/// What `record` was asked to serve and write.
#[derive(Default)]
pub struct Setup {
    /// `--metrics`: bound before the probes load, so that a port in use
    /// fails the recorder before it starts anything.
    pub listener: Option<std::net::TcpListener>,
    /// `--events-jsonl`.
    pub log: Option<EventsLog>,
}

impl Setup {
    pub fn is_empty(&self) -> bool {
        self.listener.is_none() && self.log.is_none()
    }

    /// What the collector needs to serve and write; `cgroup`: the job has
    /// a memory cgroup.
    pub fn start(self, cgroup: bool) -> std::io::Result<Option<Outputs>> {
        if self.is_empty() {
            return Ok(None);
        }
        Ok(Some(Outputs {
            live: Live::new(),
            metrics: Arc::new(Metrics::new(cgroup)),
            log: self.log,
            kill_series: HashSet::new(),
            last_lost: 0,
            listener: self.listener,
        }))
    }
}

/// The collector's side: sees the records, updates the metrics, writes
/// the lines.
pub struct Outputs {
    pub live: Live,
    metrics: Arc<Metrics>,
    log: Option<EventsLog>,
    kill_series: HashSet<KillLabels>,
    last_lost: u64,
    /// Served from the first tick on, once the gauges hold a first
    /// sample: a scrape before waits in the listen backlog, and never
    /// reads a limit of 0.
    listener: Option<std::net::TcpListener>,
}

impl Outputs {
    /// Settles what is due (`now`: CLOCK_MONOTONIC ns) and publishes it;
    /// `projection`: the leak model's seconds to the limit, if any.
    pub fn tick(&mut self, now: u64, projection: Option<f64>) {
        for f in self.live.settle(now) {
            self.publish(&f);
        }
        let m = &self.metrics;
        let j = self.live.job_memory();
        m.job_added.set(clamp(j.added));
        m.job_resident.set(clamp(j.resident));
        m.job_page_cache.set(clamp(j.page_cache));
        if let Some(c) = self.live.cgroup() {
            m.cgroup_usage.set(clamp(c.usage_kb as i64 * 1024));
            m.cgroup_page_cache.set(clamp(c.file_kb as i64 * 1024));
            m.cgroup_limit
                .set(c.limit_kb.map_or(f64::INFINITY, |l| l as f64 * 1024.0));
        }
        m.oom_seconds.set(projection.unwrap_or(f64::INFINITY));
        let (device, pinned) = self.live.gpu_held();
        m.gpu_device.set(clamp(device as i64));
        m.gpu_pinned.set(clamp(pinned as i64));
        let lost = self.live.lost_total();
        if lost > self.last_lost {
            m.lost.inc_by(lost - self.last_lost);
            self.last_lost = lost;
        }
        if let Some(l) = self.listener.take()
            && let Err(e) = serve(l, self.metrics.clone())
        {
            eprintln!("trainbpf: warning: --metrics: {e}; not serving");
        }
    }

    fn publish(&mut self, f: &Finished) {
        match f {
            Finished::Kill(k) => {
                let mut l = KillLabels {
                    constraint: k.constraint.as_str().into(),
                    comm: label(&k.comm),
                    rank: k.rank.map(|r| r.to_string()).unwrap_or_default(),
                    container: k.container.as_deref().map(label).unwrap_or_default(),
                };
                if !self.kill_series.contains(&l) {
                    if self.kill_series.len() >= MAX_KILL_SERIES {
                        l.comm = OTHER.into();
                        l.rank = OTHER.into();
                        l.container = OTHER.into();
                    } else {
                        self.kill_series.insert(l.clone());
                    }
                }
                self.metrics.kills.get_or_create(&l).inc();
            }
            Finished::Death(d) => {
                self.metrics
                    .deaths
                    .get_or_create(&DeathLabels {
                        cause: d.cause.as_str().into(),
                    })
                    .inc();
                if d.after_kill.is_some() {
                    self.metrics.deaths_after_kill.inc();
                }
            }
        }
        if let Some(log) = &mut self.log {
            log.write(f);
        }
    }
}

fn clamp(v: i64) -> i64 {
    v.max(0)
}

#[cfg(test)]
mod tests;
