//! The report's `leaks` array, `leak_projection` object and
//! `leak_warnings` (docs/report-json.md, "leaks[]").

use schemars::JsonSchema;
use serde::Serialize;

use crate::model::Report;
use crate::model::leaks::Domain as ModelDomain;

use super::{secs, secs_since, tenths};

/// A warning `record` gave while the job ran.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct LeakWarning {
    pub comm: String,
    /// The trend's fit, 0 to 1.
    pub(crate) fit: f64,
    /// The role group; null for a process.
    pub group: Option<String>,
    /// `leak`: a suspected leak; `running_out`: memory projected to run
    /// out within minutes, from any steady climb (the steepest named,
    /// `slope_kb_per_s` theirs together), before `--leak-span` had passed.
    #[schemars(extend("enum" = ["leak", "running_out"]))]
    pub(crate) kind: String,
    /// The limit the projection ran into (kB).
    pub limit_kb: Option<u64>,
    /// What the limit is.
    #[schemars(extend("enum" = ["cgroup", "machine", null]))]
    pub limit_of: Option<String>,
    /// Null for a role group.
    pub pid: Option<u32>,
    /// Seconds from the warning until the limit, at the slope.
    pub projected_oom_s: Option<u64>,
    /// When the climb began, seconds since the recording start.
    pub(crate) since: f64,
    pub(crate) slope_kb_per_s: f64,
    /// When the warning was given, seconds since the recording start.
    pub(crate) time_s: f64,
}

impl LeakWarning {
    pub(crate) fn all(r: &Report) -> Vec<LeakWarning> {
        r.leak_warnings
            .iter()
            .map(|(ts, w)| LeakWarning {
                comm: w.comm.clone(),
                fit: w.fit_permille as f64 / 1000.0,
                group: w.group.clone(),
                kind: if w.running_out { "running_out" } else { "leak" }.into(),
                limit_kb: w.limit_kb,
                limit_of: w.limit_of.clone(),
                pid: w.pid,
                projected_oom_s: w.projected_oom_s,
                since: secs_since(r, w.since_ns),
                slope_kb_per_s: (w.slope_bytes_per_s as f64 / 102.4).round() / 10.0,
                time_s: secs_since(r, *ts),
            })
            .collect()
    }
}

/// A suspected leak: a sustained climb of a job process's (or role
/// group's) honest memory.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Leak {
    /// Still running when the recording ended (a group: any member).
    pub(crate) alive: bool,
    /// Its latest command name; for a group, its latest member's.
    pub(crate) comm: String,
    /// Share of the variance the trend explains, 0 to 1.
    #[schemars(range(min = 0, max = 1))]
    pub(crate) fit: f64,
    /// The role group: the process's (null when it has none), or the
    /// group's own.
    pub(crate) group: Option<String>,
    /// `slope_kb_per_s × span_s`.
    pub(crate) growth_kb: i64,
    /// The limit the projection runs into: the job cgroup's limit, or
    /// MemTotal plus SwapTotal.
    pub(crate) limit_kb: Option<u64>,
    /// Processes in the group; 1 for a process.
    pub(crate) members: usize,
    /// Null for a role group.
    pub(crate) pid: Option<u32>,
    /// Seconds from the end of the recording until the leaks still running
    /// reach `limit_kb`; the same in every entry; null when nothing leaking
    /// is alive at the end, or no limit is known.
    pub(crate) projected_oom_s: Option<f64>,
    /// When the sustained climb began, seconds since the recording start.
    pub(crate) since: f64,
    /// The largest the process (or group) was: RSS or honest memory.
    pub(crate) size_kb: u64,
    /// The climb's rate, kB per second.
    pub(crate) slope_kb_per_s: f64,
    /// Seconds from `since` to its end.
    pub(crate) span_s: f64,
}

impl Leak {
    /// Suspected leaks, steepest first.
    pub(crate) fn all(r: &Report) -> Vec<Leak> {
        let p = r.leaks.projection.as_ref();
        r.leaks
            .leaks()
            .map(|t| Leak {
                alive: t.alive,
                comm: t.comm.clone(),
                fit: (t.fit * 1000.0).round() / 1000.0,
                group: t.group.clone(),
                growth_kb: t.growth_kb,
                limit_kb: p.map(|p| p.limit_kb),
                members: t.members,
                pid: t.pid,
                projected_oom_s: p.and_then(|p| p.seconds).map(tenths),
                since: secs_since(r, t.since_ns),
                size_kb: t.size_kb,
                slope_kb_per_s: tenths(t.slope_kb_per_s),
                span_s: secs(t.until_ns.saturating_sub(t.since_ns)),
            })
            .collect()
    }
}

