//! The recording file: one writer, one reader. Format: docs/recording-format.md.
//!
//! ```text
//! file   = magic "TRAINBPF" | version u32 | header_len u32 | header JSON | header crc32 u32 | frame*
//! frame  = "TBFR" | payload_len u32 | payload crc32 u32 | payload
//! payload = record*
//! record = kind u16 | reserved u16 | len u32 | bytes[len]
//! ```
//! All integers little-endian. The writer appends whole frames and never
//! rewrites, so a recorder killed mid-write leaves every earlier frame intact;
//! the reader stops at the first frame that is short or fails its CRC, and
//! says where.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use crate::decode::{self, Timed};

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

/// Appends records in frames. Callers decide when a frame ends (`flush`);
/// the collector does so at least every second, which bounds what a crash
/// can lose.
pub struct Writer<W: Write> {
    out: W,
    frame: Vec<u8>,
    bytes_written: u64,
}

impl<W: Write> Writer<W> {
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
        })
    }

    /// Adds one record to the current frame.
    pub fn record(&mut self, kind: u16, bytes: &[u8]) {
        self.frame.extend_from_slice(&kind.to_le_bytes());
        self.frame.extend_from_slice(&0u16.to_le_bytes());
        self.frame
            .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.frame.extend_from_slice(bytes);
    }

    /// Bytes waiting in the current frame.
    pub fn pending(&self) -> usize {
        self.frame.len()
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Ends the current frame and writes it whole.
    pub fn flush(&mut self) -> io::Result<()> {
        if self.frame.is_empty() {
            return Ok(());
        }
        let mut head = [0u8; 12];
        head[..4].copy_from_slice(FRAME_MAGIC);
        head[4..8].copy_from_slice(&(self.frame.len() as u32).to_le_bytes());
        head[8..].copy_from_slice(&crc(&self.frame).to_le_bytes());
        // One write for head and payload: a crash leaves a frame whole or
        // visibly short, never a valid head over a stale payload.
        let mut buf = Vec::with_capacity(12 + self.frame.len());
        buf.extend_from_slice(&head);
        buf.extend_from_slice(&self.frame);
        self.out.write_all(&buf)?;
        self.out.flush()?;
        self.bytes_written += buf.len() as u64;
        self.frame.clear();
        // Keep the buffer from holding on to a burst's peak forever.
        if self.frame.capacity() > 1 << 20 {
            self.frame.shrink_to(64 << 10);
        }
        Ok(())
    }

    pub fn get_ref(&self) -> &W {
        &self.out
    }
}

/// Where and why reading stopped before the end of the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stop {
    /// Byte offset of the first unreadable frame.
    pub offset: u64,
    pub reason: String,
}

/// Streams records out of a recording; memory stays at one frame.
pub struct Reader<R: Read> {
    input: R,
    header: RecordingHeader,
    offset: u64,
    frame: Vec<u8>,
    pos: usize,
    stop: Option<Stop>,
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
            input,
            header,
            offset: 16 + len as u64 + 4,
            frame: Vec::new(),
            pos: 0,
            stop: None,
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

    /// Loads the next frame; false at the end or at damage.
    fn next_frame(&mut self) -> bool {
        if self.stop.is_some() {
            return false;
        }
        let mut head = [0u8; 12];
        match read_exact_or(&mut self.input, &mut head) {
            Ok(()) => {}
            Err(Short::Eof(0)) => return false,
            Err(Short::Eof(n)) => {
                return self.halt(format!("file ends inside a frame header ({n} of 12 bytes)"));
            }
            Err(Short::Io(e)) => return self.halt(format!("read error: {e}")),
        }
        if &head[..4] != FRAME_MAGIC {
            return self.halt("bad frame magic".into());
        }
        let len = u32::from_le_bytes(head[4..8].try_into().unwrap());
        let want = u32::from_le_bytes(head[8..12].try_into().unwrap());
        if len > MAX_FRAME {
            return self.halt(format!(
                "frame length {len} exceeds the {MAX_FRAME}-byte limit"
            ));
        }
        self.frame.resize(len as usize, 0);
        match read_exact_or(&mut self.input, &mut self.frame) {
            Ok(()) => {}
            Err(Short::Eof(n)) => {
                return self.halt(format!("file ends inside a frame ({n} of {len} bytes)"));
            }
            Err(Short::Io(e)) => return self.halt(format!("read error: {e}")),
        }
        if crc(&self.frame) != want {
            return self.halt("frame checksum mismatch".into());
        }
        self.offset += 12 + len as u64;
        self.pos = 0;
        self.frames += 1;
        true
    }

    fn halt(&mut self, reason: String) -> bool {
        self.stop = Some(Stop {
            offset: self.offset,
            reason,
        });
        self.frame.clear();
        false
    }

    /// The next raw record: (kind, bytes).
    pub fn next_raw(&mut self) -> Option<(u16, &[u8])> {
        loop {
            if self.pos + 8 <= self.frame.len() {
                let p = self.pos;
                let kind = u16::from_le_bytes(self.frame[p..p + 2].try_into().unwrap());
                let len = u32::from_le_bytes(self.frame[p + 4..p + 8].try_into().unwrap()) as usize;
                if p + 8 + len > self.frame.len() {
                    // The CRC matched, so the writer itself wrote this: a bug,
                    // not damage. Skip the rest of the frame, and count it.
                    self.undecodable += 1;
                    self.pos = self.frame.len();
                    continue;
                }
                self.pos = p + 8 + len;
                return Some((kind, &self.frame[p + 8..p + 8 + len]));
            }
            if !self.next_frame() {
                return None;
            }
        }
    }
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
