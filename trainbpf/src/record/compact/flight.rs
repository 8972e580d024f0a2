//! The flight recorder's side of compaction: when the recording nears
//! `--max-size`, a thread compacts a copy, and the collector appends what
//! it wrote meanwhile and installs the copy over the recording.

use std::{
    ffi::{OsStr, OsString},
    fs::File,
    io::{self, Read},
};

use trainbpf_report::recording::Writer;

use super::{CompactError, Policy, Stats, compact, human_bytes, human_span};
use crate::util::safe_file::{FileError, InstallError, Place, ReadAt};

/// `record --max-size` and `--full-span`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlightOptions {
    /// The size the recording is kept under, bytes.
    pub max_size: u64,
    /// Samples this recent are never folded, unless the budget can't hold
    /// them (the user is told).
    pub full_span_ns: u64,
}

impl FlightOptions {
    /// Compaction starts when the file reaches this much of the bound...
    fn trigger(&self) -> u64 {
        self.max_size / 10 * 9
    }
    /// ...and tightens its policy until the file is at most this.
    fn target(&self) -> u64 {
        self.max_size / 10 * 6
    }
}

/// Keeps a recording under its bound: starts a compaction in a thread when
/// the file nears it, and swaps the result in when it is done.
pub struct Flight {
    /// The recording's directory and name; compaction files are made
    /// there as the recording's owner (util/safe_file.rs).
    place: Place,
    opts: FlightOptions,
    running: Option<Running>,
    /// Not started again below this size: the last compaction could not
    /// get the file down to its target (records that are never dropped).
    next_at: u64,
    told_over: bool,
}

struct Running {
    upto: u64,
    handle: std::thread::JoinHandle<Result<Done, CompactError>>,
}

struct Done {
    tmp: OsString,
    file: File,
    stats: Stats,
    policy: Policy,
}

impl Flight {
    /// Also removes what a recorder killed mid-compaction left beside the
    /// recording.
    pub fn new(place: Place, opts: FlightOptions) -> Flight {
        place.remove_stale_compactions();
        Flight {
            place,
            opts,
            running: None,
            next_at: 0,
            told_over: false,
        }
    }

    /// Called after each flush: starts a compaction when the file nears its
    /// bound, and swaps in one that finished. Returns what to tell the
    /// user (warnings start with "warning: ").
    pub fn poll(&mut self, w: &mut Writer<File>, now_ns: u64) -> Vec<String> {
        if self
            .running
            .as_ref()
            .is_some_and(|r| r.handle.is_finished())
        {
            return self.swap(w);
        }
        let size = w.bytes_written();
        if self.running.is_none() && !w.failing() && size >= self.opts.trigger().max(self.next_at) {
            self.start(w.get_ref(), size, now_ns);
        }
        Vec::new()
    }

    /// The recording ends: a compaction under way is waited for and
    /// swapped in, so that the file ends under its bound.
    pub fn finish(&mut self, w: &mut Writer<File>, now_ns: u64) -> Vec<String> {
        let mut out = self.swap(w);
        // What was written while it ran may have taken the file past the
        // trigger again: one more, waited for, so that the file left
        // behind is within its bound.
        if w.bytes_written() >= self.opts.trigger().max(self.next_at) && !w.failing() {
            self.start(w.get_ref(), w.bytes_written(), now_ns);
            out.extend(self.swap(w));
        }
        out
    }

    /// Waits for a compaction under way and swaps it in (the size-budget
    /// simulation, which feeds records faster than real time).
    pub fn wait(&mut self, w: &mut Writer<File>) -> Vec<String> {
        self.swap(w)
    }

    /// A compaction is under way.
    pub fn running(&self) -> bool {
        self.running.is_some()
    }

    /// Compacts the first `upto` bytes of `recording` (the writer's own
    /// file: read with pread, never reopened by its path).
    fn start(&mut self, recording: &File, upto: u64, now_ns: u64) {
        let place = self.place.clone();
        let opts = self.opts;
        let handle = recording.try_clone().and_then(|src| {
            std::thread::Builder::new()
                .name("compact".into())
                .spawn(move || {
                    // Background work: the collector's thread comes first.
                    // SAFETY: plain syscalls on the calling thread.
                    unsafe {
                        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
                    }
                    // A thread of its own: it makes its files as the owner.
                    crate::util::safe_file::assume(place.owner())?;
                    compact_file(&place, &src, upto, opts, now_ns)
                })
        });
        match handle {
            Ok(handle) => self.running = Some(Running { upto, handle }),
            // No thread: try again once the file grew a little.
            Err(_) => self.next_at = upto + self.opts.max_size / 20,
        }
    }

