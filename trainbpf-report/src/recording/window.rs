//! The reader's read-ahead window, built so that reading costs time linear
//! in the file's size whatever its bytes claim.
//!
//! After damage the reader tries a candidate frame at every "TBFR", and a
//! candidate's claimed payload (up to 16 MiB) overlaps the next candidates'.
//! CRC-ing each candidate's payload afresh, or moving the window's bytes to
//! the front for each, costs that length again per candidate: a file made of
//! fake frame heads took minutes. So:
//!
//! - the CRC of any span is derived from checkpoints of the running CRC,
//!   one every [`MARK_EVERY`] bytes, with CRC-32's combine rule
//!   `crc(b) = crc(a ‖ b) ^ shift(crc(a), len(b))`: each byte goes through
//!   the CRC once between two moves of the buffer, and a candidate costs
//!   two partial checkpoints and one shift;
//! - bytes are moved to the front only once at least a quarter as many have
//!   been consumed since the last move, so moving costs at most four bytes
//!   per byte consumed, and the buffer stays within 1.25 frames.
//!
//! `work` counts every byte read, scanned, moved or checksummed, so that
//! tests can bound the cost per byte without timing anything.

use std::io::{self, Read};

/// Bytes read from the input at a time.
pub(super) const READ_CHUNK: usize = 64 << 10;

/// Bytes between two checkpoints of the running CRC.
const MARK_EVERY: usize = 128;

/// What one CRC shift (about 25 carry-less 32-bit multiplies) counts for in
/// [`Window::work`].
const SHIFT_WORK: u64 = 64;

/// A read-ahead window over the input. It holds at most 1.25 frames plus one
/// read chunk, so it stays bounded by [`super::MAX_FRAME`] whatever the
/// input says.
pub(super) struct Window<R: Read> {
    input: R,
    /// Storage; `buf[start..end]` are the unconsumed bytes.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// File offset of `buf[start]`.
    pub(super) offset: u64,
    eof: bool,
    /// `marks[j]` is the CRC-32 of `buf[..j * MARK_EVERY]`; computed as far
    /// as a CRC needed them, and dropped when the bytes move.
    marks: Vec<u32>,
    work: u64,
}

impl<R: Read> Window<R> {
    pub(super) fn new(input: R, offset: u64) -> Self {
        Window {
            input,
            buf: Vec::new(),
            start: 0,
            end: 0,
            offset,
            eof: false,
            marks: Vec::new(),
            work: 0,
        }
    }

    pub(super) fn avail(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Bytes read, scanned, moved or checksummed so far.
    pub(super) fn work(&self) -> u64 {
        self.work
    }

    /// Counts `n` bytes examined by the caller (a scan for a magic).
    pub(super) fn examined(&mut self, n: usize) {
        self.work += n as u64;
    }

    /// Reads until `n` bytes are available or the input ends; returns how
    /// many are available.
    pub(super) fn fill(&mut self, n: usize) -> io::Result<usize> {
        let avail = self.end - self.start;
        if avail >= n || self.eof {
            return Ok(avail);
        }
        // Move to the front only what a quarter of it has been consumed
        // for since the last move; otherwise grow.
        if self.start + n > self.buf.len() && self.start * 4 >= avail {
            self.buf.copy_within(self.start..self.end, 0);
            self.work += avail as u64;
            self.end = avail;
            self.start = 0;
            self.marks.clear();
        }
        while self.end - self.start < n && !self.eof {
            if self.end == self.buf.len() {
                // Grow as bytes arrive, not as a length claims: a damaged
                // length over a short input costs no big allocation.
                let want = (self.start + n).max(READ_CHUNK);
                let grow = (self.buf.len() * 2).clamp(READ_CHUNK, want);
                // Zeroing the new room; a move to new storage is amortised by
                // the Vec's own doubling.
                self.work += (grow - self.buf.len()) as u64;
                self.buf.resize(grow, 0);
            }
            match self.input.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => {
                    self.end += k;
                    self.work += k as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.end - self.start)
    }

    pub(super) fn consume(&mut self, n: usize) {
        let n = n.min(self.end - self.start);
        self.start += n;
        self.offset += n as u64;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            self.marks.clear();
            // Keep a big frame's (or a damaged length's) peak from staying.
            if self.buf.len() > 1 << 20 {
                self.buf.truncate(READ_CHUNK);
                self.buf.shrink_to_fit();
            }
        }
    }

    /// CRC-32 of `avail()[from..to]`, which must be filled.
    pub(super) fn crc(&mut self, from: usize, to: usize) -> u32 {
        let (a, b) = (self.start + from, self.start + to);
        debug_assert!(a <= b && b <= self.end);
        let before = self.prefix(a);
        let through = self.prefix(b);
        self.work += SHIFT_WORK;
        through ^ shift(before, (b - a) as u64)
    }

    /// CRC-32 of `buf[..p]`.
    fn prefix(&mut self, p: usize) -> u32 {
        let j = p / MARK_EVERY;
        if self.marks.is_empty() {
            self.marks.push(0);
        }
        while self.marks.len() <= j {
            let k = self.marks.len();
            let span = &self.buf[(k - 1) * MARK_EVERY..k * MARK_EVERY];
            let mut h = crc32fast::Hasher::new_with_initial(self.marks[k - 1]);
            h.update(span);
            self.marks.push(h.finalize());
            self.work += MARK_EVERY as u64;
        }
        let mut h = crc32fast::Hasher::new_with_initial(self.marks[j]);
        h.update(&self.buf[j * MARK_EVERY..p]);
        self.work += (p - j * MARK_EVERY) as u64;
        h.finalize()
    }
}

/// `crc` followed by `n` zero bytes' worth of shifting: the CRC-32 of `a`
/// carried past a span of `n` bytes, as in zlib's `crc32_combine`.
fn shift(crc: u32, n: u64) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial_len(crc, 0);
    h.combine(&crc32fast::Hasher::new_with_initial_len(0, n));
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_crcs_match_a_direct_crc_wherever_the_marks_fall() {
        let data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut w = Window::new(&data[..], 0);
        assert_eq!(w.fill(data.len()).unwrap(), data.len());
        for (a, b) in [
            (0, 0),
            (0, 1),
            (3, 3),
            (0, 128),
            (1, 129),
            (127, 4999),
            (200, 5000),
            (4999, 5000),
        ] {
            assert_eq!(w.crc(a, b), crc32fast::hash(&data[a..b]), "{a}..{b}");
        }
        // After consuming, spans are relative to the new start and the
        // checkpoints still hold.
        w.consume(77);
        assert_eq!(w.crc(10, 400), crc32fast::hash(&data[87..477]));
    }

