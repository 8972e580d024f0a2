//! The recording file: one writer, one reader. Format: docs/recording-format.md.
//!
//! ```text
//! file   = magic "TRAINBPF" | version u32 | header_len u32 | header JSON | header crc32 u32 | frame*
//! frame  = "TBFR" | payload_len u32 | payload crc32 u32 | payload
//! payload = record*
//! record = kind u16 | reserved u16 | len u32 | bytes[len]
//! ```
//! All integers little-endian. The writer appends whole frames and never
//! rewrites, so a recorder killed mid-write leaves every earlier frame intact.
//! The reader steps over a damaged frame in the middle (scanning forward to
//! the next frame whose magic, length and CRC check out, and noting what it
//! skipped), and stops at a damaged tail, saying where.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use crate::decode::{self, Timed};

mod window;
use window::{READ_CHUNK, Window};

pub const MAGIC: &[u8; 8] = b"TRAINBPF";
pub const FRAME_MAGIC: &[u8; 4] = b"TBFR";
pub const VERSION: u32 = 1;
/// No header or frame is larger; a bigger length means corruption, and the
/// reader must not try to allocate it.
pub const MAX_FRAME: u32 = 16 << 20;
const MAX_HEADER: u32 = 1 << 20;

/// Written once at the start: what was recorded, on what, and how.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordingHeader {
    pub trainbpf_version: String,
    pub kernel: String,
    pub hostname: String,
    pub page_size: u64,
    /// MemTotal and SwapTotal at the start, kB: a global OOM's domain.
    #[serde(default)]
    pub mem_total_kb: u64,
    #[serde(default)]
    pub swap_total_kb: u64,
    /// The same instant on both clocks, to turn event times (monotonic) into
    /// wall-clock times.
    pub clock: ClockPair,
    pub attach: Attach,
    /// Probes that were tried and not used, and why.
    pub fallbacks: Vec<Fallback>,
    pub config: RecordConfig,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockPair {
    pub monotonic_ns: u64,
    pub realtime_ns: u64,
}

impl ClockPair {
    /// Wall-clock ns since the epoch for a CLOCK_MONOTONIC timestamp.
    pub fn to_realtime_ns(&self, mono_ns: u64) -> u64 {
        (self.realtime_ns as i128 + mono_ns as i128 - self.monotonic_ns as i128).max(0) as u64
    }
}

/// The attach point used for each job, e.g. "tp_btf:mark_victim".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attach {
    /// `oom_kill_process` probe, when the kernel allows one.
    pub oom_context: Option<String>,
    pub oom_victim: Option<String>,
    pub memory: Option<String>,
    pub faults: Option<String>,
    pub lifecycle: Option<String>,
    pub printk: Option<String>,
    /// Who sent a job process a signal.
    #[serde(default)]
    pub signals: Option<String>,
    #[serde(default)]
    pub oom_score_adj: Option<String>,
    /// Reclaim and compaction stall probes.
    #[serde(default)]
    pub stalls: Option<String>,
    /// Page allocation and free probes (honest growth).
    #[serde(default)]
    pub pages: Option<String>,
    /// Page-cache insertions and removals, kept out of honest growth.
    #[serde(default)]
    pub page_cache: Option<String>,
    /// A forked child's page tables taken out of its parent's growth.
    #[serde(default)]
    pub forks: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fallback {
    pub probe: String,
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordConfig {
    pub rss_threshold_bytes: u64,
    pub rss_relative_shift: u32,
    pub heartbeat_ms: u64,
    pub ring_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// Reading or writing the file failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The file does not start with the recording magic.
    #[error("not a trainbpf recording (bad magic)")]
    BadMagic,
    /// Written by a format version this build can't read.
    #[error("recording format version {0} is not supported (this build reads {VERSION})")]
    Version(u32),
    /// The header is cut short or fails its checksum.
    #[error("recording header is damaged: {0}")]
    Header(String),
}

fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// Undoing a write that was cut short: the writer truncates the file back to
/// the end of its last whole frame, so that a disk that fills mid-frame
/// leaves no half frame for later frames to follow. The default says it
/// can't, and the writer then treats a failed write as fatal.
pub trait Rewind {
    fn rewind_to(&mut self, _len: u64) -> io::Result<()> {
        Err(io::Error::other("this output cannot be rewound"))
    }
}

impl Rewind for std::fs::File {
    fn rewind_to(&mut self, len: u64) -> io::Result<()> {
        use std::io::Seek;
        self.set_len(len)?;
        self.seek(io::SeekFrom::Start(len))?;
        Ok(())
    }
}

impl Rewind for Vec<u8> {
    fn rewind_to(&mut self, len: u64) -> io::Result<()> {
        self.truncate(len as usize);
        Ok(())
    }
}

impl<W: Write> Rewind for io::BufWriter<W> {}

/// Frames held in memory while the disk is full, by default: about a minute
/// of a busy job's records.
pub const BACKLOG_LIMIT: usize = 64 << 20;
/// A frame is sealed once its payload reaches this size, so that a nearly
/// full disk still takes whole frames up to its last free bytes and a torn
/// write costs at most this much.
pub const SEAL_FRAME_AT: usize = 64 << 10;
/// How often a held-back frame is offered to the disk again.
pub const RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Record kinds that are periodic samples, which the writer may drop (oldest
/// first) when its backlog is full: memory (kernel and smaps), pressure and
/// NVML samples. Everything else (kills, OOM context, exits, forks, execs,
/// signals, oom_score_adj changes, job start and end, loss counts, names,
/// GPU calls) is kept.
pub fn is_sample(kind: u16) -> bool {
    kind == trainbpf_common::KIND_MEM
        || kind == decode::KIND_PRESSURE
        || kind == decode::KIND_SMAPS
        || kind == decode::gpu::KIND_NVML
}

/// A frame's payload waiting for the disk.
struct Held {
    payload: Vec<u8>,
    /// Its samples were already dropped.
    thinned: bool,
}

/// What the writer has to tell the user; the collector prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A write failed: frames are now held in memory.
    Holding {
        error: String,
        disk_full: bool,
        held_bytes: usize,
        limit: usize,
    },
    /// The backlog reached its bound: samples are being dropped.
    Dropping { limit: usize },
    /// The disk took the backlog: writing goes on.
    Resumed {
        written_bytes: u64,
        dropped_records: u64,
    },
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        match self {
            Notice::Holding {
                error,
                disk_full,
                held_bytes,
                limit,
            } => write!(
                f,
                "writing the recording failed ({error}){}; holding {:.1} MiB of events in memory (at most {:.0} MiB) and retrying every second; the job is not affected",
                if *disk_full { ": disk full" } else { "" },
                mib(*held_bytes),
                mib(*limit)
            ),
            Notice::Dropping { limit } => write!(
                f,
                "{:.0} MiB of events are held in memory for the full disk: dropping the oldest memory samples (kills, exits, process lifecycle and OOM records are kept); the report counts them as lost",
                mib(*limit)
            ),
            Notice::Resumed {
                written_bytes,
                dropped_records,
            } => {
                write!(
                    f,
                    "the recording is being written again: {:.1} MiB of events held in memory written",
                    *written_bytes as f64 / (1 << 20) as f64
                )?;
                if *dropped_records > 0 {
                    write!(f, "; {dropped_records} memory samples were dropped")?;
                }
                Ok(())
            }
        }
    }
}

