//! The bounded flight recording (`record --max-size`): when the file nears
//! its bound, older history is downsampled so that the recording can run
//! for days.
//!
//! - Records newer than the full-resolution span are kept as they are.
//! - Older periodic samples ([`recording::is_sample`]: memory, pressure,
//!   USS/PSS, NVML) are folded into buckets (a minute, then ten, then an
//!   hour, step by step as the budget requires): per process and bucket the
//!   last sample stays, with the one of peak resident memory and the one of
//!   peak honest growth; a victim's bucket ends at its kill, so that its
//!   exit record does not take its growth's place. The counters they
//!   carry are absolute (RSS) or cumulative (pages allocated and freed,
//!   stall time), so what stays is exact at the bucket's resolution: the
//!   report reads it like any other.
//! - Everything else is kept whatever its age: kills and OOM context,
//!   deaths and signals, forks, execs and exits, GPU calls and Xids, job
//!   start and end, lost-event counts, names. So are all samples in the
//!   [`PROTECT_NS`] before each OOM kill or SIGKILL, which the report's "who
//!   grew before it" reads.
//!
//! The order of records is kept: pass one reads the file and decides which
//! samples stay (a bit per record), pass two writes them out. The output is
//! a new file; the collector appends the tail written meanwhile and renames
//! it over the recording (`record.rs`), so that a recorder killed at any
//! moment leaves either the old file or the new one, each whole.
//! `compact/flight.rs` is that side: when to compact, on which thread, and
//! the swap.

use std::{
    collections::HashMap,
    io::{self, Read, Write},
};

use trainbpf_report::units::{PROTECT_NS, human_span};
mod flight;
pub use flight::{Flight, FlightOptions};
use trainbpf_report::{
    decode::{self, Compaction, Event, MemSample, UserBody},
    recording::{self, Reader, Rewind, Writer},
};

use crate::util::safe_file::FileError;

/// A bucket is closed once records this much newer have been read (records
/// from different CPUs and from userspace arrive slightly out of order).
const SLACK_NS: u64 = 30 * SEC;
const SEC: u64 = 1_000_000_000;

#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("reading the recording: {0}")]
    Recording(#[from] recording::RecordingError),
    #[error(transparent)]
    File(#[from] FileError),
}

/// One downsampling step: samples older than `older_than_ns` (at compaction
/// time) are folded into buckets of `bucket_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tier {
    pub older_than_ns: u64,
    pub bucket_ns: u64,
}

/// How one compaction folds history. Tiers are ordered by age; the last
/// one that applies wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub tiers: Vec<Tier>,
    /// Samples in the [`PROTECT_NS`] before a kill: kept whole (0), or one
    /// per process per this many ns, with the bucket's peaks.
    pub protect_bucket_ns: u64,
}

impl Policy {
    /// The policies a compaction tries in turn, each stricter than the one
    /// before, until the file fits: first a minute's buckets past the
    /// full-resolution span (ten minutes' past a day); then the windows
    /// before kills go to a second's resolution; then ten minutes' and an
    /// hour's buckets; then the full-resolution span halves, down to a
    /// sixty-fourth of what was asked (the user is told), with the kill
    /// windows at ten seconds'.
    pub fn ladder(full_span_ns: u64) -> Vec<Policy> {
        let span = full_span_ns.max(SEC);
        let day = 24 * 3600 * SEC;
        let tier = |older_than_ns, bucket_s: u64| Tier {
            older_than_ns,
            bucket_ns: bucket_s * SEC,
        };
        let policy = |tiers, protect_s: u64| Policy {
            tiers,
            protect_bucket_ns: protect_s * SEC,
        };
        let mut out = vec![
            policy(vec![tier(span, 60), tier(span.max(day), 600)], 0),
            policy(vec![tier(span, 60), tier(span.max(day), 600)], 1),
            policy(vec![tier(span, 600)], 1),
            policy(vec![tier(span, 3600)], 1),
        ];
        let mut s = span / 2;
        while s >= (span / 64).max(SEC) {
            out.push(policy(vec![tier(s, 3600)], 10));
            s /= 2;
        }
        out
    }

    /// The bucket size for a sample `age_ns` old, or `None` to keep it.
    fn bucket_for(&self, age_ns: u64) -> Option<u64> {
        self.tiers
            .iter()
            .rev()
            .find(|t| age_ns >= t.older_than_ns)
            .map(|t| t.bucket_ns)
    }

    /// Samples this recent are kept whole.
    pub fn full_span_ns(&self) -> u64 {
        self.tiers.first().map_or(u64::MAX, |t| t.older_than_ns)
    }
}

/// What one compaction pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub records_in: u64,
    pub records_out: u64,
    pub samples_folded: u64,
    pub bytes_out: u64,
    /// The compaction record written, cumulative over earlier ones.
    pub compaction: Compaction,
}

