//! The kill's line in torchrun's own "Root Cause".
//!
//! torchelastic gives each worker the path of an error file in
//! `TORCHELASTIC_ERROR_FILE`; when a worker fails, its agent reads that
//! file, if it exists, for the failure's message and time, and the
//! earliest failure becomes the Root Cause. A worker killed by a signal
//! writes nothing, so the agent says only "Signal 9". When a job process
//! that carries the variable is killed, and no file is at that path, the
//! recorder writes one in the format of torchelastic's own error handler
//! (`torch/distributed/elastic/multiprocessing/errors/error_handler.py`).
//!
//! - Written as the process's user, only inside a directory that user
//!   owns, new under a random name and renamed into place without
//!   replacing anything (`safe_file::create_new`): the agent raises on a
//!   file it cannot parse, and the job's own file (a Python exception
//!   under `@record`) is never touched.
//! - Only for the job's processes: the path comes from the process's own
//!   environment, read at its exec (`procfs::identity`), or from its
//!   parent's at a fork.
//! - In time: the kill wakes the collector at once (the kernel's records
//!   of a kill, a SIGKILL and a death by a signal force a wake-up), and
//!   the write runs on a thread of its own, so that the draining thread
//!   never waits on the job's filesystem. The agent polls every 0.1 s;
//!   the kernel's record of an OOM kill comes before the victim has
//!   finished exiting. Nearly always in time, then; to make it always,
//!   the agent is held at its wait on a worker the OOM killer chose until
//!   that worker's file is written ([`agent_hold`]).

mod agent_hold;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::mpsc::{self, Receiver, SyncSender, TryRecvError},
    thread,
    time::Duration,
};

pub use agent_hold::{AgentHold, DESCRIBED as AGENT_HOLD_DESCRIBED};

use crate::util::safe_file::{FileError, NewFile, Owner, Ready, create_new_here};

/// Processes whose error file is known, at most.
const MAX_PROCS: usize = 65_536;
/// Writes waiting; past this a kill's file is not written, and said.
const MAX_QUEUED: usize = 64;
/// Test only: write each error file this many milliseconds late, on its
/// writer's thread, so that a test can see the agent held meanwhile.
/// Never set it for a real recording.
pub const ENV_DELAY_MS: &str = "TRAINBPF_TEST_ERROR_FILE_DELAY_MS";

/// The longest path taken from an environment (`PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;

/// Where a process's error file goes, and whose it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub path: PathBuf,
    pub owner: Owner,
}

/// A process's error file from its environment: an absolute path, at most
/// [`MAX_PATH_BYTES`]; torchelastic sets it empty where it keeps no logs.
pub fn target_of(env: &[u8], owner: Owner) -> Option<Target> {
    use std::os::unix::ffi::OsStrExt as _;
    let value = env
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"TORCHELASTIC_ERROR_FILE="))?;
    if value.first() != Some(&b'/') || value.len() > MAX_PATH_BYTES {
        return None;
    }
    Some(Target {
        path: PathBuf::from(std::ffi::OsStr::from_bytes(value)),
        owner,
    })
}

/// The file's text: torchelastic's own format, the line as its message and
/// first line of the traceback it prints, the kill's time (Unix seconds)
/// as its timestamp.
pub fn error_json(line: &str, recording: &str, unix_s: u64) -> String {
    let callstack = format!("{line}\n(trainbpf) the full report: trainbpf report {recording}");
    serde_json::json!({
        "message": {
            "message": line,
            "extraInfo": {
                "py_callstack": callstack,
                "timestamp": unix_s.to_string(),
            }
        }
    })
    .to_string()
}

/// What a writer thread is asked to do.
enum Job {
    /// Make a process's file ready ahead of a kill (at its exec).
    Prepare { pid: u32, target: Target },
    /// Write it: through the file made ready, else created now.
    Write {
        pid: u32,
        target: Target,
        text: String,
        ready: Option<Ready>,
        /// [`ENV_DELAY_MS`].
        delay: Option<Duration>,
        agent: Option<u32>,
    },
    /// Remove a file made ready for a process that ended unkilled.
    Discard(Ready),
}