    #[test]
    fn span_crcs_survive_moves_and_growth() {
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| (i % 251) as u8 ^ (i >> 9) as u8)
            .collect();
        let mut w = Window::new(&data[..], 0);
        let mut at = 0usize;
        while at + 70_000 < data.len() {
            assert!(w.fill(70_000).unwrap() >= 70_000);
            assert_eq!(
                w.crc(5, 69_999),
                crc32fast::hash(&data[at + 5..at + 69_999])
            );
            w.consume(30_001);
            at += 30_001;
        }
    }

    /// Reads `bytes`: the notes' times, the stretches skipped, the work.
    fn read(bytes: &[u8]) -> (Vec<u64>, u64, u64) {
        let mut r = super::super::Reader::new(bytes).unwrap();
        let ts = r.by_ref().map(|t| t.ts_ns).collect();
        assert!(r.stop().is_none(), "{:?}", r.stop());
        (ts, r.skipped().count, r.work())
    }

    #[test]
    fn fake_frame_heads_cost_work_linear_in_the_size() {
        use crate::fuzzing::{LAST_NOTE_NS, fake_frame_heads};
        let mut per_byte = Vec::new();
        for size in [1 << 20, 8 << 20] {
            let bytes = fake_frame_heads(size);
            let (ts, skipped, work) = read(&bytes);
            // Every good frame is found among the fake heads.
            assert_eq!(ts.first(), Some(&0));
            assert_eq!(ts.last(), Some(&LAST_NOTE_NS));
            assert!(ts.windows(2).all(|w| w[1] > w[0]));
            assert_eq!(skipped, ts.len() as u64 - 1);
            per_byte.push(work as f64 / bytes.len() as f64);
            eprintln!(
                "{} bytes: work {work} ({:.1}/byte)",
                bytes.len(),
                per_byte.last().unwrap()
            );
        }
        // Quadratic work would be 8 times as much per byte at 8 MiB.
        assert!(per_byte[1] < 2.0 * per_byte[0], "{per_byte:?}");
        assert!(per_byte[1] < 64.0, "{per_byte:?}");
    }

    #[test]
    fn a_plain_recording_costs_a_few_passes() {
        let mut w = crate::recording::Writer::new(Vec::new(), &Default::default()).unwrap();
        for i in 0..20_000u64 {
            let (k, b) =
                crate::decode::encode_user(i, crate::decode::UserBody::Note("x".repeat(200)));
            w.record(k, &b);
        }
        w.flush().unwrap();
        let bytes = w.get_ref().clone();
        let (ts, skipped, work) = read(&bytes);
        assert_eq!((ts.len(), skipped), (20_000, 0));
        let per_byte = work as f64 / bytes.len() as f64;
        eprintln!("{} bytes: work {work} ({per_byte:.1}/byte)", bytes.len());
        assert!(per_byte < 4.0, "{per_byte}");
    }
}