/// Which samples share a bucket: one process's memory, or the machine's
/// pressure, USS/PSS round or NVML sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Mem { tgid: u32, start_ns: u64 },
    Other(u16),
}

/// A sample as pass one sees it.
struct SampleInfo {
    ts: u64,
    key: Key,
    /// Resident kB (memory) or cgroup / machine usage kB (pressure).
    resident_kb: u64,
    /// Honest growth so far, kB (memory only).
    net_kb: i64,
}

fn sample_info(kind: u16, bytes: &[u8], page_kb: u64) -> Option<SampleInfo> {
    let t = decode::decode(kind, bytes, page_kb).ok()?;
    let (key, resident_kb, net_kb) = match &t.event {
        Event::Mem(MemSample {
            proc,
            rss,
            alloc_kb,
            freed_kb,
            ..
        }) => (
            Key::Mem {
                tgid: proc.tgid,
                start_ns: proc.start_ns,
            },
            rss.resident_kb(),
            *alloc_kb as i64 - *freed_kb as i64,
        ),
        Event::Pressure(p) => (
            Key::Other(kind),
            p.cgroup
                .as_ref()
                .map_or(p.mem_total_kb.saturating_sub(p.mem_available_kb), |c| {
                    c.usage_kb
                }),
            0,
        ),
        _ => (Key::Other(kind), 0, 0),
    };
    Some(SampleInfo {
        ts: t.ts_ns,
        key,
        resident_kb,
        net_kb,
    })
}

/// The samples a bucket keeps, by record index.
struct Keep {
    last: (u64, u64),
    peak_resident: (u64, u64),
    peak_net: (i64, u64),
}

/// A bit per record: set for samples that stay.
#[derive(Default)]
struct Bits(Vec<u64>);