/// The projection the `leaks` entries share, with what it was made from.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct LeakProjection {
    pub(crate) domain: Domain,
    /// The limit (kB).
    pub(crate) limit_kb: u64,
    /// The leak span the trends were judged by (`--leak-span`), seconds.
    pub(crate) min_span_s: f64,
    /// `(limit_kb - usage_kb) / slope_kb_per_s`; null when the slope is 0.
    pub(crate) seconds: Option<f64>,
    /// The live leaks' summed slope; 0 when none.
    pub(crate) slope_kb_per_s: f64,
    /// Usage at the end (kB), projected from the recent samples.
    pub(crate) usage_kb: u64,
}

impl LeakProjection {
    pub(crate) fn new(r: &Report) -> Option<LeakProjection> {
        r.leaks.projection.as_ref().map(|p| LeakProjection {
            domain: match p.domain {
                ModelDomain::Cgroup => Domain::Cgroup,
                ModelDomain::Machine => Domain::Machine,
            },
            limit_kb: p.limit_kb,
            min_span_s: secs(r.leaks.min_span_ns),
            seconds: p.seconds.map(tenths),
            slope_kb_per_s: tenths(p.slope_kb_per_s),
            usage_kb: p.usage_kb,
        })
    }
}

/// What a leak projection runs into.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Domain {
    /// The job's memory cgroup.
    Cgroup,
    /// MemTotal plus SwapTotal.
    Machine,
}

#[cfg(test)]
mod tests {
    use crate::model::leaks::{Domain, LeakReport, Projection, Trend, Verdict};
    use crate::render::fixture::sample_report;
    use serde_json::json;

    #[test]
    fn leaks_carry_the_documented_keys() {
        let mut r = sample_report();
        let t = Trend {
            pid: None,
            start_ns: 0,
            comm: "pt_data_worker".into(),
            group: Some("DataLoader workers".into()),
            members: 6,
            alive: true,
            slope_kb_per_s: 1234.56,
            fit: 0.91234,
            since_ns: 2_500_000_000,
            until_ns: 22_000_000_000,
            growth_kb: 24_000,
            size_kb: 200_000,
            verdict: Verdict::Leak,
        };
        r.leaks = LeakReport {
            trends: vec![
                t.clone(),
                Trend {
                    verdict: Verdict::Small,
                    ..t
                },
            ],
            projection: Some(Projection {
                domain: Domain::Machine,
                limit_kb: 1 << 20,
                usage_kb: 1 << 19,
                slope_kb_per_s: 1234.56,
                seconds: Some(424.81),
            }),
            min_span_ns: 300_000_000_000,
            untracked: 0,
        };
        let v = crate::render::json::render(&r);
        let leaks = v["leaks"].as_array().unwrap();
        assert_eq!(leaks.len(), 1, "only suspected leaks: {leaks:#?}");
        let l = &leaks[0];
        for k in [
            "pid",
            "comm",
            "group",
            "slope_kb_per_s",
            "fit",
            "since",
            "projected_oom_s",
            "limit_kb",
        ] {
            assert!(l.get(k).is_some(), "leaks[].{k}");
        }
        assert!(l["pid"].is_null(), "a group has no pid");
        assert_eq!(l["group"], "DataLoader workers");
        assert_eq!(l["slope_kb_per_s"], 1234.6);
        assert_eq!(l["fit"], 0.912);
        assert_eq!(l["since"], 2.0, "from the recording's start at 0.5 s");
        assert_eq!(l["projected_oom_s"], 424.8);
        assert_eq!(l["limit_kb"], 1 << 20);
        assert_eq!(v["leak_projection"]["domain"], "machine");
        assert_eq!(v["leak_projection"]["min_span_s"], 300.0);

        // No limit known: null, not absent.
        r.leaks.projection = None;
        let v = crate::render::json::render(&r);
        assert!(v["leaks"][0]["projected_oom_s"].is_null());
        assert!(v["leaks"][0]["limit_kb"].is_null());
        assert!(v["leak_projection"].is_null());
        r.leaks = LeakReport::default();
        assert_eq!(crate::render::json::render(&r)["leaks"], json!([]));
    }
}