/// Appends records in frames. Callers decide when a frame ends (`flush`);
/// the collector does so at least every second, which bounds what a crash
/// can lose.
///
/// A failed write (a full disk) is not fatal where the output can be rewound
/// ([`Rewind`]): the part of the frame that got out is truncated away, the
/// frame and those after it wait in memory, within a bound, and go out when
/// the disk takes them again (tried at most every [`RETRY_EVERY`]). Past the
/// bound the oldest samples ([`is_sample`]) are dropped and counted
/// ([`Writer::dropped_records`]); past twice the bound, whole oldest frames.
pub struct Writer<W: Write> {
    out: W,
    frame: Vec<u8>,
    bytes_written: u64,
    /// Frames not yet written, oldest first.
    held: std::collections::VecDeque<Held>,
    held_bytes: usize,
    limit: usize,
    /// Payload size at which a frame is sealed ([`SEAL_FRAME_AT`]).
    seal_at: usize,
    retry_every: std::time::Duration,
    retry_at: Option<std::time::Instant>,
    /// Bytes of held frames written since the disk failed.
    resumed_bytes: u64,
    /// In a spell of failed writes (announced once).
    failing: bool,
    dropping: bool,
    dropped: u64,
    notices: Vec<Notice>,
}

impl<W: Write + Rewind> Writer<W> {
    pub fn new(mut out: W, header: &RecordingHeader) -> Result<Self, RecordingError> {
        let json = serde_json::to_vec(header).map_err(io::Error::other)?;
        let mut buf = Vec::with_capacity(json.len() + 20);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&VERSION.to_le_bytes());
        buf.extend_from_slice(&(json.len() as u32).to_le_bytes());
        buf.extend_from_slice(&json);
        buf.extend_from_slice(&crc(&json).to_le_bytes());
        out.write_all(&buf)?;
        out.flush()?;
        Ok(Writer {
            out,
            frame: Vec::with_capacity(64 << 10),
            bytes_written: buf.len() as u64,
            held: Default::default(),
            held_bytes: 0,
            limit: BACKLOG_LIMIT,
            seal_at: SEAL_FRAME_AT,
            retry_every: RETRY_EVERY,
            retry_at: None,
            resumed_bytes: 0,
            failing: false,
            dropping: false,
            dropped: 0,
            notices: Vec::new(),
        })
    }

    /// Bounds the frames held in memory while writes fail, and how often
    /// writing is tried again (tests shrink both).
    pub fn set_backlog(&mut self, limit: usize, retry_every: std::time::Duration) {
        self.limit = limit;
        self.retry_every = retry_every;
    }

    /// Seals frames at `bytes` of payload rather than [`SEAL_FRAME_AT`]
    /// (tests that need big frames).
    pub fn set_frame_size(&mut self, bytes: usize) {
        self.seal_at = bytes;
    }

    /// Adds one record to the current frame.
    pub fn record(&mut self, kind: u16, bytes: &[u8]) {
        self.frame.extend_from_slice(&kind.to_le_bytes());
        self.frame.extend_from_slice(&0u16.to_le_bytes());
        self.frame
            .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.frame.extend_from_slice(bytes);
        if self.frame.len() >= self.seal_at {
            // Sealed frames queue behind any held ones and go out at the
            // next flush, in order.
            let payload = std::mem::replace(&mut self.frame, Vec::with_capacity(64 << 10));
            self.held_bytes += payload.len();
            self.held.push_back(Held {
                payload,
                thinned: false,
            });
        }
    }

    /// Bytes waiting for the next flush: the current frame and, unless the
    /// disk is failing (when they wait for the retry), the frames sealed
    /// since the last flush.
    pub fn pending(&self) -> usize {
        self.frame.len() + if self.failing { 0 } else { self.held_bytes }
    }

    /// Bytes of whole frames in the file (the header included).
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Bytes of frames held in memory because writing failed.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Records dropped because the backlog was full.
    pub fn dropped_records(&self) -> u64 {
        self.dropped
    }

    /// What happened since the last call that the user should hear of.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    /// Ends the current frame and writes it whole, after any frames held
    /// back. Fails only where the output cannot be rewound; otherwise a
    /// failed write holds the frames in memory (see [`Writer`]).
    pub fn flush(&mut self) -> io::Result<()> {
        if !self.frame.is_empty() {
            if self.held.is_empty() {
                match self.write_frame(None) {
                    Ok(()) => {}
                    Err(e) => self.fail(e)?,
                }
                self.frame.clear();
                // Keep the buffer from holding on to a burst's peak forever.
                if self.frame.capacity() > 1 << 20 {
                    self.frame.shrink_to(64 << 10);
                }
                if self.held.is_empty() {
                    return Ok(());
                }
            } else {
                let payload = std::mem::replace(&mut self.frame, Vec::with_capacity(64 << 10));
                self.held_bytes += payload.len();
                self.held.push_back(Held {
                    payload,
                    thinned: false,
                });
            }
        }
        if self.held.is_empty() {
            return Ok(());
        }
        if self.retry_at.is_none_or(|t| std::time::Instant::now() >= t) {
            while let Some(h) = self.held.front() {
                let len = h.payload.len();
                if len == 0 {
                    // Thinned down to nothing.
                    self.held.pop_front();
                    continue;
                }
                match self.write_frame(Some(0)) {
                    Ok(()) => {
                        self.held.pop_front();
                        self.held_bytes -= len;
                        self.resumed_bytes += 12 + len as u64;
                    }
                    Err(e) => {
                        self.rewind(e)?;
                        break;
                    }
                }
            }
            if self.held.is_empty() {
                self.retry_at = None;
                let written_bytes = std::mem::take(&mut self.resumed_bytes);
                if self.failing {
                    self.notices.push(Notice::Resumed {
                        written_bytes,
                        dropped_records: self.dropped,
                    });
                }
                self.failing = false;
                self.dropping = false;
                return Ok(());
            }
            self.retry_at = Some(std::time::Instant::now() + self.retry_every);
        }
        self.bound();
        Ok(())
    }

    /// Writes the current frame (`None`) or the oldest held one, whole.
    fn write_frame(&mut self, held: Option<usize>) -> io::Result<()> {
        let payload = match held {
            None => &self.frame,
            Some(i) => &self.held[i].payload,
        };
        let mut head = [0u8; 12];
        head[..4].copy_from_slice(FRAME_MAGIC);
        head[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        head[8..].copy_from_slice(&crc(payload).to_le_bytes());
        // One write for head and payload: a crash leaves a frame whole or
        // visibly short, never a valid head over a stale payload.
        let mut buf = Vec::with_capacity(12 + payload.len());
        buf.extend_from_slice(&head);
        buf.extend_from_slice(payload);
        self.out.write_all(&buf)?;
        self.out.flush()?;
        self.bytes_written += buf.len() as u64;
        Ok(())
    }

    /// The current frame's write failed: undo what got out, and hold it.
    fn fail(&mut self, e: io::Error) -> io::Result<()> {
        self.rewind(e)?;
        let payload = std::mem::take(&mut self.frame);
        self.held_bytes += payload.len();
        self.held.push_back(Held {
            payload,
            thinned: false,
        });
        self.frame = Vec::with_capacity(64 << 10);
        Ok(())
    }

    /// Truncates the output back to the last whole frame after a failed
    /// write; the first failure of a spell is announced.
    fn rewind(&mut self, e: io::Error) -> io::Result<()> {
        if self.out.rewind_to(self.bytes_written).is_err() {
            // Nothing to fall back on (a pipe, a buffered file): as before
            // there was a backlog, the write error ends the recording.
            return Err(e);
        }
        if !self.failing {
            self.failing = true;
            self.notices.push(Notice::Holding {
                disk_full: matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)),
                error: e.to_string(),
                held_bytes: self.held_bytes
                    + if self.held.is_empty() {
                        self.frame.len()
                    } else {
                        0
                    },
                limit: self.limit,
            });
        }
        self.retry_at = Some(std::time::Instant::now() + self.retry_every);
        Ok(())
    }

    /// Keeps the backlog within its bound: first the oldest frames lose
    /// their samples, then (past twice the bound) whole oldest frames go.
    fn bound(&mut self) {
        if self.held_bytes <= self.limit {
            return;
        }
        if !self.dropping {
            self.dropping = true;
            self.notices.push(Notice::Dropping { limit: self.limit });
        }
        for h in self.held.iter_mut() {
            if self.held_bytes <= self.limit {
                return;
            }
            if h.thinned {
                continue;
            }
            let before = h.payload.len();
            self.dropped += thin(&mut h.payload);
            h.thinned = true;
            self.held_bytes -= before - h.payload.len();
        }
        while self.held_bytes > 2 * self.limit && self.held.len() > 1 {
            let h = self.held.pop_front().expect("not empty");
            self.held_bytes -= h.payload.len();
            self.dropped += count_records(&h.payload);
        }
    }

    /// Like [`flush`](Self::flush), but tries held frames now rather than
    /// at the next retry: the recording's last flush.
    pub fn flush_now(&mut self) -> io::Result<()> {
        self.retry_at = None;
        self.flush()
    }

    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// The output, once everything is flushed.
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Carries on in `out`, a compacted copy of the recording whose whole
    /// frames end at `bytes_written`: what is pending goes there. Only while
    /// writes are not failing (nothing held back for a full disk).
    pub fn replace_output(&mut self, out: W, bytes_written: u64) {
        debug_assert!(!self.failing);
        self.out = out;
        self.bytes_written = bytes_written;
    }

    /// A write failed and frames wait in memory for the disk.
    pub fn failing(&self) -> bool {
        self.failing
    }
}