/// What became of one write, for the recording's notes.
pub struct Outcome {
    /// When the write was done (CLOCK_MONOTONIC ns).
    pub done_ns: u64,
    pub pid: u32,
    pub path: PathBuf,
    pub result: Result<NewFile, String>,
    /// The parent held at its wait for this file, if it was marked
    /// ([`AgentHold`]): to be continued now.
    pub agent: Option<u32>,
}

/// What a writer thread sends back.
enum Done {
    Wrote(Outcome),
    Prepared {
        pid: u32,
        target: Target,
        ready: Option<Ready>,
    },
}

/// A process's error file as the collector keeps it.
struct Entry {
    target: Target,
    /// The file is its parent's too (a DataLoader worker's, a helper's):
    /// the agent waits on the process whose parent (the agent) has none.
    parents: bool,
    /// Made ready at its exec, where it could be.
    ready: Option<Ready>,
}

/// The error files the job's processes name, and the threads that write
/// them: one per user, started when that user's first file is known, with
/// the user's credentials taken on once (`safe_file::assume`). At a
/// process's exec its writer makes the file ready (created empty beside
/// its target); at its kill, on a local file system, the collector itself
/// writes it and renames it in, through the descriptors held, a fraction
/// of a millisecond after the kernel's kill record, before the dying
/// process can be reaped. Elsewhere (FUSE, NFS), or for a forked worker,
/// the writer thread does it.
pub struct ErrorFiles {
    targets: HashMap<u32, Entry>,
    /// Each process's parent, from the forks seen.
    parents: HashMap<u32, u32>,
    /// Processes already given a file (or found one there).
    fired: std::collections::HashSet<u32>,
    /// A writer per user; `None`: it could not be started.
    writers: HashMap<Owner, Option<SyncSender<Job>>>,
    done_tx: SyncSender<Done>,
    rx: Receiver<Done>,
    /// Writes done on the collector's own thread, for `poll`.
    inline: Vec<Outcome>,
    recording: String,
    /// The kernel's half of holding the agent, where agents may be held
    /// (the recorder runs the job): its program is attached at the first
    /// process the agent waits on (`agent_hold.rs`).
    hold: Option<AgentHold>,
    hold_on: bool,
    /// Processes the agent waits on whose files are made ready once the
    /// hold is attached: a file made ready says that the agent is held.
    unprepared: Vec<u32>,
    /// [`ENV_DELAY_MS`].
    delay: Option<Duration>,
}

/// Users given a writer at most; a file of another is not written, and
/// said.
const MAX_WRITERS: usize = 8;

fn start_writer(owner: Owner, done: SyncSender<Done>) -> Option<SyncSender<Job>> {
    let (tx, jobs) = mpsc::sync_channel::<Job>(MAX_QUEUED);
    thread::Builder::new()
        .name("trainbpf-errfile".into())
        .spawn(move || {
            let assumed = crate::util::safe_file::assume(owner).map_err(|e| e.to_string());
            while let Ok(j) = jobs.recv() {
                let back = match j {
                    Job::Prepare { pid, target } => Done::Prepared {
                        pid,
                        ready: assumed
                            .as_ref()
                            .ok()
                            .and_then(|()| Ready::prepare(&target.path, owner).ok().flatten()),
                        target,
                    },
                    Job::Write {
                        pid,
                        target,
                        text,
                        ready,
                        delay,
                        agent,
                    } => {
                        if let Some(d) = delay {
                            thread::sleep(d);
                        }
                        let result = match (&assumed, ready) {
                            (_, Some(r)) => r.finish(text.as_bytes()),
                            (Ok(()), None) => create_new_here(&target.path, text.as_bytes(), owner),
                            (Err(e), None) => Err(FileError::Io {
                                what: format!("taking on uid {}", owner.uid),
                                err: std::io::Error::other(e.clone()),
                            }),
                        };
                        Done::Wrote(Outcome {
                            done_ns: crate::util::clock::mono_ns(),
                            pid,
                            path: target.path,
                            result: result.map_err(|e| e.to_string()),
                            agent,
                        })
                    }
                    Job::Discard(r) => {
                        r.discard();
                        continue;
                    }
                };
                // The collector gone or far behind: the file is written;
                // only its note is dropped (a file made ready is closed,
                // and left empty under its hidden name).
                let _ = done.try_send(back);
            }
        })
        .ok()
        .map(|_| tx)
}

