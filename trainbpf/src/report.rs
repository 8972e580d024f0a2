//! `trainbpf report` and the end-of-run verdict: file → reader → model → renderer.
use std::{fs::File, io::BufReader, path::Path};

use anyhow::{Context as _, Result};

use crate::recording::Reader;

fn open(path: &Path) -> Result<Reader<BufReader<File>>> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    Ok(Reader::new(BufReader::with_capacity(1 << 16, f))?)
}

/// Every decoded event as one JSON object per line: for debugging probes
/// and for tools that want the raw timeline.
pub fn events(path: &Path) -> Result<String> {
    let mut r = open(path)?;
    let mut out = String::new();
    for t in r.by_ref() {
        out.push_str(&serde_json::to_string(&t)?);
        out.push('\n');
    }
    if let Some(stop) = r.stop() {
        out.push_str(&serde_json::to_string(
            &serde_json::json!({"stopped_early": stop}),
        )?);
        out.push('\n');
    }
    Ok(out)
}

pub fn run(
    _path: &Path,
    _json: bool,
    _window: std::time::Duration,
    _no_color: bool,
) -> Result<String> {
    todo!()
}

pub fn verdict(_path: &Path) -> Result<String> {
    Ok("stub".into())
}