/// Drops the samples from a frame's payload; returns how many.
fn thin(payload: &mut Vec<u8>) -> u64 {
    let mut kept = Vec::with_capacity(payload.len() / 4);
    let mut dropped = 0;
    let mut p = 0;
    while p + 8 <= payload.len() {
        let kind = u16::from_le_bytes([payload[p], payload[p + 1]]);
        let len = u32::from_le_bytes(payload[p + 4..p + 8].try_into().unwrap()) as usize;
        let end = (p + 8 + len).min(payload.len());
        if is_sample(kind) {
            dropped += 1;
        } else {
            kept.extend_from_slice(&payload[p..end]);
        }
        p = end;
    }
    kept.shrink_to_fit();
    *payload = kept;
    dropped
}

fn count_records(payload: &[u8]) -> u64 {
    let mut n = 0;
    let mut p = 0;
    while p + 8 <= payload.len() {
        let len = u32::from_le_bytes(payload[p + 4..p + 8].try_into().unwrap()) as usize;
        p += 8 + len;
        n += 1;
    }
    n
}

/// Where and why reading stopped before the end of the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stop {
    /// Byte offset of the first unreadable frame.
    pub offset: u64,
    pub reason: String,
}

/// A damaged stretch in the middle of a recording that the reader stepped
/// over: it scanned forward to the next frame whose magic, length and CRC
/// check out, and went on from there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Skip {
    /// Byte offset where the damage starts (the first frame that failed).
    pub offset: u64,
    /// Bytes skipped, up to the next good frame.
    pub bytes: u64,
    /// Why the first frame of the stretch was refused.
    pub reason: String,
}

