//! Small pieces every command uses: files made and opened safely as the
//! invoking user, who that user is, the clocks, output path placeholders,
//! the mount table, and whether a file is trusted.

pub mod clock;
pub mod invoker;
pub mod mounts;
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

/// Lowers the calling thread's CPU priority by `by` nice steps (never
/// raises it): work that can wait, such as naming stacks, must not take a
/// core from the thread that drains the rings when the job keeps the
/// others busy. Threads it starts from then on inherit it.
pub fn background(by: i32) {
    // SAFETY: gettid, getpriority and setpriority take plain integers; on
    // Linux a tid names one thread for PRIO_PROCESS.
    unsafe {
        let tid = libc::gettid() as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        let to = (now + by).clamp(-20, 19);
        if to > now {
            libc::setpriority(libc::PRIO_PROCESS, tid, to);
        }
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

#[cfg(test)]
mod tests {
    /// A thread made background runs at a lower priority, and so do the
    /// threads it starts; the thread that called it is untouched.
    #[test]
    fn background_threads_and_theirs_run_lower() {
        // SAFETY: as in `background`.
        let nice =
            || unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        let mine = nice();
        let (theirs, child) = std::thread::spawn(move || {
            super::background(5);
            let child = std::thread::spawn(nice).join().unwrap();
            (nice(), child)
        })
        .join()
        .unwrap();
        assert_eq!(theirs, (mine + 5).min(19));
        assert_eq!(child, theirs);
        assert_eq!(nice(), mine);
    }
}
