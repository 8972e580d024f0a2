//! `report --json` against what is checked in, unprivileged: the schema
//! generated from the JSON view structs (src/render/json.rs) against
//! docs/report.schema.json, and each recording under
//! tests/fixtures/reports/ against its expected output (NAME.json, byte for
//! byte) and the schema. The JSON comes from the pipeline `report` runs,
//! with `report`'s defaults; trainbpf's tests/report_cli.rs checks that the
//! command prints the same.
//!
//! After a deliberate change (docs/report-json.md, "Versioning"):
//! `UPDATE_SCHEMA=1 cargo test -p trainbpf-report --test report_json`
//! rewrites the schema, and `UPDATE_FIXTURES=1` the expected outputs.
//! Review the diff.

use std::{
    fs::File,
    io::BufReader,
    path::{Path, PathBuf},
};

use serde_json::Value;
use trainbpf_report::pipeline::{self, Scope};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reports");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rec"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no recordings in {}", dir.display());
    v
}

/// `trainbpf report --json NAME.rec`, as run from the fixture's directory
/// without flags: `recordings[].path` is the file's name, the same on
/// every checkout.
fn report_json(rec: &Path) -> String {
    let f = File::open(rec).unwrap_or_else(|e| panic!("{}: {e}", rec.display()));
    let mut report = pipeline::build_scoped(BufReader::new(f), pipeline::WINDOW, &Scope::default())
        .unwrap_or_else(|e| panic!("report --json {}: {e}", rec.display()));
    report.source.path = rec.file_name().unwrap().to_string_lossy().into_owned();
    pipeline::json(&report).unwrap()
}

fn updating(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| v == "1")
}

#[test]
fn checked_in_schema_is_the_generated_one() {
    let path = root().join("docs/report.schema.json");
    let generated = trainbpf_report::render::json::schema_text();
    if updating("UPDATE_SCHEMA") {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{} differs from the schema the JSON view structs generate.\n\
         If the change to the JSON is deliberate, regenerate it with\n  \
         UPDATE_SCHEMA=1 cargo test -p trainbpf-report --test report_json\n\
         and review the diff (docs/report-json.md, \"Versioning\").",
        path.display()
    );
}

#[test]
fn fixtures_give_the_checked_in_json() {
    let mut differ = Vec::new();
    for rec in fixtures() {
        let expected = rec.with_extension("json");
        let got = report_json(&rec);
        if updating("UPDATE_FIXTURES") {
            std::fs::write(&expected, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&expected).unwrap_or_default();
        if got != want {
            let line = got
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .map_or(got.lines().count().min(want.lines().count()), |i| i);
            differ.push(format!(
                "{}: first difference at line {}",
                rec.display(),
                line + 1
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "report --json changed:\n{}\nIf that is deliberate, regenerate with\n  \
         UPDATE_FIXTURES=1 cargo test -p trainbpf-report --test report_json\n\
         and review the diff.",
        differ.join("\n")
    );
}

#[test]
fn fixtures_match_the_schema() {
    let schema = trainbpf_report::render::json::schema().to_value();
    let validator = jsonschema::draft202012::new(&schema).expect("a valid JSON Schema");
    for rec in fixtures() {
        let v: Value = serde_json::from_str(&report_json(&rec)).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&v)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{} does not match the schema:\n{}",
            rec.display(),
            errors.join("\n")
        );
    }
}
