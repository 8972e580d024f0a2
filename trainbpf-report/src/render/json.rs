//! The report as JSON, schema `trainbpf.report/1` (docs/report-json.md).
//!
//! The JSON is a tree of view structs, one module per report section, each
//! built from the model here rather than derived from the model's own types:
//! a change to the model cannot silently change what scripts reading the
//! JSON see. docs/report.schema.json is generated from these structs
//! ([`schema`]; their doc comments are its descriptions), and an
//! unprivileged test (tests/report_json.rs) fails when the checked-in file
//! and the generated one differ.
//!
//! Two rules keep the output what it has always been:
//! - Fields are declared in alphabetical order, the order serde_json's map
//!   has always printed the keys in. Serialized directly or through a
//!   `serde_json::Value`, the bytes are the same (a unit test holds that).
//! - Every key is always present: an unknown value is `null`, never a
//!   missing key. No field is skipped, and the schema is generated for the
//!   serialize side, where an `Option` field is required and nullable.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use crate::model::{ExitStatus, Report, ns_to_s};
use crate::render::rfc3339_ms;

/// The `diagnoses` array: what most likely happened, per kill.
mod diagnoses;
/// The `ebpf_log` object: what the kernel programs logged.
mod ebpf_log;
/// The `gpu` object.
mod gpu;
/// `gpu.late`: driver libraries mapped after recording started.
mod gpu_late;
/// Ranks, runs, Slurm steps and containers per process.
mod identity;
/// `kills[]`, with the victim, growers, ranking and pressure.
mod kills;
/// The `leaks` array, `leak_projection` and `leak_warnings`.
mod leaks;
/// `recordings[]`, `first_failure`, and several recordings as one.
mod merged;
pub(crate) use merged::render_merged;
/// `job`, `processes[]`, `deaths[]`, `groups[]`, `shared_memory[]`,
/// `top_memory[]` and `smaps_cost`.
mod processes;
/// The `recording` object and the `lost` breakdown.
mod recording;
/// The `run` object: the whole run, from the bounded series.
mod run;
/// `shm_filesystems[]` and `shm_sampling`: /dev/shm and its looks.
mod shm;
/// Growth stacks, for growers and processes.
mod stacks;

/// Adding keys keeps this; removing or renaming one, or changing a type or
/// unit, bumps it.
pub(crate) const SCHEMA: &str = "trainbpf.report/1";