/// Every damaged stretch the reader skipped. The list keeps the first
/// [`MAX_SKIPS`]; the counts cover all of them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub ranges: Vec<Skip>,
    /// Stretches skipped, listed or not.
    pub count: u64,
    /// Bytes in all of them.
    pub bytes: u64,
}

/// Skipped stretches listed one by one; more are only counted.
pub const MAX_SKIPS: usize = 256;

/// What is at the window's start.
enum Probe {
    /// A whole frame whose CRC checks out, of this payload length.
    Frame(usize),
    /// No more bytes.
    End,
    /// Not a frame: why (as a stop, and as a skip in the middle).
    Bad { stop: String, skip: String },
}

/// Streams records out of a recording; memory stays within 1.25 frames.
///
/// A frame that fails (bad magic, absurd length, CRC mismatch, cut short)
/// is not the end: the reader scans forward for the next frame magic whose
/// length and CRC check out, and reads on from there, noting the stretch it
/// skipped. Only when no good frame follows does reading stop early
/// ([`Reader::stop`]): a truncated tail.
pub struct Reader<R: Read> {
    win: Window<R>,
    header: RecordingHeader,
    /// The current frame's payload length, once one is loaded; it starts
    /// 12 bytes into the window.
    frame: Option<usize>,
    /// Read position inside the current frame's payload.
    pos: usize,
    stop: Option<Stop>,
    skipped: Skipped,
    page_kb: u64,
    /// Records that were whole but did not decode.
    pub undecodable: u64,
    pub frames: u64,
}

impl<R: Read> Reader<R> {
    pub fn new(mut input: R) -> Result<Self, RecordingError> {
        let mut fixed = [0u8; 16];
        read_exact_or(&mut input, &mut fixed).map_err(|e| match e {
            Short::Eof(_) => RecordingError::BadMagic,
            Short::Io(e) => RecordingError::Io(e),
        })?;
        if &fixed[..8] != MAGIC {
            return Err(RecordingError::BadMagic);
        }
        let version = u32::from_le_bytes(fixed[8..12].try_into().unwrap());
        if version != VERSION {
            return Err(RecordingError::Version(version));
        }
        let len = u32::from_le_bytes(fixed[12..16].try_into().unwrap());
        if len > MAX_HEADER {
            return Err(RecordingError::Header(format!(
                "header length {len} is absurd"
            )));
        }
        let mut json = vec![0u8; len as usize + 4];
        read_exact_or(&mut input, &mut json).map_err(|e| match e {
            Short::Eof(n) => RecordingError::Header(format!(
                "file ends inside the header ({n} of {} bytes)",
                len + 4
            )),
            Short::Io(e) => RecordingError::Io(e),
        })?;
        let want = u32::from_le_bytes(json[len as usize..].try_into().unwrap());
        json.truncate(len as usize);
        if crc(&json) != want {
            return Err(RecordingError::Header("checksum mismatch".into()));
        }
        let header: RecordingHeader =
            serde_json::from_slice(&json).map_err(|e| RecordingError::Header(e.to_string()))?;
        let page_kb = (header.page_size / 1024).max(1);
        Ok(Reader {
            win: Window::new(input, 16 + len as u64 + 4),
            header,
            frame: None,
            pos: 0,
            stop: None,
            skipped: Skipped::default(),
            page_kb,
            undecodable: 0,
            frames: 0,
        })
    }

    pub fn header(&self) -> &RecordingHeader {
        &self.header
    }

    /// Set once reading stopped early: where, and why.
    pub fn stop(&self) -> Option<&Stop> {
        self.stop.as_ref()
    }

    /// Damaged stretches in the middle that were skipped so far.
    pub fn skipped(&self) -> &Skipped {
        &self.skipped
    }

    /// Bytes read, scanned, moved or checksummed so far. It grows linearly
    /// with the input, whatever the input holds; tests bound it per byte.
    pub fn work(&self) -> u64 {
        self.win.work()
    }

    /// Looks at the bytes at the window's start. `resync`: we are scanning
    /// after damage, so a candidate's payload must also start with a
    /// plausible record (the writer never writes an empty frame), which
    /// rejects most chance "TBFR"s before their CRC is computed. Only the
    /// first record is looked at: walking them all would cost the claimed
    /// length again for every candidate, and a frame whose CRC matches is
    /// read like any other (next_raw counts what does not tile).
    fn probe(&mut self, resync: bool) -> io::Result<Probe> {
        let got = self.win.fill(12)?;
        if got == 0 {
            return Ok(Probe::End);
        }
        if got < 12 {
            let why = format!("file ends inside a frame header ({got} of 12 bytes)");
            return Ok(Probe::Bad {
                stop: why.clone(),
                skip: why,
            });
        }
        let head = &self.win.avail()[..12];
        if &head[..4] != FRAME_MAGIC {
            let why = "bad frame magic".to_string();
            return Ok(Probe::Bad {
                stop: why.clone(),
                skip: why,
            });
        }
        let len = u32::from_le_bytes(head[4..8].try_into().unwrap());
        let want = u32::from_le_bytes(head[8..12].try_into().unwrap());
        if len > MAX_FRAME {
            let why = format!("frame length {len} exceeds the {MAX_FRAME}-byte limit");
            return Ok(Probe::Bad {
                stop: why.clone(),
                skip: why,
            });
        }
        let len = len as usize;
        let got = self.win.fill(12 + len)?;
        if got < 12 + len {
            return Ok(Probe::Bad {
                stop: format!("file ends inside a frame ({} of {len} bytes)", got - 12),
                skip: format!("frame length {len} runs past the end of the file"),
            });
        }
        if resync && !first_record_fits(&self.win.avail()[12..12 + len]) {
            let why = "frame checksum mismatch".to_string();
            return Ok(Probe::Bad {
                stop: why.clone(),
                skip: why,
            });
        }
        // The span's CRC from the window's checkpoints: candidates overlap,
        // and their bytes must not be checksummed once per candidate.
        if self.win.crc(12, 12 + len) != want {
            let why = "frame checksum mismatch".to_string();
            return Ok(Probe::Bad {
                stop: why.clone(),
                skip: why,
            });
        }
        Ok(Probe::Frame(len))
    }

