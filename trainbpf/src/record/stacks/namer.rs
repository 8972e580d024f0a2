//! The frames' namer: a child process without privileges that parses the
//! job's files. Unwinding a stack by a file's `.eh_frame` and naming its
//! addresses by the file's symbols and DWARF line tables parse what the
//! job wrote, so it is not done as root, nor in the recorder, which must
//! survive whatever the files hold.
//!
//! The recorder reads the process's maps and opens each mapped file
//! through `/proc/PID/map_files/` (`code_files`), and hands the child the
//! descriptors (`SCM_RIGHTS`), never a path that could be swapped. The
//! child (`serve`) runs as the invoking user, or `nobody` when root ran
//! the recorder without sudo, with no capabilities, `no_new_privs`, its
//! heap bounded and its OOM score the kernel's default, and from its first
//! request under a seccomp filter (`sandbox`). A crash, a hang past the
//! deadline or a refusal costs the names of that request's stacks, never
//! the recording: it is counted (`job_reads.namer_failed`) and said, and
//! the next request starts a new child.

use std::{
    fs::File,
    os::{
        fd::{AsFd as _, AsRawFd as _, OwnedFd, RawFd},
        unix::{net::UnixStream, process::CommandExt as _},
    },
    process::{Child, Command, Stdio},
    sync::Mutex,
    time::Duration,
};

use serde::{Deserialize, Serialize};
use trainbpf_report::decode::stacks::Frame;

use crate::record::samplers::procfs::guard::{Count, STATS};

pub mod cpython;
mod sandbox;
mod serve;
mod wire;
pub use serve::main as serve_main;
use wire::{recv, send};

/// The child's exit codes, and what the recorder says of each.
mod exit {
    pub const USAGE: i32 = 2;
    pub const PRIVILEGES: i32 = 1;
    pub const REQUEST: i32 = 3;
    pub const SECCOMP: i32 = 4;

    pub fn said(code: i32) -> Option<&'static str> {
        Some(match code {
            USAGE => "it was started without its user and group",
            PRIVILEGES => "it could not drop its privileges",
            REQUEST => "it could not read a request or write its reply",
            SECCOMP => "it could not install its seccomp filter, and does not run without one",
            _ => return None,
        })
    }
}

/// The child's subcommand (not a user-facing command).
pub const SUBCOMMAND: &str = "__name-frames";

/// How long one request may take: past it the child is killed.
const DEADLINE: Duration = Duration::from_secs(10);
/// A request or reply longer than this is refused (a stack copy is 16 KiB,
/// a named frame well under 2 KiB).
const MAX_MESSAGE: u64 = 64 << 20;
/// Descriptors per request: `code_files` holds at most 128 per process,
/// and the kernel passes at most 253 in one message.
pub const MAX_FDS: usize = 128;
/// Children started in one recording: past it, frames go unnamed.
const MAX_STARTS: u32 = 16;

/// A mapping of code; its descriptor travels beside the message, in order
/// (none for a file skipped).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MapMsg {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
    /// A file not opened, on a filesystem of this type whose server may
    /// never answer (FUSE): no descriptor comes with it.
    #[serde(default)]
    pub skipped: Option<String>,
}

/// A stack to name: its addresses (innermost first) with how each was
/// found, and where the kernel copied the stack, the registers and copy
/// to unwind by the files' tables first.
#[derive(Debug, Serialize, Deserialize)]
pub struct StackMsg {
    pub ips: Vec<u64>,
    pub hows: Vec<String>,
    pub copy: Option<CopyMsg>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CopyMsg {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub data: Vec<u8>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    maps: Vec<MapMsg>,
    stacks: Vec<StackMsg>,
}

/// A stack named: its frames (each saying how it was found), and why
/// some are not (none named, or not unwound by the tables).
#[derive(Debug, Serialize, Deserialize)]
pub struct Named {
    pub frames: Vec<Frame>,
    pub note: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    stacks: Vec<Named>,
    /// Files whose unwind tables were refused, each said once.
    refused: Vec<String>,
}

/// What the recorder asks: native frames named, or the CPython half
/// (`cpython`).
#[derive(Debug, Serialize, Deserialize)]
enum Ask {
    Name(Request),
    Locate(Box<cpython::LocateMsg>),
    Resolve(Box<cpython::ResolveMsg>),
}

#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Named(Reply),
    Located(Box<cpython::Located>),
    Resolved(Box<cpython::Resolved>),
}

