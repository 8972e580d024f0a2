//! Writing a recording: records into frames, frames to the file, and
//! what happens when the disk is full (frames held in memory, samples
//! dropped first, writing resumed when room comes back).

use std::io::{self, Write};

use bytes::{BufMut, BytesMut};

use super::{FRAME_MAGIC, MAGIC, RecordingError, RecordingHeader, VERSION, crc};
use crate::decode;

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
pub(crate) const BACKLOG_LIMIT: usize = 64 << 20;
/// A frame is sealed once its payload reaches this size, so that a nearly
/// full disk still takes whole frames up to its last free bytes and a torn
/// write costs at most this much.
pub(crate) const SEAL_FRAME_AT: usize = 64 << 10;
/// A frame's head: magic, payload length, payload CRC.
const HEAD: usize = 12;
/// Frames are built in buffers of this size, several to a buffer: a frame
/// sealed in a burst is split off it (no copy) to wait for the flush, the
/// next one is built behind it, and once the frames it holds are written
/// and dropped the buffer is used again from the start.
const BUFFER: usize = 5 * SEAL_FRAME_AT;
/// Room a frame starts with: a full frame and a record past the seal.
const FRAME_ROOM: usize = SEAL_FRAME_AT + (8 << 10);
/// How often a held-back frame is offered to the disk again.
pub(crate) const RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

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

/// A frame waiting for the disk: room for its head, then its payload. It
/// shares its buffer with the frames built after it.
struct Held {
    frame: BytesMut,
    /// Its samples were already dropped.
    thinned: bool,
}

impl Held {
    fn new(frame: BytesMut) -> Held {
        Held {
            frame,
            thinned: false,
        }
    }

    fn payload_len(&self) -> usize {
        self.frame.len() - HEAD
    }
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
    /// The current frame: room for its head, filled in when it is written,
    /// then the records.
    frame: BytesMut,
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
            frame: new_frame(),
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
    #[cfg(test)]
    pub(crate) fn set_backlog(&mut self, limit: usize, retry_every: std::time::Duration) {
        self.limit = limit;
        self.retry_every = retry_every;
    }

    /// Seals frames at `bytes` of payload rather than [`SEAL_FRAME_AT`]
    /// (tests that need big frames).
    #[cfg(test)]
    pub(crate) fn set_frame_size(&mut self, bytes: usize) {
        self.seal_at = bytes;
    }

    /// Adds one record to the current frame.
    pub fn record(&mut self, kind: u16, bytes: &[u8]) {
        let mut head = [0u8; 8];
        head[..2].copy_from_slice(&kind.to_le_bytes());
        head[4..].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.frame.extend_from_slice(&head);
        self.frame.extend_from_slice(bytes);
        if self.payload_len() >= self.seal_at {
            // Sealed frames queue behind any held ones and go out at the
            // next flush, in order.
            self.hold_frame();
        }
    }

    fn payload_len(&self) -> usize {
        self.frame.len() - HEAD
    }

    /// Moves the current frame to the back of the held ones, and starts the
    /// next behind it in the same buffer.
    fn hold_frame(&mut self) {
        let frame = self.frame.split();
        start_frame(&mut self.frame);
        let held = Held::new(frame);
        self.held_bytes += held.payload_len();
        self.held.push_back(held);
    }