/// `trainbpf report --json`, schema trainbpf.report/1, as
/// docs/report-json.md describes it. Every key is always present (an
/// unknown value is null, never a missing key); objects allow more keys,
/// since adding a key keeps /1. Sizes are kB (1024 bytes) in keys ending in
/// `_kb`, bytes in keys ending in `_bytes`; `*_s` values are seconds, to the
/// millisecond, and `time_s`, `born_s` and `died_s` count from the
/// recording's first event.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(title = "trainbpf report --json", extend("$id" = SCHEMA))]
pub(crate) struct JsonReport {
    /// The `sum_check` object at the job cgroup's highest usage: the job
    /// processes' honest growth since the start against the cgroup's.
    pub(crate) attribution_at_peak: Option<kills::SumCheck>,
    /// Every job process that ended, with its cause, in time order.
    pub(crate) deaths: Vec<processes::Death>,
    /// What most likely happened, with the evidence and the fix: each
    /// kill's diagnoses, its most likely first, in kill order; then those
    /// about the whole run. Empty when no rule found its evidence.
    pub(crate) diagnoses: Vec<diagnoses::Diagnosis>,
    /// What the kernel programs logged (`record --ebpf-log`).
    pub(crate) ebpf_log: ebpf_log::EbpfLog,
    /// The first failure across the job (an OOM kill of a job process, a
    /// death by a signal or a crash, a nonzero exit), when several
    /// recordings of one job are merged; null for one recording.
    pub(crate) first_failure: Option<merged::FirstFailure>,
    /// GPU and pinned host memory per process, CUDA OOMs, Xid errors, NVML.
    pub(crate) gpu: gpu::Gpu,
    /// The job's processes that play one role, over the whole run.
    pub(crate) groups: Vec<processes::Group>,
    /// The recorded command; null if the recording holds no job-start
    /// record.
    pub(crate) job: Option<processes::Job>,
    /// What reading the job's memory and files cost and skipped.
    pub(crate) job_reads: recording::JobReads,
    /// One entry per OOM kill, in time order; empty if none.
    pub(crate) kills: Vec<kills::Kill>,
    /// Memory cgroup OOM kills elsewhere on the machine, left out of
    /// `kills`: the cgroup that ran out was neither the job's nor one of
    /// its parents, and neither its victim nor any grower was the job's
    /// (another job's own limit). Always 0 where the job has no cgroup
    /// (`record --all`).
    pub(crate) kills_elsewhere: u32,
    /// What the leaks' `projected_oom_s` and `limit_kb` come from; null when
    /// the recording has no memory-pressure samples.
    pub(crate) leak_projection: Option<leaks::LeakProjection>,
    /// The leaks `record` warned of on stderr while the job ran, each
    /// process or group once; empty when none was given.
    pub(crate) leak_warnings: Vec<leaks::LeakWarning>,
    /// Suspected memory leaks, steepest first: job processes and role
    /// groups whose honest memory climbed steadily; empty if none.
    pub(crate) leaks: Vec<leaks::Leak>,
    /// The breakdown of `lost_events`.
    pub(crate) lost: recording::Lost,
    /// Events the report could not see: ring-buffer records the kernel
    /// dropped, records that did not decode, samples dropped while the disk
    /// was full, and job processes the kernel's maps had no room for. 0
    /// means nothing was lost.
    pub(crate) lost_events: u64,
    /// The job's processes, by birth.
    pub(crate) processes: Vec<processes::Process>,
    /// What was recorded and how.
    pub(crate) recording: recording::Recording,
    /// The recordings this report is made of, in the order given: one for
    /// `report FILE`; one per node for `report A.rec B.rec ...` or `report
    /// DIR`, whose kills, deaths and processes are then every recording's
    /// (each with its `host` and `recording`), and whose other sections
    /// (and `recording`) are the first recording's.
    pub(crate) recordings: Vec<merged::Recording>,
    /// The whole run, from the charts' bounded series.
    pub(crate) run: run::Run,
    /// The schema's name and version.
    #[schemars(extend("const" = SCHEMA))]
    pub(crate) schema: &'static str,
    /// Shared-memory objects (POSIX `/dev/shm`, SysV, memfd), each once
    /// however many processes map it, biggest first.
    pub(crate) shared_memory: Vec<processes::SharedObject>,
    /// The /dev/shm filesystems (tmpfs) the recorder looked at: the job's
    /// own first (in a container or a private mount namespace it has its
    /// own), with size and use.
    pub(crate) shm_filesystems: Vec<shm::ShmFilesystem>,
    /// How often shared memory was looked at, and what it cost.
    pub(crate) shm_sampling: shm::ShmSampling,
    /// What the USS/PSS sampling cost the recorder.
    pub(crate) smaps_cost: processes::SmapsCost,
    /// Up to 10 processes, any on the machine, by peak resident memory.
    #[schemars(length(max = 10))]
    pub(crate) top_memory: Vec<processes::TopMemory>,
}

