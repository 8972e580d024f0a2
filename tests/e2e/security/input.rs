//! "Bad input": hostile bytes and hostile numbers handed to the
//! root tool. A recording must read in time linear in its size whatever it
//! holds, and every numeric flag must refuse what it cannot hold with a
//! usage error, never a panic.

use std::{process::Command, time::Duration};

use crate::support::*;
use trainbpf_report::{
    fuzzing::{LAST_NOTE_NS, fake_frame_heads},
    recording::Reader,
};

/// Reads `bytes` with the library's reader: (notes read, skipped stretches,
/// work done: bytes read, scanned, moved or checksummed).
fn read(bytes: &[u8]) -> (u64, u64, u64) {
    let mut r = Reader::new(bytes).expect("a recording header");
    let notes = r.by_ref().count() as u64;
    assert!(r.stop().is_none(), "{:?}", r.stop());
    (notes, r.skipped().count, r.work())
}

/// A recording made of fake frame heads (each with a
/// length inside the file and a wrong CRC, over good frames) was read in
/// quadratic time: 30 s for 1 MB, and a few MB never finished. The reader's
/// work per byte must not grow with the file (measured, not timed), and
/// `trainbpf report` must read a 6 MiB one, every good frame in it found.
#[test]
fn fake_frame_heads_are_read_in_linear_time() {
    require_root();
    let _serial = serial();

    let small = fake_frame_heads(1 << 20);
    let large = fake_frame_heads(8 << 20);
    let (_, _, small_work) = read(&small);
    let (notes, skipped, large_work) = read(&large);
    let small_per_byte = small_work as f64 / small.len() as f64;
    let large_per_byte = large_work as f64 / large.len() as f64;
    eprintln!(
        "work per byte: {small_per_byte:.1} at {} bytes, {large_per_byte:.1} at {} bytes",
        small.len(),
        large.len()
    );
    // Eight times the bytes: quadratic work would be eight times as much per
    // byte (64 times in all); linear work stays the same per byte.
    assert!(
        large_work < 16 * small_work && large_per_byte < 1.5 * small_per_byte,
        "work grows faster than the input: {small_work} for {} bytes, {large_work} for {} bytes",
        small.len(),
        large.len()
    );
    assert!(large_per_byte < 64.0, "{large_per_byte:.1} per byte");
    assert_eq!(
        skipped,
        notes - 1,
        "one stretch per fake head, one at the end"
    );

    // The real binary on a file of a few MiB; the deadline guards against a
    // hang, the assertions above are on work.
    let dir = TempDir::new("fake-heads");
    let rec = dir.path("fake-heads.rec");
    let bytes = fake_frame_heads(6 << 20);
    std::fs::write(&rec, &bytes).unwrap();
    let (notes, skipped, _) = read(&bytes);
    let out = output_within(
        Command::new(bin())
            .arg("report")
            .arg("--format=json")
            .arg(&rec),
        Duration::from_secs(60),
    )
    .unwrap_or_else(|| {
        panic!(
            "`trainbpf report` did not finish reading {} bytes of fake frame heads in 60 s",
            bytes.len()
        )
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &report["recording"];
    assert_eq!(u(&r["events"]), notes, "{r}");
    assert_eq!(u(&r["skipped_ranges"]), skipped, "{r}");
    assert!(r["stopped_early"].is_null(), "{r}");
    // The good frame after all the fake heads was found.
    let end_s = LAST_NOTE_NS as f64 / 1e9;
    assert!(
        (r["duration_s"].as_f64().unwrap() - end_s).abs() < 0.01,
        "{r}"
    );
}

/// Durations past what `Duration` holds panicked
/// (exit 101), `--heartbeat-ms` overflowed as it became nanoseconds, and
/// sizes past u64 saturated and were used. Every numeric flag of `record`
/// and `report` must refuse a value out of its range with a usage error
/// (exit 2) that names the flag, before anything runs.
#[test]
fn numeric_flags_out_of_range_are_usage_errors() {
    require_root();
    let _serial = serial();
    let dir = TempDir::new("bad-numbers");
    let rec = dir.path("out.rec");
    let rec = rec.to_str().unwrap();
    // A readable recording for `report`: what it reads does not matter.
    let good = dir.path("good.rec");
    std::fs::write(&good, fake_frame_heads(4 << 10)).unwrap();
    let good = good.to_str().unwrap();

    let huge_duration = "99999999999999999999s";
    let long_digits = "9".repeat(400);
    let durations = [
        huge_duration,
        "1000001h",
        &long_digits,
        "0",
        "-1s",
        "nan",
        "inf",
        "0.0000000000001s",
    ];
    let sizes = [
        "99999999999999999999G",
        "1025T",
        &long_digits,
        "0",
        "-1M",
        "nanM",
    ];
    // (subcommand, flag, bad values)
    let cases: Vec<(&str, &str, Vec<&str>)> = vec![
        ("report", "--window", durations.to_vec()),
        ("report", "--until", durations.to_vec()),
        ("report", "--leak-span", durations.to_vec()),
        ("record", "--leak-span", durations.to_vec()),
        ("record", "--full-span", durations.to_vec()),
        (
            "record",
            "--heartbeat-ms",
            vec![
                "99999999999999999999",
                "18446744073709551",
                "86400001",
                "-1",
                "nan",
            ],
        ),
        ("record", "--memory-limit", sizes.to_vec()),
        ("record", "--rss-threshold", sizes.to_vec()),
        // 0 is "no bound" there; under 1M is too small to compact into.
        (
            "record",
            "--max-size",
            [&sizes[..3], &sizes[4..], &["512K"]].concat(),
        ),
        (
            "record",
            "--ring-size",
            [&sizes[..], &["3M", "2K", "4G"]].concat(),
        ),
        (
            "record",
            "--rss-relative-shift",
            vec!["64", "4294967296", "-1", "nan"],
        ),
        ("record", "--pid", vec!["0", "4294967296", "-1", "nan"]),
    ];
    let mut failures = Vec::new();
    for (sub, flag, values) in &cases {
        for value in values {
            let mut cmd = Command::new(bin());
            cmd.arg(sub).arg(format!("{flag}={value}"));
            match *sub {
                "record" if *flag == "--pid" => cmd.args(["-o", rec]),
                "record" => cmd.args(["-o", rec, "--", "/bin/true"]),
                _ => cmd.arg(good),
            };
            let Some(out) = output_within(&mut cmd, Duration::from_secs(60)) else {
                failures.push(format!(
                    "{sub} {flag}={value:.24}: still running after 60 s"
                ));
                continue;
            };
            let stderr = String::from_utf8_lossy(&out.stderr);
            let first = stderr.lines().next().unwrap_or_default();
            let value = if value.len() > 24 {
                format!("{}... ({} characters)", &value[..12], value.len())
            } else {
                value.to_string()
            };
            if out.status.code() != Some(2) || stderr.contains("panicked") || !first.contains(flag)
            {
                failures.push(format!("{sub} {flag}={value}: {}: {first}", out.status));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        !std::path::Path::new(rec).exists(),
        "a refused flag still recorded"
    );
}
