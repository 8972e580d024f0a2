//! The collector's two ring buffers: `EVENTS` (memory, lifecycle, GPU) and
//! `PRECIOUS` (kills, deaths, signals, the kernel's OOM lines; see
//! `trainbpf_common::is_precious`). The precious ring is read first on every
//! pass, and each pass hands the records on in time order, so that the
//! recording reads as if there were one ring.

use std::io;

use aya::maps::{MapData, RingBuf};
use tokio::io::{Interest, unix::AsyncFd};

/// Records taken from the main ring in one batch: bounds the collector's
/// memory while a burst keeps the ring full.
const BATCH: usize = 4096;

pub struct Rings {
    main: AsyncFd<RingBuf<MapData>>,
    precious: AsyncFd<RingBuf<MapData>>,
    batch: Vec<Vec<u8>>,
}

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
            batch: Vec::new(),
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
    pub fn drain(&mut self, mut f: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        loop {
            self.batch.clear();
            let precious = self.precious.get_mut();
            while let Some(item) = precious.next() {
                self.batch.push(item.to_vec());
            }
            let main = self.main.get_mut();
            let mut from_main = 0;
            while from_main < BATCH
                && let Some(item) = main.next()
            {
                self.batch.push(item.to_vec());
                from_main += 1;
            }
            // Each ring is in reserve order; the two together are put in
            // time order (stable: equal stamps keep their ring order).
            self.batch.sort_by_key(|b| ts_of(b));
            for b in &self.batch {
                f(b);
            }
            n += self.batch.len();
            if from_main < BATCH {
                return n;
            }
        }
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
        assert_eq!(ts_of(&crate::decode::pod_bytes(&h)), 0x0102_0304_0506_0708);
        assert_eq!(ts_of(&[1, 2, 3]), 0);
    }
}
