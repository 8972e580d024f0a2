//! No two of the recorder's modules import each other. Its layers toward
//! the report are kept by Cargo (trainbpf-report depends on nothing here)
//! and within the report crate by that crate's tests/layers.rs, whose
//! import reader this includes.

use std::path::Path;

#[path = "../../trainbpf-report/tests/layers/imports.rs"]
#[allow(
    dead_code,
    reason = "the layer rules' helpers serve the report crate's test"
)]
mod imports;

#[test]
fn no_two_modules_import_each_other() {
    let imports = imports::imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(
        imports.len() > 50,
        "found only {} modules: is the source tree there?",
        imports.len()
    );
    let circles = imports::circles(&imports);
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// The eBPF programs' modules import no circle either: each concern
/// (pages, memory records, process state, stalls) leans on the ones below.
#[test]
fn no_circle_among_the_ebpf_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../trainbpf-ebpf/src");
    let imports = imports::imports(&src);
    assert!(imports.len() > 10, "found only {} modules", imports.len());
    let circles = imports::circles(&imports);
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// The crate's top level reads as the pipeline: the command line, the
/// recorder and what loads its probes, the checks, the report, and small
/// shared pieces. Everything only the recorder uses is under `record/`.
#[test]
fn the_top_level_is_the_pipeline() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut top: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|m| m != "lib" && m != "main")
        .collect();
    top.sort();
    assert_eq!(
        top,
        ["cli", "doctor", "loader", "record", "report", "util"],
        "a new top-level module: does it belong under record/ or util/?"
    );
}

/// No two modules share a name for different things: a reader who greps
/// for `mapped.rs` or `attach` finds one place.
#[test]
fn no_two_modules_share_a_name() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
                if !stem.ends_with("tests") && stem != "testdata" {
                    let rel = p.strip_prefix(&src).unwrap().display().to_string();
                    seen.entry(stem).or_default().push(rel);
                }
            }
        }
    }
    let shared: Vec<String> = seen
        .into_iter()
        .filter(|(_, paths)| paths.len() > 1)
        .map(|(stem, paths)| format!("{stem}: {}", paths.join(", ")))
        .collect();
    assert!(
        shared.is_empty(),
        "modules that share a name:\n{}",
        shared.join("\n")
    );
}
