use trainbpf_report::decode::UserBody;
use trainbpf_report::model::{Cause, Constraint};

use super::*;

fn kill(comm: &str, rank: Option<u32>) -> Finished {
    Finished::Kill(KillEvent {
        ts_ns: 1,
        pid: 700,
        comm: comm.into(),
        constraint: Constraint::Memcg,
        rank,
        container: Some("3f2a1b4c5d6e".into()),
        memcg: Some("/trainbpf-1-x".into()),
        rss_bytes: 1 << 20,
        oom_score_adj: 0,
        uid: 0,
        trigger_pid: 700,
        trigger_comm: comm.into(),
        verdict: Some(format!("{comm} (pid 700) was OOM-killed")),
    })
}

fn outputs(cgroup: bool) -> Outputs {
    Outputs {
        live: Live::new(),
        metrics: Arc::new(Metrics::new(cgroup)),
        log: None,
        kill_series: HashSet::new(),
        last_lost: 0,
        listener: None,
    }
}

/// The exposition as Prometheus reads it: names, types, units, labels,
/// a job-chosen comm escaped, and the recorder's own usage.
#[test]
fn the_exposition_text() {
    let mut o = outputs(true);
    o.publish(&kill("python3", Some(1)));
    o.publish(&kill("python3", Some(1)));
    o.publish(&kill("evil\"\n\x1b[31m", None));
    o.publish(&Finished::Death(DeathEvent {
        ts_ns: 1,
        pid: 700,
        comm: "python3".into(),
        cause: Cause::OomMemcg,
        signal: Some(9),
        code: None,
        rank: None,
        sender_pid: None,
        sender_comm: None,
        after_kill: None,
    }));
    o.live
        .on_user(&UserBody::Lost(trainbpf_report::decode::Lost {
            by_kind: vec![0, 3],
            undecodable: 1,
            ..Default::default()
        }));
    o.live.on_user(&UserBody::Pressure(Box::new(
        trainbpf_report::decode::samples::Pressure {
            cgroup: Some(trainbpf_report::decode::samples::CgroupPressure {
                usage_kb: 1024,
                limit_kb: None,
                ..Default::default()
            }),
            ..Default::default()
        },
    )));
    o.tick(0, Some(42.5));
    let text = o.metrics.encode();
    for want in [
        "# TYPE trainbpf_oom_kills_total counter\n",
        "trainbpf_oom_kills_total{constraint=\"memcg\",comm=\"python3\",rank=\"1\",container=\"3f2a1b4c5d6e\"} 2\n",
        "trainbpf_oom_kills_total{constraint=\"memcg\",comm=\"evil\\\"\\\\n\\\\x1b[31m\",rank=\"\",container=\"3f2a1b4c5d6e\"} 1\n",
        "trainbpf_deaths_total{cause=\"oom_memcg\"} 1\n",
        "trainbpf_deaths_total{cause=\"crash\"} 0\n",
        "trainbpf_lost_events_total 4\n",
        "# TYPE trainbpf_job_resident_bytes gauge\n",
        "trainbpf_cgroup_memory_limit_bytes +Inf\n",
        "trainbpf_cgroup_memory_usage_bytes 1048576\n",
        "trainbpf_memory_exhausted_projection_seconds 42.5\n",
        "trainbpf_gpu_device_bytes 0\n",
        "# TYPE process_cpu_seconds_total counter\n",
        "# TYPE process_resident_memory_bytes gauge\n",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    assert!(!text.contains('\x1b'), "{text}");
    let rss = text
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap();
    assert!(rss > 1 << 20, "{rss}");
    // Without a memory cgroup its gauges are absent, not zero.
    let bare = outputs(false).metrics.encode();
    assert!(!bare.contains("trainbpf_cgroup_memory"), "{bare}");
    assert!(bare.contains("trainbpf_memory_exhausted_projection_seconds +Inf\n"));
}

/// Past the cap, a new label set is counted under "other", its
/// constraint kept; label values are cut.
#[test]
fn label_sets_are_bounded() {
    let mut o = outputs(false);
    for i in 0..MAX_KILL_SERIES + 10 {
        o.publish(&kill(&format!("w{i}"), Some(i as u32)));
    }
    o.publish(&kill("w0", Some(0)));
    let text = o.metrics.encode();
    let series = text
        .lines()
        .filter(|l| l.starts_with("trainbpf_oom_kills_total{"))
        .count();
    assert_eq!(series, MAX_KILL_SERIES + 1, "{text}");
    assert!(text.contains(
        "trainbpf_oom_kills_total{constraint=\"memcg\",comm=\"other\",rank=\"other\",container=\"other\"} 10\n"
    ));
    assert!(text.contains("comm=\"w0\",rank=\"0\",container=\"3f2a1b4c5d6e\"} 2\n"));
    assert_eq!(label(&"x".repeat(500)).len(), MAX_LABEL_CHARS);
}

#[test]
fn an_events_line_per_kill_and_unclean_death() {
    let log = EventsLog {
        file: tempfile_like(),
        host: "node1".into(),
        offset_ns: 1_764_000_000_000_000_000,
        failed: false,
    };
    let line = log.line(&kill("python3", Some(2))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["event"], "oom_kill");
    assert_eq!(v["host"], "node1");
    assert_eq!(v["constraint"], "memcg");
    assert_eq!(v["rank"], 2);
    assert_eq!(v["rss_bytes"], 1 << 20);
    assert_eq!(v["verdict"], "python3 (pid 700) was OOM-killed");
    assert!(
        v["time"].as_str().unwrap().starts_with("2025-11-24T"),
        "{v}"
    );
    assert!(line.ends_with("}\n") && line.matches('\n').count() == 1);
    let death = |code, signal| {
        Finished::Death(DeathEvent {
            ts_ns: 1,
            pid: 1,
            comm: "x".into(),
            cause: Cause::Exit,
            signal,
            code,
            rank: None,
            sender_pid: None,
            sender_comm: None,
            after_kill: (code == Some(1)).then_some((7, Some(1))),
        })
    };
    assert_eq!(
        log.line(&death(Some(0), None)),
        None,
        "a clean exit is no event"
    );
    let v: serde_json::Value =
        serde_json::from_str(&log.line(&death(Some(1), None)).unwrap()).unwrap();
    assert_eq!(
        (v["event"].as_str(), v["exit_code"].as_i64()),
        (Some("death"), Some(1))
    );
    assert!(v.get("signal").is_none(), "absent, not null: {v}");
    assert_eq!(
        (
            v["after_oom_kill_pid"].as_u64(),
            v["after_oom_kill_rank"].as_u64()
        ),
        (Some(7), Some(1)),
        "the kill it followed: {v}"
    );
}

fn tempfile_like() -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap()
}
