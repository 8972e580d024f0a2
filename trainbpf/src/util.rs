//! Small pieces every command uses: files made and opened safely as the
//! invoking user, who that user is, the clocks, output path placeholders,
//! the mount table, and whether a file is trusted.

pub mod clock;
pub mod elf_image;
pub mod invoker;
pub mod mounts;
pub mod phases;
pub mod placeholders;
pub mod safe_file;
pub mod trust;
pub mod values;

/// Writes to stdout; a closed pipe (`trainbpf report | head`) is success.
pub fn write_stdout(s: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// A unit test that reads what only CAP_SYS_ADMIN may (a process's
/// `/proc/PID/map_files`): false, and said, when it can't, so that a plain
/// `cargo test` passes unprivileged; under `cargo xtask test`
/// (`TRAINBPF_PRIVILEGED_REQUIRED`) a missing privilege fails the test
/// instead.
#[cfg(test)]
pub(crate) fn privileged(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var_os("TRAINBPF_PRIVILEGED_REQUIRED").is_none(),
        "{what} needs root, and TRAINBPF_PRIVILEGED_REQUIRED is set"
    );
    eprintln!("skipped without root: {what}");
    false
}