    /// Steps past the byte at the window's start to the next "TBFR" (or the
    /// end). False at the end of the input.
    fn scan(&mut self) -> io::Result<bool> {
        self.win.consume(1);
        loop {
            let got = self.win.fill(READ_CHUNK)?;
            if got < FRAME_MAGIC.len() {
                self.win.consume(got);
                return Ok(false);
            }
            let found = self
                .win
                .avail()
                .windows(FRAME_MAGIC.len())
                .position(|w| w == FRAME_MAGIC);
            match found {
                Some(i) => {
                    self.win.examined(i + FRAME_MAGIC.len());
                    self.win.consume(i);
                    return Ok(true);
                }
                // Keep the last 3 bytes: a magic may straddle the chunk.
                None => {
                    self.win.examined(got);
                    self.win.consume(got - (FRAME_MAGIC.len() - 1));
                }
            }
        }
    }

    /// Loads the next good frame, skipping damage; false at the end (or at
    /// a truncated tail, or a read error, which `stop` then names).
    fn next_frame(&mut self) -> bool {
        if self.stop.is_some() {
            return false;
        }
        // The previous frame is done with.
        if let Some(len) = self.frame.take() {
            self.win.consume(12 + len);
        }
        self.pos = 0;
        // The first failure of the current damaged stretch: offset, and the
        // reason as a stop and as a skip.
        let mut bad: Option<(u64, String, String)> = None;
        loop {
            let probe = match self.probe(bad.is_some()) {
                Ok(p) => p,
                Err(e) => return self.halt(bad.map(|b| b.0), format!("read error: {e}")),
            };
            match probe {
                Probe::Frame(len) => {
                    if let Some((offset, _, reason)) = bad.take() {
                        self.note_skip(offset, self.win.offset - offset, reason);
                    }
                    self.frame = Some(len);
                    self.frames += 1;
                    return true;
                }
                Probe::End => {
                    return match bad {
                        Some((offset, stop, _)) => self.halt(Some(offset), stop),
                        None => false,
                    };
                }
                Probe::Bad { stop, skip } => {
                    if bad.is_none() {
                        bad = Some((self.win.offset, stop, skip));
                    }
                    match self.scan() {
                        Ok(true) => {}
                        Ok(false) => {
                            let (offset, stop, _) = bad.expect("set above");
                            return self.halt(Some(offset), stop);
                        }
                        Err(e) => return self.halt(bad.map(|b| b.0), format!("read error: {e}")),
                    }
                }
            }
        }
    }

    fn note_skip(&mut self, offset: u64, bytes: u64, reason: String) {
        self.skipped.count += 1;
        self.skipped.bytes += bytes;
        if self.skipped.ranges.len() < MAX_SKIPS {
            self.skipped.ranges.push(Skip {
                offset,
                bytes,
                reason,
            });
        }
    }

    /// Stops reading at `offset` (default: where the window is).
    fn halt(&mut self, offset: Option<u64>, reason: String) -> bool {
        self.stop = Some(Stop {
            offset: offset.unwrap_or(self.win.offset),
            reason,
        });
        self.frame = None;
        self.pos = 0;
        false
    }

    /// The next raw record: (kind, bytes).
    pub fn next_raw(&mut self) -> Option<(u16, &[u8])> {
        loop {
            let frame_len = self.frame.unwrap_or(0);
            if self.pos + 8 <= frame_len {
                let frame = &self.win.avail()[12..12 + frame_len];
                let p = self.pos;
                let kind = u16::from_le_bytes(frame[p..p + 2].try_into().unwrap());
                let len = u32::from_le_bytes(frame[p + 4..p + 8].try_into().unwrap()) as usize;
                if len > frame.len() - p - 8 {
                    // The CRC matched, so the writer itself wrote this: a bug,
                    // not damage. Skip the rest of the frame, and count it.
                    self.undecodable += 1;
                    self.pos = frame_len;
                    continue;
                }
                self.pos = p + 8 + len;
                let frame = &self.win.avail()[12..12 + frame_len];
                return Some((kind, &frame[p + 8..p + 8 + len]));
            }
            if self.pos < frame_len {
                // A few bytes too short to be a record: as above.
                self.undecodable += 1;
                self.pos = frame_len;
            }
            if !self.next_frame() {
                return None;
            }
        }
    }
}

/// True when `payload` starts with a record header whose reserved field is
/// zero and whose length fits in the payload: what every frame the writer
/// produces does.
fn first_record_fits(payload: &[u8]) -> bool {
    payload.len() >= 8
        && payload[2..4] == [0, 0]
        && u32::from_le_bytes(payload[4..8].try_into().unwrap()) as usize <= payload.len() - 8
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Timed;

    /// Decoded events; records that don't decode are counted in
    /// `undecodable` and skipped.
    fn next(&mut self) -> Option<Timed> {
        loop {
            let page_kb = self.page_kb;
            let (kind, bytes) = self.next_raw()?;
            match decode::decode(kind, bytes, page_kb) {
                Ok(t) => return Some(t),
                Err(_) => self.undecodable += 1,
            }
        }
    }
}

