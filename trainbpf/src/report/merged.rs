//! `report A.rec B.rec ...` and `report DIR`: the recordings of one job
//! (one per node, `record -o DIR/{host}.rec`), each built as one file is,
//! then merged on the wall clock (model/merge.rs).

use std::{io::BufReader, path::PathBuf};

use anyhow::{Context as _, Result, bail};
use trainbpf_report::{model, pipeline, render};

use super::{Files, Format, ReportOptions, open_input, text_options};
use crate::util::safe_file;

/// The recordings `report` was given: files as they are, and for a
/// directory every regular `*.rec` file in it, by name. Each path is
/// looked at with the invoking user's rights, as files are opened: the
/// stat that tells a directory too, or root's look would tell them whether
/// a path they cannot reach exists.
pub fn inputs(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let owner = safe_file::Owner::from(&crate::util::invoker::Invoker::detect()?);
    let mut out = Vec::new();
    for p in paths {
        let dir = p.clone();
        let listed = safe_file::as_owner(owner, move || {
            // Not a directory, or none the user can see: opened as a file
            // later, as the user, whose error then says why.
            if !dir.is_dir() {
                return Ok(None);
            }
            let io = |err| safe_file::FileError::Io {
                what: format!("listing {}", dir.display()),
                err,
            };
            let mut found = Vec::new();
            for e in std::fs::read_dir(&dir).map_err(io)? {
                let e = e.map_err(io)?;
                // Not through a link: a directory of recordings holds files.
                let regular = e.file_type().map_err(io)?.is_file();
                if regular && e.file_name().as_encoded_bytes().ends_with(b".rec") {
                    found.push(e.path());
                }
            }
            Ok(Some(found))
        })?;
        let Some(mut found) = listed else {
            out.push(p.clone());
            continue;
        };
        if found.is_empty() {
            bail!("{}: no recording (*.rec) in this directory", p.display());
        }
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// The merged report of `paths` (more than one): text, or JSON; the HTML
/// page and the Perfetto trace with one group per host.
pub(super) fn run_merged(paths: &[PathBuf], opts: &ReportOptions) -> Result<String> {
    if opts.files.pprof.is_some() {
        // One profile per recording: a pid means nothing across hosts.
        bail!("--pprof takes one recording at a time: run `report --pprof` on each file");
    }
    let mut parts = Vec::with_capacity(paths.len());
    for p in paths {
        let f = open_input(p)?;
        let r = pipeline::build_scoped(
            BufReader::with_capacity(1 << 16, f),
            opts.window,
            &opts.scope,
        )
        .with_context(|| format!("reading {}", p.display()))?;
        parts.push((p.display().to_string(), r));
    }
    let m = model::merge::merge(parts);
    write_files(&m, &opts.files)?;
    if opts.format == Format::Json {
        return Ok(pipeline::merged_json(&m)?);
    }
    Ok(pipeline::merged_text(
        &m,
        opts.part,
        &text_options(opts.no_color),
    ))
}

/// The merged HTML page and Perfetto trace; their placeholders name the
/// job's start, and a host only when every recording is of that one.
fn write_files(m: &model::Merged, files: &Files) -> Result<()> {
    use crate::util::placeholders::Output;
    let owner = safe_file::Owner::from(&crate::util::invoker::Invoker::detect()?);
    let values = super::output_values(&m.recordings);
    // Both expanded before either is written.
    let html = files
        .html
        .as_deref()
        .map(|p| super::output_path(Output::Html, p, &values))
        .transpose()?;
    let perfetto = files
        .perfetto
        .as_deref()
        .map(|p| super::output_path(Output::Perfetto, p, &values))
        .transpose()?;
    if let Some(p) = html {
        super::write_output(&p, render::html::render_merged(m).as_bytes(), owner)?;
    }
    if let Some(p) = perfetto {
        let trace = serde_json::to_vec(&render::perfetto::render_merged(m))?;
        super::write_output(&p, &trace, owner)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_gives_its_recordings_by_name_and_no_link() {
        let dir = std::env::temp_dir().join(format!("trainbpf-inputs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub.rec")).unwrap();
        for f in ["node2.rec", "node1.rec", "node1.rec.old", "notes.txt"] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        std::os::unix::fs::symlink("/etc/passwd", dir.join("planted.rec")).unwrap();
        let got = inputs(std::slice::from_ref(&dir)).unwrap();
        let names: Vec<String> = got
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["node1.rec", "node2.rec"]);
        // A file stays as given, beside a directory's.
        let file = dir.join("notes.txt");
        assert_eq!(inputs(std::slice::from_ref(&file)).unwrap(), vec![file]);
        let empty = dir.join("sub.rec");
        let e = inputs(&[empty]).unwrap_err().to_string();
        assert!(e.contains("no recording (*.rec)"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
