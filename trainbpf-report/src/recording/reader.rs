//! Reading a recording: frames checked by their CRC, a damaged frame in
//! the middle stepped over (and noted), a damaged tail the end.

use std::io::{self, Read};

use serde::Serialize;

use super::{
    FRAME_MAGIC, MAGIC, MAX_FRAME, MAX_HEADER, RecordingError, RecordingHeader, VERSION, crc,
    window::{READ_CHUNK, Window},
};
use crate::decode::{self, Timed};

/// Where and why reading stopped before the end of the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stop {
    /// Byte offset of the first unreadable frame.
    pub(crate) offset: u64,
    pub(crate) reason: String,
}

/// A damaged stretch in the middle of a recording that the reader stepped
/// over: it scanned forward to the next frame whose magic, length and CRC
/// check out, and went on from there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Skip {
    /// Byte offset where the damage starts (the first frame that failed).
    pub(crate) offset: u64,
    /// Bytes skipped, up to the next good frame.
    pub(crate) bytes: u64,
    /// Why the first frame of the stretch was refused.
    pub(crate) reason: String,
}

/// Every damaged stretch the reader skipped. The list keeps the first
/// [`MAX_SKIPS`]; the counts cover all of them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub(crate) ranges: Vec<Skip>,
    /// Stretches skipped, listed or not.
    pub count: u64,
    /// Bytes in all of them.
    pub(crate) bytes: u64,
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
    pub(crate) frames: u64,
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
    use super::super::{Reader, Writer, testdata::*};
    use super::*;
    use crate::decode::{Event, UserBody, encode_user};

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