enum Short {
    /// End of file after this many bytes.
    Eof(usize),
    Io(io::Error),
}

fn read_exact_or<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<(), Short> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => return Err(Short::Eof(got)),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Short::Io(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Event, UserBody, encode_user};

    fn header() -> RecordingHeader {
        RecordingHeader {
            page_size: 4096,
            kernel: "6.18.0".into(),
            ..Default::default()
        }
    }

    fn sample(n: u32) -> Vec<u8> {
        let mut w = Writer::new(Vec::new(), &header()).unwrap();
        for i in 0..n {
            let (k, b) = encode_user(i as u64, UserBody::Note(format!("note {i}")));
            w.record(k, &b);
            w.flush().unwrap();
        }
        w.get_ref().clone()
    }

    fn notes(bytes: &[u8]) -> (Vec<u64>, Option<Stop>) {
        let mut r = Reader::new(bytes).unwrap();
        let ts = r.by_ref().map(|t| t.ts_ns).collect();
        (ts, r.stop().cloned())
    }

    #[test]
    fn round_trip() {
        let bytes = sample(3);
        let mut r = Reader::new(&bytes[..]).unwrap();
        assert_eq!(r.header().kernel, "6.18.0");
        let evs: Vec<_> = r.by_ref().collect();
        assert_eq!(evs.len(), 3);
        assert_eq!(evs[2].event, Event::Note("note 2".into()));
        assert!(r.stop().is_none());
    }

    #[test]
    fn truncated_file_keeps_whole_frames_and_says_where() {
        let bytes = sample(3);
        let cut = &bytes[..bytes.len() - 5];
        let (ts, stop) = notes(cut);
        assert_eq!(ts, vec![0, 1]);
        let stop = stop.expect("a stop");
        assert!(
            stop.reason.contains("ends inside a frame"),
            "{}",
            stop.reason
        );
        assert!(stop.offset > 0 && (stop.offset as usize) < cut.len());
    }

    #[test]
    fn corrupt_frame_stops_with_checksum_error() {
        let mut bytes = sample(3);
        let n = bytes.len();
        bytes[n - 3] ^= 0xff;
        let (ts, stop) = notes(&bytes);
        assert_eq!(ts, vec![0, 1]);
        assert_eq!(stop.unwrap().reason, "frame checksum mismatch");
    }

    /// Start offsets of the frames in a well-formed recording.
    fn frame_starts(bytes: &[u8]) -> Vec<usize> {
        let hlen = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        let mut at = 16 + hlen + 4;
        let mut starts = Vec::new();
        while at < bytes.len() {
            starts.push(at);
            let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
            at += 12 + len;
        }
        starts
    }

    fn read_all(bytes: &[u8]) -> (Vec<u64>, Option<Stop>, Skipped) {
        let mut r = Reader::new(bytes).unwrap();
        let ts = r.by_ref().map(|t| t.ts_ns).collect();
        (ts, r.stop().cloned(), r.skipped().clone())
    }

    #[test]
    fn corrupt_middle_frame_is_skipped_and_the_rest_read() {
        let mut bytes = sample(5);
        let starts = frame_starts(&bytes);
        // Damage the payload of the third frame (ts 2).
        bytes[starts[2] + 20] ^= 0x55;
        let (ts, stop, skipped) = read_all(&bytes);
        assert_eq!(ts, vec![0, 1, 3, 4]);
        assert!(stop.is_none(), "{stop:?}");
        assert_eq!(
            skipped.ranges,
            vec![Skip {
                offset: starts[2] as u64,
                bytes: (starts[3] - starts[2]) as u64,
                reason: "frame checksum mismatch".into(),
            }]
        );
        assert_eq!((skipped.count, skipped.bytes), (1, skipped.ranges[0].bytes));
    }

    #[test]
    fn damaged_magic_and_length_in_the_middle_are_skipped() {
        let clean = sample(4);
        let starts = frame_starts(&clean);
        // A frame magic overwritten.
        let mut bytes = clean.clone();
        bytes[starts[1]] = b'X';
        let (ts, stop, skipped) = read_all(&bytes);
        assert_eq!(ts, vec![0, 2, 3]);
        assert!(stop.is_none());
        assert_eq!(skipped.ranges[0].reason, "bad frame magic");
        assert_eq!(skipped.ranges[0].offset, starts[1] as u64);
        // A length that reaches past the end of the file.
        let mut bytes = clean.clone();
        bytes[starts[1] + 4..starts[1] + 8].copy_from_slice(&(1u32 << 20).to_le_bytes());
        let (ts, stop, skipped) = read_all(&bytes);
        assert_eq!(ts, vec![0, 2, 3]);
        assert!(stop.is_none());
        assert!(
            skipped.ranges[0].reason.contains("runs past the end"),
            "{:?}",
            skipped.ranges[0]
        );
        // An absurd length.
        let mut bytes = clean;
        bytes[starts[2] + 4..starts[2] + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        let (ts, _, skipped) = read_all(&bytes);
        assert_eq!(ts, vec![0, 1, 3]);
        assert!(skipped.ranges[0].reason.contains("exceeds"));
    }

    #[test]
    fn garbage_with_a_frame_magic_and_bad_crc_is_skipped() {
        let clean = sample(3);
        let starts = frame_starts(&clean);
        // Between frames 1 and 2: junk, then a plausible frame head whose
        // length fits and whose CRC is wrong, over a payload of whole
        // records, then more junk.
        let mut junk = b"junk junk".to_vec();
        let (k, b) = encode_user(99, UserBody::Note("fake".into()));
        let mut payload = Vec::new();
        payload.extend_from_slice(&k.to_le_bytes());
        payload.extend_from_slice(&[0, 0]);
        payload.extend_from_slice(&(b.len() as u32).to_le_bytes());
        payload.extend_from_slice(&b);
        junk.extend_from_slice(FRAME_MAGIC);
        junk.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        junk.extend_from_slice(&(crc(&payload) ^ 1).to_le_bytes());
        junk.extend_from_slice(&payload);
        junk.extend_from_slice(b"TBFRTBF");
        let mut bytes = clean[..starts[2]].to_vec();
        bytes.extend_from_slice(&junk);
        bytes.extend_from_slice(&clean[starts[2]..]);
        let (ts, stop, skipped) = read_all(&bytes);
        assert_eq!(ts, vec![0, 1, 2], "the fake note (99) is not read");
        assert!(stop.is_none());
        assert_eq!(skipped.count, 1);
        assert_eq!(
            skipped.ranges[0],
            Skip {
                offset: starts[2] as u64,
                bytes: junk.len() as u64,
                reason: "bad frame magic".into(),
            }
        );
    }

    #[test]
    fn several_damaged_stretches_each_noted_and_a_damaged_tail_stops() {
        let mut bytes = sample(8);
        let starts = frame_starts(&bytes);
        bytes[starts[1] + 14] ^= 1;
        bytes[starts[4] + 1] ^= 1;
        bytes[starts[5] + 14] ^= 1;
        let n = bytes.len();
        bytes[n - 2] ^= 1;
        let (ts, stop, skipped) = read_all(&bytes);
        assert_eq!(ts, vec![0, 2, 3, 6]);
        // Frames 4 and 5 are one stretch; the last frame is a damaged tail.
        let offsets: Vec<u64> = skipped.ranges.iter().map(|s| s.offset).collect();
        assert_eq!(offsets, vec![starts[1] as u64, starts[4] as u64]);
        assert_eq!(skipped.ranges[1].bytes, (starts[6] - starts[4]) as u64);
        let stop = stop.expect("a stop");
        assert_eq!(stop.offset, starts[7] as u64);
        assert_eq!(stop.reason, "frame checksum mismatch");
    }

    #[test]
    fn the_list_of_skips_is_bounded() {
        let mut bytes = sample(2 * MAX_SKIPS as u32 + 40);
        let starts = frame_starts(&bytes);
        for s in starts.iter().step_by(2).take(MAX_SKIPS + 10) {
            bytes[s + 14] ^= 1;
        }
        let (ts, _, skipped) = read_all(&bytes);
        assert_eq!(skipped.ranges.len(), MAX_SKIPS);
        assert_eq!(skipped.count, MAX_SKIPS as u64 + 10);
        assert_eq!(ts.len(), starts.len() - (MAX_SKIPS + 10));
    }

    #[test]
    fn frames_larger_than_a_read_chunk_and_reads_in_small_pieces() {
        /// Returns at most 7 bytes per read.
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(7).min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut w = Writer::new(Vec::new(), &header()).unwrap();
        w.set_frame_size(usize::MAX);
        for i in 0..3u64 {
            for j in 0..2000u64 {
                let (k, b) = encode_user(i * 10_000 + j, UserBody::Note("x".repeat(100)));
                w.record(k, &b);
            }
            w.flush().unwrap();
        }
        let mut bytes = w.get_ref().clone();
        let starts = frame_starts(&bytes);
        assert!(starts[1] - starts[0] > READ_CHUNK);
        bytes[starts[1] + 100] ^= 1;
        let mut r = Reader::new(Trickle(&bytes)).unwrap();
        let n = r.by_ref().count();
        assert_eq!(n, 4000);
        assert_eq!(r.skipped().count, 1);
        assert!(r.stop().is_none());
    }

    /// A file on a disk with `cap` bytes: writes what fits, then ENOSPC.
    struct Quota {
        data: Vec<u8>,
        cap: usize,
    }

    impl Write for Quota {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let room = self.cap.saturating_sub(self.data.len());
            if room == 0 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let n = buf.len().min(room);
            self.data.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Rewind for Quota {
        fn rewind_to(&mut self, len: u64) -> io::Result<()> {
            self.data.truncate(len as usize);
            Ok(())
        }
    }

    /// The disk starts with room for the header; tests then set `cap`.
    fn quota_writer() -> Writer<Quota> {
        let mut w = Writer::new(
            Quota {
                data: Vec::new(),
                cap: usize::MAX,
            },
            &header(),
        )
        .unwrap();
        w.set_backlog(BACKLOG_LIMIT, std::time::Duration::ZERO);
        w
    }

    fn note(w: &mut Writer<Quota>, i: u64) {
        let (k, b) = encode_user(i, UserBody::Note(format!("note {i}")));
        w.record(k, &b);
    }

    #[test]
    fn a_full_disk_holds_frames_in_memory_and_writing_resumes() {
        let mut w = quota_writer();
        let start = w.bytes_written() as usize;
        // Room for the header and two and a bit frames (of 56 bytes).
        w.out.cap = start + 120;
        for i in 0..10 {
            note(&mut w, i);
            w.flush().expect("a full disk is not an error");
        }
        let notices = w.take_notices();
        assert_eq!(notices.len(), 1, "warned once: {notices:?}");
        assert!(
            matches!(
                &notices[0],
                Notice::Holding {
                    disk_full: true,
                    ..
                }
            ),
            "{notices:?}"
        );
        let text = notices[0].to_string();
        assert!(text.contains("disk full; holding"), "{text}");
        // What is on the disk is whole frames only: no half frame at the end.
        assert_eq!(w.get_ref().data.len() as u64, w.bytes_written());
        let (ts, stop, skipped) = read_all(&w.get_ref().data);
        assert_eq!(ts, vec![0, 1]);
        assert!(stop.is_none() && skipped.count == 0);
        assert!(w.held_bytes() > 0);
        // A forced retry that fails again is the same spell: no new warning.
        w.flush_now().unwrap();
        assert_eq!(w.take_notices(), vec![]);
        // The disk has room again.
        w.out.cap = usize::MAX;
        note(&mut w, 10);
        w.flush().unwrap();
        assert_eq!(w.held_bytes(), 0);
        let notices = w.take_notices();
        assert!(
            matches!(
                notices[..],
                [Notice::Resumed {
                    dropped_records: 0,
                    ..
                }]
            ),
            "{notices:?}"
        );
        let (ts, stop, skipped) = read_all(&w.get_ref().data);
        assert_eq!(ts, (0..11).collect::<Vec<_>>());
        assert!(stop.is_none() && skipped.count == 0);
    }

    #[test]
    fn a_burst_bigger_than_the_room_left_fills_it_with_whole_frames() {
        let mut w = quota_writer();
        let start = w.bytes_written() as usize;
        // A burst of 4 frames' worth between two flushes, and room for 2.5.
        w.out.cap = start + SEAL_FRAME_AT * 5 / 2;
        let mut n = 0;
        let mut bytes = 0;
        while bytes < 4 * SEAL_FRAME_AT {
            let (k, b) = encode_user(n, UserBody::Note(format!("note {n}")));
            w.record(k, &b);
            bytes += 8 + b.len();
            n += 1;
        }
        assert_eq!(w.pending(), bytes, "sealed frames count as pending");
        w.flush().unwrap();
        let written = w.bytes_written() as usize - start;
        assert!(
            (2 * SEAL_FRAME_AT..=SEAL_FRAME_AT * 5 / 2).contains(&written),
            "two whole frames went out: {written}"
        );
        assert_eq!(w.get_ref().data.len(), w.bytes_written() as usize);
        let (ts, stop, _) = read_all(&w.get_ref().data);
        assert!(stop.is_none());
        assert_eq!(
            ts,
            (0..ts.len() as u64).collect::<Vec<_>>(),
            "in order, from the start"
        );
        // The disk frees up: the rest follows, in order, announced once.
        w.out.cap = usize::MAX;
        w.flush_now().unwrap();
        let (ts, _, _) = read_all(&w.get_ref().data);
        assert_eq!(ts, (0..n).collect::<Vec<_>>());
        assert!(matches!(
            w.take_notices()[..],
            [Notice::Holding { .. }, Notice::Resumed { .. }]
        ));
    }

    #[test]
    fn frames_written_without_trouble_say_nothing() {
        let mut w = quota_writer();
        for i in 0..(3 * SEAL_FRAME_AT as u64 / 40) {
            note(&mut w, i);
        }
        assert!(w.pending() > 2 * SEAL_FRAME_AT);
        w.flush().unwrap();
        assert_eq!(w.held_bytes(), 0);
        assert_eq!(w.pending(), 0);
        assert_eq!(w.take_notices(), vec![]);
    }

    #[test]
    fn retries_wait_for_the_interval() {
        let mut w = quota_writer();
        w.out.cap = w.bytes_written() as usize;
        w.set_backlog(BACKLOG_LIMIT, std::time::Duration::from_secs(3600));
        note(&mut w, 0);
        w.flush().unwrap();
        w.out.cap = usize::MAX;
        note(&mut w, 1);
        w.flush().unwrap();
        assert!(w.held_bytes() > 0, "not retried before the interval");
        w.flush_now().unwrap();
        assert_eq!(w.held_bytes(), 0);
        let (ts, _, _) = read_all(&w.get_ref().data);
        assert_eq!(ts, vec![0, 1]);
    }

    #[test]
    fn a_full_backlog_drops_the_oldest_samples_and_keeps_the_rest() {
        let mut w = quota_writer();
        w.out.cap = w.bytes_written() as usize;
        w.set_backlog(8 << 10, std::time::Duration::ZERO);
        let mem = vec![0u8; 120];
        for i in 0..100u64 {
            for _ in 0..4 {
                w.record(trainbpf_common::KIND_MEM, &mem);
            }
            w.record(trainbpf_common::KIND_EXIT, &i.to_le_bytes());
            w.flush().unwrap();
            assert!(w.held_bytes() <= 8 << 10, "bounded: {}", w.held_bytes());
        }
        let notices = w.take_notices();
        assert!(
            notices.iter().any(|n| matches!(n, Notice::Dropping { .. })),
            "{notices:?}"
        );
        let dropped = w.dropped_records();
        assert!(dropped > 0);
        w.out.cap = usize::MAX;
        w.flush_now().unwrap();
        let mut r = Reader::new(&w.get_ref().data[..]).unwrap();
        let (mut exits, mut mems) = (Vec::new(), 0u64);
        while let Some((kind, bytes)) = r.next_raw() {
            match kind {
                trainbpf_common::KIND_EXIT => {
                    exits.push(u64::from_le_bytes(bytes.try_into().unwrap()))
                }
                trainbpf_common::KIND_MEM => mems += 1,
                k => panic!("kind {k}"),
            }
        }
        assert_eq!(
            exits,
            (0..100).collect::<Vec<_>>(),
            "every exit kept, in order"
        );
        assert_eq!(
            mems + dropped,
            400,
            "every memory record written or counted"
        );
        // The newest memory records are the ones kept.
        assert!(mems > 0);
        assert!(r.stop().is_none() && r.skipped().count == 0);
    }

    #[test]
    fn an_output_that_cannot_be_rewound_fails_as_before() {
        let q = Quota {
            data: Vec::new(),
            cap: 4096,
        };
        let mut w = Writer::new(io::BufWriter::with_capacity(16, q), &header()).unwrap();
        let (k, b) = encode_user(0, UserBody::Note("x".repeat(8000)));
        w.record(k, &b);
        assert!(w.flush().is_err());
    }

    #[test]
    fn absurd_length_is_refused_without_allocating() {
        let mut bytes = sample(1);
        let hdr_end =
            bytes.len() - (12 + 8 + encode_user(0, UserBody::Note("note 0".into())).1.len());
        bytes[hdr_end + 4..hdr_end + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        let (ts, stop) = notes(&bytes);
        assert!(ts.is_empty());
        assert!(stop.unwrap().reason.contains("exceeds"));
    }

    #[test]
    fn not_a_recording() {
        assert!(matches!(
            Reader::new(&b"hello world, this is text"[..]),
            Err(RecordingError::BadMagic)
        ));
        assert!(matches!(
            Reader::new(&b""[..]),
            Err(RecordingError::BadMagic)
        ));
    }
}