struct Client {
    child: Option<(Child, UnixStream)>,
    starts: u32,
    /// The child that reads CPython: one of its own, so that a read of a
    /// process's memory that hangs holds up no native naming, and that
    /// child does not read the C library's tables it would not use.
    python: bool,
}

static CLIENT: Mutex<Client> = Mutex::new(Client {
    child: None,
    starts: 0,
    python: false,
});

static PY_CLIENT: Mutex<Client> = Mutex::new(Client {
    child: None,
    starts: 0,
    python: true,
});

/// The word that makes a child the CPython reader.
const PYTHON_ARG: &str = "python";

/// Who the child runs as: the user behind sudo, else `nobody`.
fn child_ids() -> (u32, u32) {
    match crate::util::invoker::Invoker::detect() {
        Ok(i) if i.uid != 0 => (i.uid, i.gid),
        _ => (65534, 65534),
    }
}

impl Client {
    /// The child's name, for what is said of it.
    fn who(&self) -> &'static str {
        if self.python {
            "the CPython reader"
        } else {
            "the frames' namer"
        }
    }

    fn start(&mut self) -> Result<(), String> {
        if self.starts >= MAX_STARTS {
            return Err(format!(
                "{} was started {MAX_STARTS} times already: not again",
                self.who()
            ));
        }
        self.starts += 1;
        let (mine, theirs) = UnixStream::pair().map_err(|e| e.to_string())?;
        let (uid, gid) = child_ids();
        let fd: OwnedFd = theirs.into();
        // /proc/self/exe: the recorder's own image, run by absolute path.
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg(SUBCOMMAND)
            .arg(uid.to_string())
            .arg(gid.to_string())
            .args(self.python.then_some(PYTHON_ARG))
            .stdin(Stdio::from(fd))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_clear();
        // SAFETY: async-signal-safe calls only, between fork and exec:
        // the child does not keep the recorder's -1000, which would make
        // the OOM killer take others' processes for it; nor does it take
        // 1000, which made an OOM kill in a cgroup above the job's take
        // it first, a kill the job's story does not have. Its heap is
        // bounded; the kernel weighs it as any process.
        unsafe {
            cmd.pre_exec(|| {
                let adj = b"0";
                let fd = libc::open(
                    c"/proc/self/oom_score_adj".as_ptr(),
                    libc::O_WRONLY | libc::O_CLOEXEC,
                );
                if fd >= 0 {
                    libc::write(fd, adj.as_ptr().cast(), adj.len());
                    libc::close(fd);
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("{} could not start: {e}", self.who()))?;
        mine.set_read_timeout(Some(DEADLINE))
            .and_then(|()| mine.set_write_timeout(Some(DEADLINE)))
            .map_err(|e| e.to_string())?;
        self.child = Some((child, mine));
        Ok(())
    }

    /// Ends the child (its own, started here), and says how it ended.
    fn stop(&mut self, why: &str) -> String {
        let Some((mut child, _)) = self.child.take() else {
            return why.to_string();
        };
        let _ = child.kill();
        // A child blocked in the kernel (a read of a page on FUSE waits
        // past a kill) may never exit: it is not waited for here, where
        // the lock every request needs is held, but by a thread of its
        // own, so that it leaves no zombie once it does.
        let mut exited = None;
        for _ in 0..20 {
            match child.try_wait() {
                Ok(Some(st)) => {
                    exited = Some(Ok(st));
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => {
                    exited = Some(Err(e));
                    break;
                }
            }
        }
        let pid = child.id();
        let Some(exited) = exited else {
            let _ = std::thread::Builder::new()
                .name("namer-reap".into())
                .spawn(move || child.wait());
            return self.failed(
                pid,
                why,
                "; it did not exit when killed (blocked in the kernel), and is left to exit",
            );
        };
        let how = match exited {
            Ok(st) => match (
                std::os::unix::process::ExitStatusExt::signal(&st),
                st.code(),
            ) {
                (Some(sig), _) if sig != libc::SIGKILL => format!("; it died of signal {sig}"),
                (_, Some(code)) => match exit::said(code) {
                    Some(why) => format!("; {why}"),
                    None => format!("; it exited with code {code}"),
                },
                _ => String::new(),
            },
            Err(_) => String::new(),
        };
        self.failed(pid, why, &how)
    }

    /// Counts and says a failure of the child `pid`.
    fn failed(&self, pid: u32, why: &str, how: &str) -> String {
        STATS.add(Count::NamerFailed, 1);
        let msg = format!("{} (pid {pid}) failed: {why}{how}", self.who());
        STATS.note(|| msg.clone());
        msg
    }

    /// One request and its answer; a child that fails to answer (dead,
    /// hung past the deadline, or saying nonsense) is ended.
    ///
    /// A child found gone as the request is sent (it died after its last
    /// answer) is counted and said, and the request goes to a new one: it
    /// did not cause the failure, and its stacks keep their names.
    fn ask(&mut self, ask: &Ask, fds: &[RawFd]) -> Result<Answer, String> {
        let bytes = serde_json::to_vec(ask).map_err(|e| e.to_string())?;
        for first in [true, false] {
            if self.child.is_none() {
                self.start()?;
            }
            let Some((_, s)) = &self.child else {
                return Err("no namer".into());
            };
            let deadline = Some(std::time::Instant::now() + DEADLINE);
            if let Err(e) = send(s, &bytes, fds) {
                let gone = matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET));
                if gone {
                    let _ = self.stop(&format!("it was gone before a request came ({e})"));
                    if first {
                        continue;
                    }
                }
                return Err(self.stop(&e.to_string()));
            }
            let r = recv(s, deadline)
                .map_err(|e| e.to_string())
                .and_then(|(b, _)| serde_json::from_slice::<Answer>(&b).map_err(|e| e.to_string()));
            return r.map_err(|e| self.stop(&e));
        }
        Err("no namer".into())
    }

    /// The child's answer did not fit the question: it is ended.
    fn mismatch(&mut self) -> String {
        self.stop("its reply did not match the request")
    }
}

/// Starts both children now, rather than at the first stacks. The namer
/// reads the C library's symbols and line tables as it starts
/// (`serve::warm`), which takes a few hundred milliseconds the first
/// time, and a job that dies within a second of its start cannot wait for
/// that. The CPython reader's start, tens of milliseconds, would lie
/// between the recorder's look at what backs a process's memory and the
/// reader's first read of it, the window in which a page mapped from FUSE
/// since goes unseen.
pub fn start() {
    for client in [&CLIENT, &PY_CLIENT] {
        let mut c = client.lock().unwrap_or_else(|e| e.into_inner());
        if c.child.is_none() {
            let _ = c.start();
        }
    }
}

/// Names `stacks` of a process whose code files are `maps` (with their
/// open descriptors, none for a file skipped), in the child. An error names why none were.
pub fn name(maps: &[(MapMsg, Option<&File>)], stacks: Vec<StackMsg>) -> Result<Vec<Named>, String> {
    let maps = &maps[..maps.len().min(MAX_FDS)];
    let req = Request {
        maps: maps.iter().map(|(m, _)| m.clone()).collect(),
        stacks,
    };
    let fds: Vec<RawFd> = maps
        .iter()
        .filter_map(|(_, f)| Some(f.as_ref()?.as_fd().as_raw_fd()))
        .collect();
    let n = req.stacks.len();
    let mut c = CLIENT.lock().unwrap_or_else(|e| e.into_inner());
    let r = match c.ask(&Ask::Name(req), &fds)? {
        Answer::Named(r) if r.stacks.len() == n => r,
        _ => return Err(c.mismatch()),
    };
    drop(c);
    for why in r.refused {
        STATS.add(Count::UnwindRefused, 1);
        STATS.note(|| why);
    }
    Ok(r.stacks)
}

/// Asks the CPython reader to locate a process's interpreter (descriptors:
/// its memory, then the candidate files opened).
pub fn locate(m: cpython::LocateMsg, fds: &[RawFd]) -> Result<cpython::Located, String> {
    let mut c = PY_CLIENT.lock().unwrap_or_else(|e| e.into_inner());
    match c.ask(&Ask::Locate(Box::new(m)), fds)? {
        Answer::Located(l) => Ok(*l),
        _ => Err(c.mismatch()),
    }
}

/// Asks the CPython reader to name frames (descriptors: the memory of
/// the request's own process, then its parent's, where present).
pub fn resolve(m: cpython::ResolveMsg, fds: &[RawFd]) -> Result<cpython::Resolved, String> {
    let n = m.pairs.len();
    let mut c = PY_CLIENT.lock().unwrap_or_else(|e| e.into_inner());
    match c.ask(&Ask::Resolve(Box::new(m)), fds)? {
        Answer::Resolved(r) if r.pairs.len() == n => Ok(*r),
        _ => Err(c.mismatch()),
    }
}
