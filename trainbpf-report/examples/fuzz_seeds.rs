//! Writes the fuzzer's starting corpus into DIR: the seed recording of
//! `trainbpf_report::fuzzing::seed` (a job with a kill, every record kind), a few
//! damaged copies, and a small file of fake frame heads. Run by
//! `cargo xtask fuzz` (docs/fuzzing.md).

use std::{path::PathBuf, process::ExitCode};

use trainbpf_report::fuzzing::{Rng, fake_frame_heads, mutate, seed};

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: fuzz_seeds DIR");
        return ExitCode::FAILURE;
    };
    let seed = seed();
    let mut files = vec![("seed.rec".to_string(), seed.clone())];
    // Cut at the middle, and damaged a little: starting points for the
    // truncation and resynchronisation paths.
    files.push(("seed-half.rec".into(), seed[..seed.len() / 2].to_vec()));
    // Fake frame heads over good frames: small, so
    // the fuzzer's inputs stay small; the cost per byte of the pattern at
    // megabytes is pinned by tests, not by the fuzzer's timeout.
    files.push(("fake-heads.rec".into(), fake_frame_heads(8 << 10)));
    let mut rng = Rng::new(1);
    for i in 0..4 {
        files.push((format!("seed-mutant-{i}.rec"), mutate(&seed, &mut rng)));
    }
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in &files {
            std::fs::write(dir.join(name), bytes)?;
        }
        Ok(())
    };
    match write() {
        Ok(()) => {
            eprintln!(
                "fuzz_seeds: wrote {} seeds to {}",
                files.len(),
                dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fuzz_seeds: {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}
