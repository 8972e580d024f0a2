//! The report's `leaks` array and `leak_projection` object
//! (docs/report-json.md, "leaks[]"). Written out key by key, like the rest
//! of the schema.

use serde_json::{Value, json};

use crate::model::Report;

use super::{secs, secs_since};

/// Suspected leaks, steepest first.
/// The warnings `record` gave while the job ran.
pub fn warnings(r: &Report) -> Value {
    Value::Array(
        r.leak_warnings
            .iter()
            .map(|(ts, w)| {
                json!({
                    "time_s": secs_since(r, *ts),
                    "pid": w.pid,
                    "comm": w.comm,
                    "group": w.group,
                    "slope_kb_per_s": (w.slope_bytes_per_s as f64 / 102.4).round() / 10.0,
                    "fit": w.fit_permille as f64 / 1000.0,
                    "since": secs_since(r, w.since_ns),
                    "projected_oom_s": w.projected_oom_s,
                    "limit_kb": w.limit_kb,
                    "limit_of": w.limit_of,
                })
            })
            .collect(),
    )
}

pub fn leaks(r: &Report) -> Value {
    let p = r.leaks.projection.as_ref();
    let v: Vec<Value> = r
        .leaks
        .leaks()
        .map(|t| {
            json!({
                "pid": t.pid,
                "comm": t.comm,
                "group": t.group,
                "slope_kb_per_s": (t.slope_kb_per_s * 10.0).round() / 10.0,
                "fit": (t.fit * 1000.0).round() / 1000.0,
                "since": secs_since(r, t.since_ns),
                "projected_oom_s": p.and_then(|p| p.seconds).map(|s| (s * 10.0).round() / 10.0),
                "limit_kb": p.map(|p| p.limit_kb),
                "members": t.members,
                "alive": t.alive,
                "span_s": secs(t.until_ns.saturating_sub(t.since_ns)),
                "growth_kb": t.growth_kb,
                "size_kb": t.size_kb,
            })
        })
        .collect();
    Value::Array(v)
}

/// The projection the `leaks` entries share, with what it was made from.
pub fn projection(r: &Report) -> Value {
    match &r.leaks.projection {
        None => Value::Null,
        Some(p) => json!({
            "domain": p.domain.as_str(),
            "limit_kb": p.limit_kb,
            "usage_kb": p.usage_kb,
            "slope_kb_per_s": (p.slope_kb_per_s * 10.0).round() / 10.0,
            "seconds": p.seconds.map(|s| (s * 10.0).round() / 10.0),
            "min_span_s": secs(r.leaks.min_span_ns),
        }),
    }
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