impl ErrorFiles {
    /// `recording`: the recording's path as the user would pass it to
    /// `trainbpf report`.
    pub fn start(recording: String) -> ErrorFiles {
        let (done_tx, rx) = mpsc::sync_channel::<Done>(MAX_QUEUED);
        ErrorFiles {
            targets: HashMap::new(),
            parents: HashMap::new(),
            fired: Default::default(),
            writers: HashMap::new(),
            done_tx,
            rx,
            inline: Vec::new(),
            recording,
            hold: None,
            hold_on: false,
            unprepared: Vec::new(),
            delay: std::env::var(ENV_DELAY_MS)
                .ok()
                .and_then(|v| v.parse().ok())
                .map(Duration::from_millis),
        }
    }

    /// The writer for `owner`, started at its first file.
    fn writer(&mut self, owner: Owner) -> Option<&SyncSender<Job>> {
        if !self.writers.contains_key(&owner) && self.writers.len() < MAX_WRITERS {
            let w = start_writer(owner, self.done_tx.clone());
            self.writers.insert(owner, w);
        }
        self.writers.get(&owner)?.as_ref()
    }

    /// Forgets a process's entry; a file made ready for it is removed.
    fn forget(&mut self, tgid: u32) {
        if let Some(h) = &mut self.hold {
            h.unwaited(tgid);
        }
        if let Some(Entry {
            target,
            ready: Some(r),
            ..
        }) = self.targets.remove(&tgid)
        {
            self.discard(target.owner, r);
        }
    }

    /// Makes `tgid`'s file ready ahead of its kill, on its user's writer
    /// thread.
    fn prepare(&mut self, tgid: u32, target: Target) {
        if let Some(tx) = self.writer(target.owner) {
            let _ = tx.try_send(Job::Prepare { pid: tgid, target });
        }
    }

    /// Removes an unused ready file on its user's writer thread: the
    /// directory may be one whose operations wait.
    fn discard(&mut self, owner: Owner, r: Ready) {
        if let Some(tx) = self.writer(owner) {
            let _ = tx.try_send(Job::Discard(r));
        }
    }

    /// A process's error file, read from its environment at its exec;
    /// `None` forgets an earlier one (an exec without the variable).
    pub fn know(&mut self, tgid: u32, target: Option<Target>) {
        self.forget(tgid);
        let Some(t) = target else { return };
        if self.targets.len() >= MAX_PROCS {
            return;
        }
        let parents = self
            .parents
            .get(&tgid)
            .and_then(|p| self.targets.get(p))
            .is_some_and(|e| e.target.path == t.path);
        // The process the agent waits on: its parent held at its wait if
        // the OOM killer chooses it, and its file made ready, once the
        // hold is attached.
        if !parents {
            let mut wait = false;
            if let (Some(h), Some(&parent)) = (&mut self.hold, self.parents.get(&tgid)) {
                h.waited(tgid, parent);
                wait = !self.hold_on;
            }
            if !wait {
                self.prepare(tgid, t.clone());
            } else if !self.unprepared.contains(&tgid) {
                self.unprepared.push(tgid);
            }
        }
        self.targets.insert(
            tgid,
            Entry {
                target: t,
                parents,
                ready: None,
            },
        );
    }

    /// A fork: the child has its parent's environment.
    pub fn on_fork(&mut self, parent: u32, child: u32) {
        self.fired.remove(&child);
        self.forget(child);
        if self.parents.len() < MAX_PROCS {
            self.parents.insert(child, parent);
        }
        if let Some(e) = self.targets.get(&parent)
            && self.targets.len() < MAX_PROCS
        {
            let target = e.target.clone();
            self.targets.insert(
                child,
                Entry {
                    target,
                    parents: true,
                    ready: None,
                },
            );
        }
    }

    pub fn on_exit(&mut self, tgid: u32) {
        self.forget(tgid);
        self.parents.remove(&tgid);
        self.fired.remove(&tgid);
    }

