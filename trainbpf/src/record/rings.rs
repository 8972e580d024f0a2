//! The collector's two ring buffers: `EVENTS` (memory, lifecycle, GPU) and
//! `PRECIOUS` (kills, deaths, signals, the kernel's OOM lines; see
//! `trainbpf_common::is_precious`). The precious ring is read first on every
//! pass, and each pass hands the records on in time order, so that the
//! recording reads as if there were one ring.

use std::io;

use aya::maps::{MapData, RingBuf};
use bytes::{Bytes, BytesMut};
use tokio::io::{Interest, unix::AsyncFd};

/// Records taken from the main ring in one batch: bounds the collector's
/// memory while a burst keeps the ring full.
const BATCH: usize = 4096;

pub struct Rings {
    main: AsyncFd<RingBuf<MapData>>,
    precious: AsyncFd<RingBuf<MapData>>,
    batch: Batch,
    /// Precious records read while a batch was handed on: the next's.
    stash: Vec<Vec<u8>>,
}

/// While a batch is handed on, the precious ring is looked at after this
/// many records: a kill that comes meanwhile is not left behind them.
const LOOK_EVERY: usize = 64;

impl Rings {
    /// Must be called inside the tokio runtime.
    pub fn new(main: RingBuf<MapData>, precious: RingBuf<MapData>) -> io::Result<Rings> {
        // SAFETY: each fd is owned by the ring moved in, and stays open
        // until the AsyncFd (and its registration) is dropped.
        let main = unsafe { AsyncFd::register_with_interest(main, Interest::READABLE) }
            .map_err(io::Error::from)?;
        // SAFETY: as above.
        let precious = unsafe { AsyncFd::register_with_interest(precious, Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Rings {
            main,
            precious,
            batch: Batch::default(),
            stash: Vec::new(),
        })
    }

    /// Waits until either ring has records. Readiness is cleared before the
    /// caller drains, so that a record submitted during the drain wakes the
    /// next wait instead of being left for the tick.
    pub async fn readable(&mut self) -> io::Result<()> {
        tokio::select! {
            biased;
            g = self.precious.readable_mut() => g?.clear_ready(),
            g = self.main.readable_mut() => g?.clear_ready(),
        }
        Ok(())
    }

    /// Hands every record in both rings to `f`, precious ring first, in
    /// batches sorted by the kernel's timestamp. Returns how many.
    ///
    /// Each precious record is also shown to `f` as it is read, with
    /// `urgent` set, before the batch is sorted and handed on: what must
    /// not wait behind a batch of memory records (torchelastic's error
    /// file at a kill races the victim's reaping) is done there.
    pub fn drain(&mut self, mut f: impl FnMut(&[u8], bool)) -> usize {
        let mut n = 0;
        let Rings {
            main,
            precious,
            batch,
            stash,
        } = self;
        loop {
            for item in stash.drain(..) {
                batch.push(&item);
            }
            let p = precious.get_mut();
            while let Some(item) = p.next() {
                f(&item, true);
                batch.push(&item);
            }
            let m = main.get_mut();
            let mut from_main = 0;
            while from_main < BATCH
                && let Some(item) = m.next()
            {
                batch.push(&item);
                from_main += 1;
            }
            n += batch.hand_on(|record| match record {
                Some(b) => f(b, false),
                // A look at the precious ring between records: what came
                // is shown now and handed on with the next batch.
                None => {
                    let p = precious.get_mut();
                    while let Some(item) = p.next() {
                        f(&item, true);
                        stash.push(item.to_vec());
                    }
                }
            });
            if from_main < BATCH && stash.is_empty() {
                return n;
            }
        }
    }
}

/// One pass's records, copied out of the rings (a ring's slot is given back
/// to the kernel as soon as its record is read) and put in time order.
///
/// Each record is copied once, into a shared buffer, and split off it as a
/// `Bytes` of its own: no allocation per record. Once the batch has been
/// handed on and its records dropped, the buffer is used again from its
/// start.
#[derive(Default)]
pub struct Batch {
    buf: BytesMut,
    /// Time stamp, arrival order, record.
    records: Vec<(u64, u32, Bytes)>,
}

/// The batch's buffer grows by this much at a time (some 1,700 memory
/// records); it is reused, not freed, between batches.
const BUFFER: usize = 256 << 10;

impl Batch {
    pub fn push(&mut self, record: &[u8]) {
        if self.buf.capacity() < record.len() {
            // Empty (the records before were split off): a new buffer, or
            // the old one again once nothing holds its records; no copy.
            self.buf.reserve(BUFFER.max(record.len()));
        }
        self.buf.extend_from_slice(record);
        let seq = self.records.len() as u32;
        self.records
            .push((ts_of(record), seq, self.buf.split().freeze()));
    }

