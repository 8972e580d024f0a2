//! The data flows one way (docs/architecture.md): recording, decode,
//! model, render. Cargo keeps this crate apart from the recorder; within
//! it, this reads the crate's own sources and fails on an import that runs
//! against the flow, or on two modules that import each other, so that the
//! layering holds without anyone watching for it in review.

use std::path::{Path, PathBuf};

#[path = "layers/imports.rs"]
mod imports;
use imports::{circles, imports, named_paths, strip_comments, top};

/// What each layer may import from the crate, besides itself: its
/// top-level module and the top-level modules listed. The crate root
/// holds only module declarations.
const RULES: &[(&str, &[&str])] = &[
    ("units", &[]),
    ("term", &[]),
    ("decode", &[]),
    ("recording", &["decode"]),
    ("model", &["decode", "recording", "units"]),
    ("render", &["model", "units", "term"]),
    // A recording's bytes through to a report: the flow, driven.
    ("pipeline", &["recording", "model", "render"]),
    // Recordings made to order for the fuzzer and the tests, and the
    // harness that runs them through the pipeline.
    ("fuzzing", &["decode", "recording", "render", "pipeline"]),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_parser_sees_what_a_module_imports() {
    let code = strip_comments(
        "use crate::{model::{Kill, gpu::{self, Ledger}}, units::human_kb as hk};\n\
         use super::style::Paint;\n\
         let x = crate::term::escape(y); // crate::status\n\
         let because = \"we use it\"; pub(crate) use self::inner::X;\n",
    );
    assert_eq!(
        named_paths("render::text::kill", &code),
        [
            "model::Kill",
            "model::gpu",
            "model::gpu::Ledger",
            "render::text::kill::inner::X",
            "render::text::style::Paint",
            "term::escape",
            "units::human_kb",
        ]
    );
    let code = strip_comments("let a = 1; // crate::status\n/// [`crate::compact`]\n");
    assert!(!code.contains("crate::"), "{code}");
}

#[test]
fn each_layer_imports_only_what_is_upstream_of_it() {
    let imports = imports(&src());
    assert!(
        imports.len() > 50,
        "found only {} modules: is the source tree there?",
        imports.len()
    );
    let mut wrong = Vec::new();
    for (m, deps) in &imports {
        let Some((_, allowed)) = RULES.iter().find(|(layer, _)| *layer == top(m)) else {
            continue;
        };
        for d in deps {
            if top(d) != top(m) && !allowed.contains(&top(d)) {
                wrong.push(format!("{m} imports {d}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the data flow (docs/architecture.md):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_module_is_a_layer() {
    let imports = imports(&src());
    let unruled: Vec<&str> = imports
        .keys()
        .map(|m| top(m))
        .filter(|t| !t.is_empty() && !RULES.iter().any(|(layer, _)| layer == t))
        .collect();
    assert!(
        unruled.is_empty(),
        "top-level modules with no layer rule: {unruled:?}"
    );
}

#[test]
fn no_two_modules_import_each_other() {
    let circles = circles(&imports(&src()));
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}