    /// Whether `tgid` names an error file not yet written for it; `own`:
    /// only where the file is not its parent's too (the process the agent
    /// waits on, not one of its workers).
    pub fn armed(&self, tgid: u32, own: bool) -> bool {
        self.targets.get(&tgid).is_some_and(|e| !(own && e.parents)) && !self.fired.contains(&tgid)
    }

    /// `tgid` was killed: its file, with `line`, unless it has one. Never
    /// waits: written here through a file made ready on a local file
    /// system, else queued for the writer's thread. Each write's
    /// [`Outcome`], a failure to queue it included, comes from [`poll`].
    ///
    /// [`poll`]: ErrorFiles::poll
    pub fn killed(&mut self, tgid: u32, line: &str, unix_s: u64) {
        let Some(e) = self.targets.get_mut(&tgid) else {
            return;
        };
        if !self.fired.insert(tgid) {
            return;
        }
        let target = e.target.clone();
        let agent = match (&mut self.hold, e.parents) {
            (Some(h), false) => {
                h.unwaited(tgid);
                self.parents.get(&tgid).copied()
            }
            _ => None,
        };
        let text = error_json(line, &self.recording, unix_s);
        let ready = match e.ready.take() {
            Some(r) if r.local && self.delay.is_none() => {
                let result = r.finish(text.as_bytes()).map_err(|e| e.to_string());
                self.inline.push(Outcome {
                    done_ns: crate::util::clock::mono_ns(),
                    pid: tgid,
                    path: target.path,
                    result,
                    agent,
                });
                return;
            }
            other => other,
        };
        let (path, delay) = (target.path.clone(), self.delay);
        let queued = match self.writer(target.owner) {
            None => Err(format!(
                "no writer for uid {} (more than {MAX_WRITERS} users, or its thread could not start)",
                target.owner.uid
            )),
            Some(tx) => tx
                .try_send(Job::Write {
                    pid: tgid,
                    target,
                    text,
                    ready,
                    delay,
                    agent,
                })
                .map_err(|_| format!("more than {MAX_QUEUED} error files waiting to be written")),
        };
        if let Err(e) = queued {
            self.inline.push(Outcome {
                done_ns: crate::util::clock::mono_ns(),
                pid: tgid,
                path,
                result: Err(e),
                agent,
            });
        }
    }