    /// Bytes waiting for the next flush: the current frame and, unless the
    /// disk is failing (when they wait for the retry), the frames sealed
    /// since the last flush.
    pub fn pending(&self) -> usize {
        self.payload_len() + if self.failing { 0 } else { self.held_bytes }
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
        if self.payload_len() > 0 {
            if self.held.is_empty() {
                match self.write_frame(None) {
                    Ok(()) => {
                        self.frame.truncate(HEAD);
                        // Keep the buffer from holding on to a big record's
                        // peak forever.
                        if self.frame.capacity() > 1 << 20 {
                            self.frame = new_frame();
                        }
                    }
                    Err(e) => self.fail(e)?,
                }
                if self.held.is_empty() {
                    return Ok(());
                }
            } else {
                self.hold_frame();
            }
        }
        if self.held.is_empty() {
            return Ok(());
        }
        if self.retry_at.is_none_or(|t| std::time::Instant::now() >= t) {
            while let Some(h) = self.held.front() {
                let len = h.payload_len();
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
        let frame = match held {
            None => &mut self.frame,
            Some(i) => &mut self.held[i].frame,
        };
        // The head goes in the room left for it: one write for head and
        // payload, without copying the payload to put the head before it.
        // A crash leaves a frame whole or visibly short, never a valid head
        // over a stale payload.
        let (head, payload) = frame.split_at_mut(HEAD);
        head[..4].copy_from_slice(FRAME_MAGIC);
        head[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        head[8..].copy_from_slice(&crc(payload).to_le_bytes());
        self.out.write_all(frame)?;
        self.out.flush()?;
        self.bytes_written += frame.len() as u64;
        Ok(())
    }

    /// The current frame's write failed: undo what got out, and hold it.
    fn fail(&mut self, e: io::Error) -> io::Result<()> {
        self.rewind(e)?;
        self.hold_frame();
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
                        self.payload_len()
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
            let before = h.payload_len();
            self.dropped += thin(&mut h.frame);
            h.thinned = true;
            self.held_bytes -= before - h.payload_len();
        }
        while self.held_bytes > 2 * self.limit && self.held.len() > 1 {
            let h = self.held.pop_front().expect("not empty");
            self.held_bytes -= h.payload_len();
            self.dropped += count_records(&h.frame[HEAD..]);
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

/// A buffer for frames, with the first one started.
fn new_frame() -> BytesMut {
    let mut frame = BytesMut::with_capacity(BUFFER);
    frame.put_bytes(0, HEAD);
    frame
}

/// Starts a frame in `buf` (empty: the last frame was split off it), in
/// what is left of its buffer when a whole frame fits there. Otherwise in
/// a new buffer, or in the same one from its start when the frames split
/// off it were all written: `reserve` reclaims it then, and nothing is
/// copied either way (`buf` is empty).
fn start_frame(buf: &mut BytesMut) {
    debug_assert!(buf.is_empty());
    if buf.capacity() < FRAME_ROOM {
        buf.reserve(BUFFER);
    }
    buf.put_bytes(0, HEAD);
}

/// Drops the samples from a frame (head room and payload); returns how
/// many. What is kept gets a buffer of its own, of its size: the frame's
/// buffer may be shared, and a thinned frame can wait long for the disk.
fn thin(frame: &mut BytesMut) -> u64 {
    let payload = &frame[HEAD..];
    let kept_len: usize = records(payload)
        .filter(|(kind, _)| !is_sample(*kind))
        .map(|(_, r)| r.len())
        .sum();
    let mut kept = BytesMut::with_capacity(HEAD + kept_len);
    kept.put_bytes(0, HEAD);
    let mut dropped = 0;
    for (kind, r) in records(payload) {
        if is_sample(kind) {
            dropped += 1;
        } else {
            kept.extend_from_slice(&payload[r]);
        }
    }
    *frame = kept;
    dropped
}

fn count_records(payload: &[u8]) -> u64 {
    records(payload).count() as u64
}

/// Each record in a payload: its kind, and where it is (its own header
/// included), cut at the payload's end.
fn records(payload: &[u8]) -> impl Iterator<Item = (u16, std::ops::Range<usize>)> {
    let mut p = 0;
    std::iter::from_fn(move || {
        if p + 8 > payload.len() {
            return None;
        }
        let kind = u16::from_le_bytes([payload[p], payload[p + 1]]);
        let len = u32::from_le_bytes(payload[p + 4..p + 8].try_into().unwrap()) as usize;
        let end = (p + 8 + len).min(payload.len());
        let r = p..end;
        p = end;
        Some((kind, r))
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Reader, Writer, testdata::*};
    use super::*;
    use crate::decode::{UserBody, encode_user};

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
}