    /// Hands the records to `f` in time order and empties the batch;
    /// returns how many. `f(None)` every [`LOOK_EVERY`] records: a look
    /// elsewhere between them.
    pub fn hand_on(&mut self, mut f: impl FnMut(Option<&[u8]>)) -> usize {
        // Each ring is in reserve order; the two together are put in
        // time order. Stable (equal stamps keep their ring order) by the
        // arrival order in the key, without a stable sort's scratch buffer.
        self.records.sort_unstable_by_key(|&(ts, seq, _)| (ts, seq));
        for (i, (_, _, b)) in self.records.iter().enumerate() {
            if i > 0 && i % LOOK_EVERY == 0 {
                f(None);
            }
            f(Some(b));
        }
        let n = self.records.len();
        self.records.clear();
        // Nothing holds the records now: the next batch starts at the
        // buffer's start, so that a quiet job's few records a pass keep
        // to its first pages.
        let _ = self.buf.try_reclaim(BUFFER);
        n
    }
}

/// `Header::ts_ns` of a kernel record; 0 for one too short to have it (the
/// collector counts those as undecodable).
fn ts_of(bytes: &[u8]) -> u64 {
    bytes
        .get(8..16)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_is_read_from_the_header() {
        let h = trainbpf_common::Header {
            kind: 3,
            flags: 0,
            tgid: 9,
            ts_ns: 0x0102_0304_0506_0708,
            start_ns: 1,
        };
        assert_eq!(
            ts_of(&trainbpf_report::decode::pod_bytes(&h)),
            0x0102_0304_0506_0708
        );
        assert_eq!(ts_of(&[1, 2, 3]), 0);
    }

    #[test]
    fn a_batch_is_handed_on_in_time_order_equal_stamps_in_arrival_order() {
        let rec = |ts: u64, tag: u8| {
            let mut b = vec![tag; 128];
            b[8..16].copy_from_slice(&ts.to_le_bytes());
            b
        };
        let mut batch = Batch::default();
        // More than one buffer's worth, so that records span buffers.
        let mut want = Vec::new();
        for i in 0..3000u64 {
            let ts = 1000 - i % 7;
            batch.push(&rec(ts, (i % 251) as u8));
            want.push((ts, i));
        }
        batch.push(&[9; 3]);
        want.sort_by_key(|&(ts, _)| ts);
        let mut got = Vec::new();
        let mut looks = 0;
        assert_eq!(
            batch.hand_on(|b| match b {
                Some(b) => got.push(b.to_vec()),
                None => looks += 1,
            }),
            3001
        );
        assert_eq!(
            looks,
            3000 / LOOK_EVERY,
            "a look every {LOOK_EVERY} records"
        );
        assert_eq!(got[0], [9; 3], "too short for a stamp: first");
        for (g, (ts, i)) in got[1..].iter().zip(want) {
            assert_eq!(*g, rec(ts, (i % 251) as u8));
        }
        // Empty after, and reusable from the buffer's start.
        assert_eq!(batch.hand_on(|_| panic!()), 0);
        batch.push(&rec(5, 1));
        let first = batch.records[0].2.as_ptr();
        assert_eq!(batch.hand_on(|b| assert_eq!(b, Some(&rec(5, 1)[..]))), 1);
        batch.push(&rec(6, 2));
        assert_eq!(batch.records[0].2.as_ptr(), first, "the same bytes again");
    }
}