    /// The writes done since the last time; never waits. Files made ready
    /// are kept for their processes here.
    pub fn poll(&mut self) -> Vec<Outcome> {
        let mut out = std::mem::take(&mut self.inline);
        loop {
            match self.rx.try_recv() {
                Ok(Done::Wrote(o)) => out.push(o),
                Ok(Done::Prepared { pid, target, ready }) => {
                    let Some(r) = ready else { continue };
                    match self.targets.get_mut(&pid) {
                        Some(e)
                            if e.target == target
                                && e.ready.is_none()
                                && !self.fired.contains(&pid) =>
                        {
                            e.ready = Some(r);
                        }
                        // Gone, exec'd, or killed meanwhile: removed on
                        // the writer's thread, which may wait.
                        _ => self.discard(target.owner, r),
                    }
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        // The files are in: no agent waiting for one is held from now on
        // (the caller continues any held already).
        if let Some(h) = &mut self.hold {
            for o in &out {
                if let Some(p) = o.agent {
                    h.clear(p, o.pid);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_comes_only_from_the_variable_and_must_be_absolute() {
        let me = Owner::current();
        let env = b"PATH=/bin\0TORCHELASTIC_ERROR_FILE=/tmp/te/1/error.json\0RANK=1\0";
        assert_eq!(
            target_of(env, me).map(|t| t.path),
            Some(PathBuf::from("/tmp/te/1/error.json"))
        );
        // torchelastic's "no logs" case, a relative path, an over-long one,
        // a name that only ends like it.
        for env in [
            b"TORCHELASTIC_ERROR_FILE=\0".to_vec(),
            b"TORCHELASTIC_ERROR_FILE=error.json\0".to_vec(),
            format!("TORCHELASTIC_ERROR_FILE=/{}\0", "a".repeat(MAX_PATH_BYTES)).into_bytes(),
            b"XTORCHELASTIC_ERROR_FILE=/tmp/e\0".to_vec(),
        ] {
            assert_eq!(target_of(&env, me), None);
        }
    }

    #[test]
    fn the_format_is_torchelastics_own() {
        let text = error_json(
            "rank 1 (pid 7) was OOM-killed: \"quoted\"\n",
            "/home/u/trainbpf.rec",
            1_700_000_000,
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        // What `ProcessFailure._get_error_data` reads.
        let m = &v["message"];
        assert_eq!(m["message"], "rank 1 (pid 7) was OOM-killed: \"quoted\"\n");
        assert_eq!(m["extraInfo"]["timestamp"], "1700000000");
        let cs = m["extraInfo"]["py_callstack"].as_str().unwrap();
        assert!(cs.starts_with("rank 1 (pid 7)"), "{cs}");
        assert!(cs.ends_with("trainbpf report /home/u/trainbpf.rec"), "{cs}");
    }

    #[test]
    fn a_kill_writes_once_per_process_and_forks_inherit() {
        let d = std::env::temp_dir().join(format!("trainbpf-te-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let me = Owner::current();
        let mut ef = ErrorFiles::start("r.rec".into());
        let target = Target {
            path: d.join("error.json"),
            owner: me,
        };
        ef.on_fork(1, 10);
        ef.know(10, Some(target.clone()));
        ef.on_fork(10, 11);
        assert!(ef.armed(11, false) && !ef.armed(12, false));
        // The rank's own, not its worker's, for a death the agent waits on.
        assert!(ef.armed(10, true) && !ef.armed(11, true));
        // A worker that execs (spawn) keeps its parent's file: not own.
        ef.on_fork(10, 13);
        ef.know(13, Some(target.clone()));
        assert!(!ef.armed(13, true) && ef.armed(13, false));
        ef.killed(12, "not ours", 1);
        ef.killed(11, "worker killed", 5);
        ef.killed(11, "again", 6);
        ef.killed(10, "rank killed", 7);
        let mut outcomes = Vec::new();
        while outcomes.len() < 2 {
            outcomes.extend(ef.poll());
            std::thread::yield_now();
        }
        assert_eq!(outcomes[0].pid, 11);
        assert_eq!(outcomes[0].result, Ok(NewFile::Written));
        // The rank's own death finds the worker's file: left alone.
        assert_eq!(outcomes[1].result, Ok(NewFile::Exists));
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&target.path).unwrap()).unwrap();
        assert_eq!(v["message"]["message"], "worker killed");
        ef.on_exit(10);
        assert!(!ef.armed(10, false));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The process the agent waits on gets its file made ready at its
    /// exec; its kill writes it on the caller's own thread, at once; an
    /// unkilled process's ready file is removed when it ends.
    #[test]
    fn a_ready_file_is_written_at_once_and_an_unused_one_removed() {
        let d = std::env::temp_dir().join(format!("trainbpf-te-ready-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let me = Owner::current();
        let mut ef = ErrorFiles::start("r.rec".into());
        let target = |n: &str| Target {
            path: d.join(n),
            owner: me,
        };
        ef.know(30, Some(target("a.json")));
        ef.know(31, Some(target("b.json")));
        let ready = |ef: &mut ErrorFiles| {
            for _ in 0..1000 {
                ef.poll();
                if [30, 31].iter().all(|p| ef.targets[p].ready.is_some()) {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            false
        };
        assert!(ready(&mut ef), "both made ready");
        let names = || {
            let mut v: Vec<String> = std::fs::read_dir(&d)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names().len(), 2, "two hidden files: {:?}", names());
        ef.killed(30, "rank 1 was OOM-killed", 9);
        // Written already, on this thread.
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("a.json")).unwrap()).unwrap();
        assert_eq!(v["message"]["message"], "rank 1 was OOM-killed");
        let out = ef.poll();
        assert_eq!((out.len(), out[0].pid), (1, 30));
        assert_eq!(out[0].result, Ok(NewFile::Written));
        ef.on_exit(31);
        for _ in 0..1000 {
            if names().len() == 1 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(names(), ["a.json"]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
