//! The namer's seccomp filter: once its privileges are gone and the C
//! library is read, the child may only do what answering a request takes.
//! It reads descriptors it was handed and files it opens read-only
//! (blazesym opens `/proc/self/fd/N`, and a file's separate debug info by
//! its build id), maps memory that is never executable, and talks on its
//! socket. Anything else (a new process, a socket, a signal, ptrace, a
//! write to a file, executable memory) fails with `ENOSYS`, which a
//! library takes as "not here" and falls back from: a file that took over
//! the parser still cannot reach past the child.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("no seccomp filter for this architecture ({0})")]
    Arch(&'static str),
    #[error("building the seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
    #[error("installing the seccomp filter: {0}")]
    Install(#[from] seccompiler::Error),
}

/// Allowed with any arguments.
const ALWAYS: &[libc::c_long] = &[
    libc::SYS_read,
    libc::SYS_pread64,
    libc::SYS_readv,
    libc::SYS_lseek,
    // Messages on the socket, and a panic's message on stderr.
    libc::SYS_write,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_close,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_readlinkat,
    // The older calls a C library before 2.33 makes for `stat`, `lstat`
    // and `readlink` (x86_64 has them; newer architectures only the
    // `*at` forms).
    #[cfg(target_arch = "x86_64")]
    libc::SYS_stat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_lstat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_readlink,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_futex,
    libc::SYS_getrandom,
    libc::SYS_sigaltstack,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sched_yield,
    libc::SYS_clock_gettime,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// `arg & mask == 0`, on the argument's low 32 bits.
fn clear(arg: u8, mask: u64) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(vec![SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(mask),
        0,
    )?])
}

/// `arg == value`, on the argument's low 32 bits.
fn equals(arg: u8, value: u64) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(vec![SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        value,
    )?])
}

fn program() -> Result<BpfProgram, SandboxError> {
    let arch = std::env::consts::ARCH;
    let target = TargetArch::try_from(arch).map_err(|_| SandboxError::Arch(arch))?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALWAYS.iter().map(|&nr| (nr, Vec::new())).collect();
    // Read-only opens only: no write access, no creating, no truncating
    // (`open`, before the C library's 2.26, has its flags one earlier).
    let writes = (libc::O_ACCMODE | libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND) as u64;
    rules.insert(libc::SYS_openat, vec![clear(2, writes)?]);
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_open, vec![clear(1, writes)?]);
    // A descriptor's own flags and copies, never its owner (F_SETOWN and
    // F_SETSIG would have the kernel signal another process).
    let fcntl = [
        libc::F_GETFD,
        libc::F_SETFD,
        libc::F_GETFL,
        libc::F_DUPFD_CLOEXEC,
    ];
    rules.insert(
        libc::SYS_fcntl,
        fcntl
            .iter()
            .map(|&c| equals(1, c as u64))
            .collect::<Result<_, _>>()?,
    );
    // Memory that is never executable (the prot argument is the third).
    let exec = libc::PROT_EXEC as u64;
    rules.insert(libc::SYS_mmap, vec![clear(2, exec)?]);
    rules.insert(libc::SYS_mprotect, vec![clear(2, exec)?]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::ENOSYS as u32),
        SeccompAction::Allow,
        target,
    )?;
    Ok(filter.try_into()?)
}

/// Installs the filter on every thread of this process. `no_new_privs`
/// must be set already (it is, by `drop_privileges`).
pub fn confine() -> Result<(), SandboxError> {
    install(&program()?)
}

/// Installs a built filter: no allocation, so a forked child may call it.
fn install(prog: &BpfProgram) -> Result<(), SandboxError> {
    seccompiler::apply_filter_all_threads(prog)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The filter, in a child process of the test: reads and read-only
    /// opens pass; a write open, a new process, executable memory, a
    /// socket and a descriptor's owner are refused.
    #[test]
    fn the_filter_allows_reading_and_refuses_the_rest() {
        // Built before the fork: the child of a threaded test binary must
        // not allocate.
        let prog = program().unwrap();
        // SAFETY: fork in a test; the child only makes syscalls and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = (|| {
                // SAFETY: plain syscalls in the forked child.
                unsafe {
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                        return 10;
                    }
                    if install(&prog).is_err() {
                        return 11;
                    }
                    let refused = || *libc::__errno_location() == libc::ENOSYS;
                    let path = c"/proc/self/status";
                    let fd = libc::openat(libc::AT_FDCWD, path.as_ptr(), libc::O_RDONLY);
                    if fd < 0 {
                        return 12;
                    }
                    let mut b = [0u8; 16];
                    if libc::read(fd, b.as_mut_ptr().cast(), b.len()) <= 0 {
                        return 13;
                    }
                    let w = libc::openat(libc::AT_FDCWD, c"/tmp/x".as_ptr(), libc::O_WRONLY);
                    if w >= 0 || !refused() {
                        return 14;
                    }
                    let fork = libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0);
                    if fork >= 0 || !refused() {
                        if fork == 0 {
                            libc::_exit(99);
                        }
                        return 15;
                    }
                    let m = libc::mmap(
                        std::ptr::null_mut(),
                        4096,
                        libc::PROT_READ | libc::PROT_EXEC,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    );
                    if m != libc::MAP_FAILED || !refused() {
                        return 16;
                    }
                    let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                    if s >= 0 || !refused() {
                        return 17;
                    }
                    if libc::fcntl(fd, libc::F_SETOWN, 1) >= 0 || !refused() {
                        return 18;
                    }
                    if libc::fcntl(fd, libc::F_GETFD) < 0 {
                        return 19;
                    }
                }
                0
            })();
            // SAFETY: leaving the forked child without running the test
            // harness's exit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }
}