impl Bits {
    fn set(&mut self, i: u64) {
        let w = (i / 64) as usize;
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << (i % 64);
    }
    fn get(&self, i: u64) -> bool {
        self.0
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
}

/// Adds sample `idx` to its bucket of `bucket` ns.
/// Open buckets: the sample's key, the bucket's size and start, and
/// whether the sample's process was killed at or before it.
type Open = HashMap<(Key, u64, u64, bool), Keep>;

/// `after_kill`: the sample's process was killed at or before it. A bucket
/// of a victim's never spans its kill: its exit record, right after the
/// kill and the bucket's peak and last, took the place of every sample of
/// its growth before it, which the report's growers read (seen in the
/// flight e2e test, at a second's buckets).
fn fold_into(open: &mut Open, bucket: u64, s: &SampleInfo, idx: u64, after_kill: bool) {
    let start = s.ts - s.ts % bucket;
    let k = open
        .entry((s.key, bucket, start, after_kill))
        .or_insert(Keep {
            last: (s.ts, idx),
            peak_resident: (s.resident_kb, idx),
            peak_net: (s.net_kb, idx),
        });
    if s.ts >= k.last.0 {
        k.last = (s.ts, idx);
    }
    if s.resident_kb > k.peak_resident.0 {
        k.peak_resident = (s.resident_kb, idx);
    }
    if s.net_kb > k.peak_net.0 {
        k.peak_net = (s.net_kb, idx);
    }
}

/// Kill-like events that protect the samples before them: when, and the
/// victim's memory samples' key.
fn protects(kind: u16, bytes: &[u8], page_kb: u64) -> Option<(u64, Key)> {
    use trainbpf_common as common;
    let key = |p: &decode::ProcKey| Key::Mem {
        tgid: p.tgid,
        start_ns: p.start_ns,
    };
    match kind {
        common::KIND_OOM_VICTIM | common::KIND_OOM_KILL | common::KIND_SIGNAL => {
            match decode::decode(kind, bytes, page_kb).ok()? {
                decode::Timed {
                    ts_ns,
                    event: Event::Oom(o),
                } => Some((ts_ns, key(&o.victim))),
                decode::Timed {
                    ts_ns,
                    event: Event::Signal(s),
                } if s.sig == 9 => Some((ts_ns, key(&s.target))),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Compacts the recording read (twice: `pass1`, `pass2`, the same bytes)
/// into `out`, as of `now_ns` (CLOCK_MONOTONIC). `max_size` and
/// `bytes_before` only go into the compaction record; `again` says this
/// pass tightens the output of one just made (the same compaction, not
/// another).
#[allow(clippy::too_many_arguments)]
pub fn compact<R1: Read, R2: Read, W: Write + Rewind>(
    pass1: R1,
    pass2: R2,
    out: W,
    policy: &Policy,
    now_ns: u64,
    max_size: u64,
    bytes_before: u64,
    again: bool,
) -> Result<(W, Stats), CompactError> {
    // Pass one: which samples stay, and when the kills were.
    let mut r = Reader::new(pass1)?;
    let page_kb = (r.header().page_size / 1024).max(1);
    // Kept by the sample's own bucket, and by its bucket in a kill's window
    // (which pass one can't place yet: a kill protects what came before).
    let mut keep = Bits::default();
    let mut keep_protected = Bits::default();
    let mut open: Open = HashMap::new();
    let mut open_protected: Open = HashMap::new();
    // Each victim's first kill, by its memory samples' key.
    let mut killed: HashMap<Key, u64> = HashMap::new();
    let mut kills: Vec<u64> = Vec::new();
    let mut prev: Option<Compaction> = None;
    let mut newest = 0u64;
    let mut i = 0u64;
    let close = |open: &mut Open, keep: &mut Bits, before: u64| {
        open.retain(|&(_, bucket, start, _), k| {
            if start + bucket + SLACK_NS > before {
                return true;
            }
            keep.set(k.last.1);
            keep.set(k.peak_resident.1);
            keep.set(k.peak_net.1);
            false
        });
    };
    while let Some((kind, bytes)) = r.next_raw() {
        let idx = i;
        i += 1;
        if kind == decode::KIND_COMPACTED {
            if let Ok(decode::Timed {
                event: Event::Compacted(c),
                ..
            }) = decode::decode(kind, bytes, page_kb)
            {
                prev = Some(c);
            }
            continue;
        }
        if let Some((ts, victim)) = protects(kind, bytes, page_kb) {
            kills.push(ts);
            let at = killed.entry(victim).or_insert(ts);
            *at = (*at).min(ts);
            continue;
        }
        if !recording::is_sample(kind) {
            continue;
        }
        let Some(s) = sample_info(kind, bytes, page_kb) else {
            // Undecodable: kept as it is, like any record pass two can't
            // place.
            keep.set(idx);
            continue;
        };
        newest = newest.max(s.ts);
        let Some(bucket) = policy.bucket_for(now_ns.saturating_sub(s.ts)) else {
            keep.set(idx);
            continue;
        };
        let after_kill = killed.get(&s.key).is_some_and(|&k| s.ts >= k);
        fold_into(&mut open, bucket, &s, idx, after_kill);
        if policy.protect_bucket_ns > 0 {
            let bucket = policy.protect_bucket_ns;
            fold_into(&mut open_protected, bucket, &s, idx, after_kill);
        }
        if idx.is_multiple_of(4096) {
            close(&mut open, &mut keep, newest);
            close(&mut open_protected, &mut keep_protected, newest);
        }
    }
    close(&mut open, &mut keep, u64::MAX);
    close(&mut open_protected, &mut keep_protected, u64::MAX);
    kills.sort_unstable();
    let protected = |ts: u64| {
        let j = kills.partition_point(|&k| k < ts);
        kills.get(j).is_some_and(|&k| k - ts <= PROTECT_NS)
    };

    // Pass two: the same records, less the folded samples, in order.
    let mut r2 = Reader::new(pass2)?;
    let mut w = Writer::new(out, r2.header())?;
    let mut stats = Stats::default();
    let mut j = 0u64;
    while let Some((kind, bytes)) = r2.next_raw() {
        let idx = j;
        j += 1;
        stats.records_in += 1;
        if kind == decode::KIND_COMPACTED {
            continue;
        }
        if recording::is_sample(kind) && !keep.get(idx) {
            let ts = decode::decode(kind, bytes, page_kb).map_or(0, |t| t.ts_ns);
            let stays = protected(ts) && (policy.protect_bucket_ns == 0 || keep_protected.get(idx));
            if !stays {
                stats.samples_folded += 1;
                continue;
            }
        }
        w.record(kind, bytes);
        stats.records_out += 1;
        if w.pending() >= 1 << 20 {
            w.flush()?;
        }
    }
    let mut c = prev.unwrap_or_default();
    if !again {
        c.count += 1;
    }
    c.full_from_ns = now_ns.saturating_sub(policy.full_span_ns());
    c.tiers = policy
        .tiers
        .iter()
        .map(|t| [t.older_than_ns / SEC, t.bucket_ns / SEC])
        .collect();
    c.kill_window_bucket_s = policy.protect_bucket_ns / SEC;
    c.samples_folded += stats.samples_folded;
    c.bytes_before = bytes_before;
    c.max_size = max_size;
    w.flush_now()?;
    c.bytes_after = w.bytes_written();
    let (kind, bytes) = decode::encode_user(now_ns, UserBody::Compacted(c.clone()));
    w.record(kind, &bytes);
    stats.records_out += 1;
    w.flush_now()?;
    if w.held_bytes() > 0 {
        return Err(CompactError::Io(io::Error::other(
            "the disk is full: the compacted recording could not be written",
        )));
    }
    stats.bytes_out = w.bytes_written();
    stats.compaction = c;
    Ok((w.into_inner(), stats))
}

fn human_bytes(b: u64) -> String {
    trainbpf_report::units::human_bytes_kib(b)
}

#[cfg(test)]
mod tests;
