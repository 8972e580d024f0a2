//! `trainbpf report --json` on the report crate's fixtures prints what is
//! checked in beside them, unprivileged. The report crate's own test
//! (trainbpf-report/tests/report_json.rs) keeps those files in step with
//! its pipeline; this one checks that the command runs that pipeline with
//! the defaults and the path as given.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

fn fixtures() -> Vec<PathBuf> {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../trainbpf-report/tests/fixtures/reports");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rec"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no recordings in {}", dir.display());
    v
}

#[test]
fn report_json_prints_the_checked_in_json() {
    let mut differ = Vec::new();
    for rec in fixtures() {
        // From the fixture's directory: `recordings[].path` is the path as
        // given, the same on every checkout.
        let out = Command::new(env!("CARGO_BIN_EXE_trainbpf"))
            .args(["report", "--format=json"])
            .arg(rec.file_name().unwrap())
            .current_dir(rec.parent().unwrap())
            .env_remove("NO_COLOR")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "report --json {}: {}\n{}",
            rec.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let want = std::fs::read(rec.with_extension("json")).unwrap_or_default();
        if out.stdout != want {
            differ.push(rec.display().to_string());
        }
    }
    assert!(
        differ.is_empty(),
        "`trainbpf report --json` differs from the checked-in JSON of:\n{}\n\
         If trainbpf-report's report_json test passes, the command no longer \
         runs its pipeline as it did (flags' defaults, the path as given).",
        differ.join("\n")
    );
}