impl JsonReport {
    pub(crate) fn new(r: &Report) -> JsonReport {
        JsonReport {
            attribution_at_peak: r.attribution_at_peak.as_ref().map(kills::SumCheck::new),
            deaths: r
                .deaths
                .iter()
                .map(|d| processes::Death::new(r, d))
                .collect(),
            diagnoses: diagnoses::Diagnosis::all(r),
            ebpf_log: ebpf_log::EbpfLog::new(r),
            first_failure: None,
            gpu: gpu::Gpu::new(r),
            groups: r.groups.iter().map(processes::Group::new).collect(),
            job: r.job.as_ref().map(|j| processes::Job::new(j, r.title())),
            job_reads: recording::JobReads::new(r),
            kills: r.kills.iter().map(|k| kills::Kill::new(r, k)).collect(),
            kills_elsewhere: r.kills_elsewhere,
            leak_projection: leaks::LeakProjection::new(r),
            leak_warnings: leaks::LeakWarning::all(r),
            leaks: leaks::Leak::all(r),
            lost: recording::Lost::new(r),
            lost_events: r.lost_events(),
            processes: r
                .processes
                .iter()
                .map(|p| processes::Process::new(r, p))
                .collect(),
            recording: recording::Recording::new(r),
            recordings: merged::Recording::alone(r),
            run: run::Run::new(r),
            schema: SCHEMA,
            shared_memory: processes::SharedObject::all(r),
            shm_filesystems: shm::ShmFilesystem::all(r),
            shm_sampling: shm::ShmSampling::new(r),
            smaps_cost: processes::SmapsCost {
                rounds: r.smaps_rounds,
                total_us: r.smaps_cost_us,
            },
            top_memory: processes::TopMemory::all(r),
        }
    }
}

/// The report as a JSON value (what `report --json` prints, pretty).
pub(crate) fn render(r: &Report) -> Value {
    // Only a map with non-string keys can fail to convert, and there is none.
    serde_json::to_value(JsonReport::new(r)).unwrap_or(Value::Null)
}

/// The JSON Schema of [`JsonReport`], as docs/report.schema.json holds it.
pub fn schema() -> schemars::Schema {
    schemars::generate::SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator()
        .into_root_schema_for::<JsonReport>()
}

/// [`schema`] as the text of docs/report.schema.json.
pub fn schema_text() -> String {
    let mut s = serde_json::to_string_pretty(&schema()).unwrap_or_default();
    s.push('\n');
    s
}

/// A wall-clock time: RFC 3339 UTC with milliseconds
/// (`2025-03-01T12:34:56.789Z`), from the recording's clock pair.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(transparent)]
pub(crate) struct Time(
    #[schemars(pattern(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$"))]
    String,
);

impl Time {
    /// Null without a clock pair.
    fn at(r: &Report, mono_ns: u64) -> Option<Time> {
        r.realtime_ns(mono_ns).map(Time::real)
    }

    fn real(realtime_ns: u64) -> Time {
        Time(rfc3339_ms(realtime_ns))
    }
}

/// How a process ended, as `wait(2)` reported it: `{"code": N}` or
/// `{"signal": N}`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Exit {
    /// It exited with this code.
    Code(i32),
    /// This signal ended it.
    Signal(i32),
}

impl From<ExitStatus> for Exit {
    fn from(s: ExitStatus) -> Exit {
        match s {
            ExitStatus::Code(c) => Exit::Code(c),
            ExitStatus::Signal(n) => Exit::Signal(n),
        }
    }
}

/// Seconds, to the millisecond: more digits would be noise.
fn secs(ns: u64) -> f64 {
    (ns_to_s(ns) * 1000.0).round() / 1000.0
}

/// Seconds since the first event; negative for a birth before it (a job
/// process the recorder met already running).
fn secs_since(r: &Report, ts: u64) -> f64 {
    let first = r.first_ns.unwrap_or(ts);
    let d = ts as f64 - first as f64;
    (d / 1e6).round() / 1000.0
}

