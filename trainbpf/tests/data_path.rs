//! The collector's data path on a synthetic stream: records drained from
//! the rings in batches (`rings::Batch`), framed and checksummed by the
//! recording's `Writer`, as `record` does in a burst. Counts the heap
//! allocations per record with a counting allocator (this file is its own
//! test binary, and its one test runs alone in it), and prints the time per
//! record.
//!
//! A record's bytes are copied twice on this path: out of the ring into the
//! batch (its slot is given back to the kernel as soon as it is read), and
//! into the frame. The frame goes to `write` as it is, with its head filled
//! in place, and a sealed frame waits for the disk without being copied.
//! Each copy that was taken out came with an allocation of its own (a `Vec`
//! per record out of the ring, a buffer per frame for head and payload), so
//! the allocation count is what this test bounds.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    io::{self, Write},
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Instant,
};

use trainbpf::record::rings::Batch;
use trainbpf_common as common;
use trainbpf_report::{
    decode::pod_bytes,
    recording::{Reader, RecordingHeader, Rewind, Writer},
};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: defers to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        ALLOC_BYTES.fetch_add(l.size() as u64, Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        ALLOC_BYTES.fetch_add(new as u64, Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The rings' batch size and the collector's flush threshold
/// (rings.rs, record/collector.rs).
const BATCH: usize = 4096;
const FLUSH_BYTES: usize = 256 << 10;

/// A file that takes every write and keeps nothing.
#[derive(Default)]
struct Sink {
    bytes: u64,
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Rewind for Sink {}

/// Memory records as two CPUs send them: time stamps slightly out of order
/// between neighbours, and now and then a precious record (an exit).
fn stream(n: usize) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut main = Vec::with_capacity(n);
    let mut precious = Vec::new();
    for i in 0..n as u64 {
        // SAFETY: a plain #[repr(C)] record of integers and byte arrays.
        let mut m: common::MemEvent = unsafe { std::mem::zeroed() };
        m.hdr.kind = common::KIND_MEM;
        m.hdr.tgid = 100 + (i % 8) as u32;
        // Odd records were stamped a little before the even one reserved
        // ahead of them.
        m.hdr.ts_ns = 1_000_000 + i * 1000 - (i % 2) * 1500;
        m.counters[1] = i as i64;
        main.push(pod_bytes(&m));
        if i % 1000 == 999 {
            // SAFETY: as above.
            let mut e: common::ExitEvent = unsafe { std::mem::zeroed() };
            e.hdr.kind = common::KIND_EXIT;
            e.hdr.tgid = 7;
            e.hdr.ts_ns = 1_000_000 + i * 1000 - 200;
            precious.push(pod_bytes(&e));
        }
    }
    (main, precious)
}

/// Drains `main` and `precious` through a batch into `w` as `record` does
/// in a burst: a batch of [`BATCH`] main records (and the precious ones
/// due by then) at a time, a flush past [`FLUSH_BYTES`].
fn collect<W: Write + Rewind>(
    main: &[Vec<u8>],
    precious: &[Vec<u8>],
    batch: &mut Batch,
    w: &mut Writer<W>,
) -> usize {
    let mut n = 0;
    let mut p = precious.iter().peekable();
    let ts = |r: &[u8]| u64::from_le_bytes(r[8..16].try_into().unwrap());
    for chunk in main.chunks(BATCH) {
        let upto = ts(&chunk[chunk.len() - 1]);
        while let Some(r) = p.next_if(|r| ts(r) <= upto) {
            batch.push(r);
        }
        for r in chunk {
            batch.push(r);
        }
        n += batch.hand_on(|b| {
            if let Some(b) = b {
                w.record(u16::from_le_bytes([b[0], b[1]]), b);
            }
        });
        if w.pending() > FLUSH_BYTES {
            w.flush().unwrap();
        }
    }
    for r in p {
        batch.push(r);
    }
    n += batch.hand_on(|b| {
        if let Some(b) = b {
            w.record(u16::from_le_bytes([b[0], b[1]]), b);
        }
    });
    w.flush().unwrap();
    n
}

#[test]
fn records_pass_through_without_an_allocation_each() {
    let (main, precious) = stream(200_000);
    let total = main.len() + precious.len();
    let mut batch = Batch::default();

    // What comes out is every record, in time order, framed whole.
    let mut w = Writer::new(Vec::new(), &RecordingHeader::default()).unwrap();
    assert_eq!(collect(&main, &precious, &mut batch, &mut w), total);
    let file = w.into_inner();
    let mut r = Reader::new(&file[..]).unwrap();
    let (mut n, mut last_ts) = (0, 0);
    while let Some((kind, bytes)) = r.next_raw() {
        let ts = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
        assert_eq!(kind, u16::from_le_bytes([bytes[0], bytes[1]]));
        // Time order within a batch; batches follow each other.
        assert!(ts + 2000 >= last_ts, "record {n}: {ts} after {last_ts}");
        last_ts = ts;
        n += 1;
    }
    assert_eq!(n, total);
    assert!(r.stop().is_none() && r.skipped().count == 0);

    // Warmed up (the batch and the frame at their working size), a second
    // pass of the same stream is counted.
    let mut w = Writer::new(Sink::default(), &RecordingHeader::default()).unwrap();
    collect(&main, &precious, &mut batch, &mut w);
    let (a0, b0) = (ALLOCS.load(Relaxed), ALLOC_BYTES.load(Relaxed));
    let t = Instant::now();
    collect(&main, &precious, &mut batch, &mut w);
    let ns = t.elapsed().as_nanos() as f64 / total as f64;
    let allocs = (ALLOCS.load(Relaxed) - a0) as f64 / total as f64;
    let alloc_bytes = (ALLOC_BYTES.load(Relaxed) - b0) as f64 / total as f64;
    let record_bytes = main[0].len();
    eprintln!(
        "data path: {total} records of {record_bytes} bytes: {allocs:.4} allocations and {alloc_bytes:.1} bytes allocated per record, {ns:.0} ns per record ({} build)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    assert!(w.get_ref().bytes > (total * record_bytes) as u64);
    assert!(
        allocs < 0.01,
        "{allocs:.4} allocations per record: a copy came back"
    );
}