    fn swap(&mut self, w: &mut Writer<File>) -> Vec<String> {
        let Some(Running { upto, handle }) = self.running.take() else {
            return Vec::new();
        };
        let before = w.bytes_written();
        let done = match handle.join() {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => return vec![self.failed(before, &e.to_string())],
            Err(_) => return vec![self.failed(before, "the compaction thread panicked")],
        };
        if w.failing() {
            self.place.remove(&done.tmp);
            return vec![self.failed(before, "the disk is full")];
        }
        let tmp = done.tmp.clone();
        match self.install(done.file, w.get_ref(), upto, before, &tmp) {
            Ok((file, len)) => {
                w.replace_output(file, len);
                let mut out = vec![describe(&done.stats, &done.policy, before, len, &self.opts)];
                if len > self.opts.trigger() {
                    // Even the strictest policy left too much: what is
                    // left is never dropped. Try again once it grew.
                    self.next_at = len + self.opts.max_size / 4;
                    if !self.told_over {
                        self.told_over = true;
                        out.push(format!(
                            "warning: the records that are never dropped (kills, deaths, process lifecycle, OOM and GPU events) and the last {} at full resolution take {}, near --max-size {}: the recording may grow past it",
                            human_span(done.policy.full_span_ns()),
                            human_bytes(len),
                            human_bytes(self.opts.max_size)
                        ));
                    }
                } else {
                    self.next_at = 0;
                }
                out
            }
            Err(e) => {
                self.place.remove(&tmp);
                let said = self.failed(before, &e.to_string());
                if matches!(e, InstallError::Moved(_)) {
                    // Not the recorder's file any more: never again.
                    self.next_at = u64::MAX;
                }
                vec![said]
            }
        }
    }

    fn failed(&mut self, size: u64, why: &str) -> String {
        self.next_at = size + self.opts.max_size / 20;
        format!("warning: compacting the recording failed ({why}); it goes on uncompacted for now")
    }

    /// Appends what was written to `recording` since the compaction
    /// started, makes it durable and renames it over the recording.
    fn install(
        &self,
        mut file: File,
        recording: &File,
        upto: u64,
        len: u64,
        tmp: &OsStr,
    ) -> Result<(File, u64), InstallError> {
        use std::io::Seek;
        let io = |e: io::Error| {
            InstallError::File(FileError::Io {
                what: "copying the recording's tail".into(),
                err: e,
            })
        };
        let tail = len - upto;
        let copied =
            io::copy(&mut ReadAt::new(recording, upto).take(tail), &mut file).map_err(io)?;
        if copied != tail {
            return Err(io(io::Error::other(format!(
                "the recording's tail was {copied} bytes, not {tail}"
            ))));
        }
        file.sync_data().map_err(io)?;
        let new_len = file.stream_position().map_err(io)?;
        self.place.install(tmp, &file, recording)?;
        Ok((file, new_len))
    }
}

/// The recording's first `upto` bytes, compacted into a file beside it,
/// tightening the policy until it is under the target.
/// Each step's file is made new beside the recording, with the thread's
/// credentials (the owner's), and read back through its descriptor.
fn compact_file(
    place: &Place,
    recording: &File,
    upto: u64,
    opts: FlightOptions,
    now_ns: u64,
) -> Result<Done, CompactError> {
    let ladder = Policy::ladder(opts.full_span_ns);
    // The previous step's output, which the next step reads.
    let mut prev: Option<(File, OsString)> = None;
    let mut src_len = upto;
    for (n, policy) in ladder.iter().enumerate() {
        let (out, dst) = place.create_compacting()?;
        let src = prev.as_ref().map_or(recording, |(f, _)| f);
        let open = || io::BufReader::new(ReadAt::new(src, 0)).take(src_len);
        let result = compact(
            open(),
            open(),
            out,
            policy,
            now_ns,
            opts.max_size,
            upto,
            n > 0,
        );
        if let Some((_, name)) = prev.take() {
            place.remove(&name);
        }
        let (file, stats) = match result {
            Ok(r) => r,
            Err(e) => {
                place.remove(&dst);
                return Err(e);
            }
        };
        if stats.bytes_out <= opts.target() || n + 1 == ladder.len() {
            return Ok(Done {
                tmp: dst,
                file,
                stats,
                policy: policy.clone(),
            });
        }
        prev = Some((file, dst));
        src_len = stats.bytes_out;
    }
    unreachable!("the ladder is never empty")
}

/// "recording compacted to stay under --max-size 1.0 GiB: 922 MiB → 412
/// MiB; ..."
fn describe(st: &Stats, policy: &Policy, before: u64, after: u64, opts: &FlightOptions) -> String {
    let tiers: Vec<String> = policy
        .tiers
        .iter()
        .map(|t| {
            format!(
                "{} buckets past {}",
                human_span(t.bucket_ns),
                human_span(t.older_than_ns)
            )
        })
        .collect();
    let mut s = format!(
        "recording compacted to stay under --max-size {}: {} → {}; {} older samples folded into {}",
        human_bytes(opts.max_size),
        human_bytes(before),
        human_bytes(after),
        st.samples_folded,
        tiers.join(", ")
    );
    if policy.full_span_ns() < opts.full_span_ns {
        s.push_str(&format!(
            "; warning: only the last {} stay at full resolution, not the --full-span {} asked for",
            human_span(policy.full_span_ns()),
            human_span(opts.full_span_ns)
        ));
    }
    s
}