/// To a tenth: a rate or a projection, whose hundredths are noise.
fn tenths(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::recording::ClockPair;
    use crate::render::fixture::sample_report;

    #[test]
    fn fields_are_in_the_printed_key_order() {
        // serde_json's map sorts keys; the structs must list them in that
        // order for a direct serialization to print the same bytes.
        for r in [sample_report(), full_report(), gpu::tests::gpu_report()] {
            let direct = serde_json::to_string_pretty(&JsonReport::new(&r)).unwrap();
            let through_value = serde_json::to_string_pretty(&render(&r)).unwrap();
            assert_eq!(direct, through_value);
        }
    }

    #[test]
    fn has_the_documented_keys() {
        let v = render(&sample_report());
        assert_eq!(v["schema"], "trainbpf.report/1");
        for k in [
            "kernel",
            "attach",
            "fallbacks",
            "duration_s",
            "stopped_early",
            "skipped",
            "skipped_ranges",
            "skipped_bytes",
        ] {
            assert!(v["recording"].get(k).is_some(), "recording.{k}");
        }
        assert_eq!(v["recording"]["duration_s"], 21.5);
        assert!(v["recording"]["stopped_early"].is_null());
        assert_eq!(v["recording"]["skipped"], json!([]));
        assert_eq!(v["recording"]["skipped_ranges"], 0);
        assert_eq!(v["job"]["pid"], 700);
        assert_eq!(v["job"]["exit"], json!({"signal": 9}));
        assert_eq!(v["job"]["memory_limit_bytes"], 300 << 20);
        let k = &v["kills"][0];
        assert_eq!(k["time"], "2024-02-29T23:59:59.999Z");
        assert_eq!(k["time_s"], 20.0);
        for key in [
            "pid",
            "comm",
            "anon_rss_kb",
            "file_rss_kb",
            "shmem_rss_kb",
            "swap_kb",
            "oom_score_adj",
            "uid",
            "in_job",
            "tree",
        ] {
            assert!(k["victim"].get(key).is_some(), "victim.{key}");
        }
        assert_eq!(
            k["victim"]["tree"][0],
            json!({"pid": 700, "comm": "python3"})
        );
        assert_eq!(k["constraint"], "memcg");
        assert_eq!(k["memcg"], "/trainbpf-77");
        assert_eq!(k["memcg_limit_kb"], 307_200);
        assert_eq!(k["trigger"]["pid"], 812);
        assert_eq!(k["source"], "fentry+tp_btf");
        assert_eq!(k["kernel_points"], 65_000);
        assert_eq!(k["totalpages"], 76_800);
        let g = &k["growers"][0];
        for key in [
            "pid",
            "comm",
            "grew_kb",
            "window_s",
            "rate_kb_per_s",
            "rss_kb",
            "in_job",
        ] {
            assert!(g.get(key).is_some(), "grower.{key}");
        }
        assert_eq!(g["window_s"], 12.0);
        assert_eq!(v["processes"][0]["born_s"], 0.0);
        // 3 ring-buffer losses, 1 undecodable in the collector, 2 in the file.
        assert_eq!(v["lost_events"], 6);
        assert_eq!(v["lost"]["by_kind"]["mem"], 3);
        assert_eq!(v["lost"]["by_kind"]["kind_0"], 0);
        assert_eq!(v["lost"]["undecodable"], 3);
    }

    #[test]
    fn missing_pieces_are_null_not_absent() {
        let mut r = sample_report();
        r.job = None;
        r.stopped_early = Some(crate::recording::Stop {
            offset: 4096,
            reason: "frame checksum mismatch".into(),
        });
        r.kills[0].kernel_points = None;
        r.header.clock = ClockPair::default();
        r.kills[0].realtime_ns = r.realtime_ns(r.kills[0].ts_ns);
        r.skipped = crate::recording::Skipped {
            ranges: vec![crate::recording::Skip {
                offset: 1024,
                bytes: 300,
                reason: "bad frame magic".into(),
            }],
            count: 1,
            bytes: 300,
        };
        let v = render(&r);
        assert!(v["job"].is_null());
        assert_eq!(v["recording"]["stopped_early"]["offset"], 4096);
        assert_eq!(
            v["recording"]["skipped"],
            json!([{"offset": 1024, "bytes": 300, "reason": "bad frame magic"}])
        );
        assert_eq!(v["recording"]["skipped_bytes"], 300);
        assert!(v["kills"][0]["kernel_points"].is_null());
        assert!(v["kills"][0].get("kernel_points").is_some());
        // Without a clock pair there is no wall-clock time to give.
        assert!(v["kills"][0]["time"].is_null());
    }

    /// The sample with every optional section filled: the ranking, the
    /// pressure, the sum check, groups, leaks and their warnings,
    /// compaction, shared memory, a damaged file.
    fn full_report() -> Report {
        use crate::model::leaks::{Domain, Projection, Trend, Verdict};
        use crate::model::{PressureBefore, RankedCandidate, Ranking, SumCheck, TotalSource};
        let mut r = sample_report();
        let sum = SumCheck {
            ts_ns: 20_000_000_000,
            cgroup_delta_kb: 300_000,
            attributed_kb: 280_000,
            unattributed_kb: 20_000,
            file_delta_kb: Some(12),
            kernel_delta_kb: None,
            page_cache: Some(crate::model::CacheApart {
                at_start_kb: 1000,
                delta_kb: 12,
                job_kb: 40,
            }),
        };
        let group = crate::model::Group {
            role: "DataLoader workers".into(),
            pids: vec![812, 813],
            honest_kb: 250_000,
            grew_kb: 256_000,
            window_ns: 12_000_000_000,
        };
        let k = &mut r.kills[0];
        k.ranking = Some(Ranking {
            candidates: vec![RankedCandidate {
                pid: 812,
                start_ns: 5,
                comm: "pt_data_worker".into(),
                in_job: true,
                points: 64_900,
                rss_kb: 257_024,
                swap_kb: 0,
                pgtables_kb: 700,
                oom_score_adj: -5,
                is_victim: true,
            }],
            totalpages: 76_800,
            totalpages_source: TotalSource::Machine,
            victim_points: Some(64_900),
            agrees_with_kernel: Some(true),
        });
        k.pressure = Some(PressureBefore {
            span_ns: 10_000_000_000,
            available_start_kb: 9000,
            available_at_kill_kb: 100,
            available_min_kb: 100,
            mem_total_kb: 16 << 20,
            swap_used_kb: 0,
            swap_total_kb: 0,
            shmem_kb: 12,
            committed_as_kb: 1 << 20,
            commit_limit_kb: 8 << 20,
            overcommit_memory: Some(0),
            cgroup_usage_kb: Some(307_200),
            cgroup_limit_kb: None,
            cgroup_max_events: Some(3),
            psi_some_avg10: Some(12.5),
            psi_full_avg10: None,
            psi_some_stall_ms: Some(3300),
            stall_ms: [3300, 1, 2],
            stalls: [10, 0, 0],
            reclaim_freed_kb: 4,
        });
        k.sum_check = Some(sum.clone());
        k.groups = vec![group.clone()];
        r.groups = vec![group];
        r.attribution_at_peak = Some(sum);
        let trend = Trend {
            pid: None,
            start_ns: 0,
            comm: "pt_data_worker".into(),
            group: Some("DataLoader workers".into()),
            members: 2,
            alive: true,
            slope_kb_per_s: 100.0,
            fit: 0.9,
            since_ns: 2_500_000_000,
            until_ns: 22_000_000_000,
            growth_kb: 2000,
            size_kb: 200_000,
            verdict: Verdict::Leak,
        };
        r.leaks.trends = vec![trend];
        r.leaks.projection = Some(Projection {
            domain: Domain::Cgroup,
            limit_kb: 307_200,
            usage_kb: 300_000,
            slope_kb_per_s: 100.0,
            seconds: None,
        });
        r.leak_warnings = vec![(
            10_000_000_000,
            crate::decode::LeakWarning {
                pid: Some(812),
                comm: "pt_data_worker".into(),
                limit_of: Some("cgroup".into()),
                projected_oom_s: Some(72),
                ..Default::default()
            },
        )];
        r.ebpf_log = crate::model::EbpfLogReport {
            enabled: true,
            messages: vec![(
                r.first_ns.unwrap() + 1_500_000_000,
                crate::decode::EbpfLog {
                    program: "page_alloc".into(),
                    level: "warn".into(),
                    site: "trainbpf-ebpf/src/procs.rs:131".into(),
                    message: "PROCS full".into(),
                },
            )],
            omitted: 2,
        };
        r.compaction = Some(crate::decode::Compaction {
            count: 1,
            tiers: vec![[3600, 10]],
            ..Default::default()
        });
        // Built from its serde form, so that this test need not know which
        // module the sampler's types live in.
        r.shared_memory = serde_json::from_value(json!([{
            "kind": "posix", "name": "/dev/shm/x", "id": 7, "size_kb": 4,
            "resident_kb": 4, "owner_tgid": 812, "mappers": 2
        }]))
        .unwrap();
        r.stopped_early = Some(crate::recording::Stop {
            offset: 4096,
            reason: "frame checksum mismatch".into(),
        });
        r.processes[0].exit = Some(ExitStatus::Code(1));
        r
    }

    #[test]
    fn a_full_report_matches_the_schema() {
        let v = render(&full_report());
        let schema = schema().to_value();
        let validator = jsonschema::draft202012::new(&schema).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&v)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{errors:#?}");
        let k = &v["kills"][0];
        assert_eq!(k["ranking"]["totalpages_source"], "mem_total_plus_swap");
        assert_eq!(k["ranking"]["reconstructed"], true);
        assert_eq!(k["sources"][0]["record"], "oom_kill_process");
        assert_eq!(k["pressure"]["stall_ms"]["direct_reclaim"], 3300);
        assert_eq!(k["pressure"]["cgroup_limit_hits"], 3);
        assert_eq!(k["sum_check"]["unattributed"]["page_cache_delta_kb"], 12);
        assert_eq!(k["sum_check"]["page_cache"]["other_kb"], -28);
        assert_eq!(
            k["sum_check"]["without_page_cache"],
            json!({"cgroup_delta_kb": 299_988, "ratio": 0.933, "unattributed_kb": 19_988})
        );
        assert_eq!(v["groups"][0]["peak_rss_kb"], 256_000);
        assert_eq!(v["groups"][0]["count"], 2);
        assert_eq!(v["shared_memory"][0]["kind"], "posix");
        assert_eq!(v["shared_memory"][0]["owner_pid"], 812);
        assert_eq!(v["leak_warnings"][0]["limit_of"], "cgroup");
        assert_eq!(
            v["ebpf_log"],
            json!({"enabled": true, "omitted": 2, "messages": [{
                "level": "warn", "message": "PROCS full", "program": "page_alloc",
                "site": "trainbpf-ebpf/src/procs.rs:131", "time_s": 1.5
            }]})
        );
        assert_eq!(v["recording"]["compaction"]["tiers"][0]["bucket_s"], 10);
        assert_eq!(v["processes"][0]["exit"], json!({"code": 1}));
        // The schema is not vacuous: a kill without a victim fails, and so
        // does a constraint the kernel does not have.
        let mut bad = v.clone();
        bad["kills"][0].as_object_mut().unwrap().remove("victim");
        assert!(!validator.is_valid(&bad));
        let mut bad = v;
        bad["kills"][0]["constraint"] = json!("oom");
        assert!(!validator.is_valid(&bad));
    }

    #[test]
    fn every_property_is_required() {
        // The output never leaves a key out, so the schema must not let a
        // reader think it might.
        fn check(v: &Value, at: &str) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::Object(props)) = m.get("properties") {
                        let req = m.get("required").and_then(Value::as_array);
                        for k in props.keys() {
                            assert!(
                                req.is_some_and(|r| r.iter().any(|x| x == k)),
                                "{at}.{k} is not required"
                            );
                        }
                    }
                    for (k, x) in m {
                        check(x, &format!("{at}/{k}"));
                    }
                }
                Value::Array(a) => a.iter().for_each(|x| check(x, at)),
                _ => {}
            }
        }
        check(&schema().to_value(), "#");
    }
}
