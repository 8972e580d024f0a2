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
