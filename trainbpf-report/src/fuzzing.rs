//! The recording decoder under arbitrary input (docs/fuzzing.md).
//!
//! [`check`] is the one harness: the cargo-fuzz target in `fuzz/`, the
//! deterministic mutation test below and `cargo xtask fuzz` all drive it. It
//! runs the bytes through everything `trainbpf report` does (reader,
//! decoder, model, every renderer), twice: as they are, which tests the
//! framing and the resynchronisation over damage, and with every checksum
//! made right ([`fix_checksums`]), so that mutations inside a frame reach the
//! decoder and the model instead of stopping at a CRC.
//!
//! Nothing here may panic or allocate without bound, whatever the bytes.

use serde_json::json;
use trainbpf_common as c;

use crate::{
    decode::{self, pod_bytes},
    pipeline,
    recording::{FRAME_MAGIC, MAGIC, MAX_FRAME, RecordingHeader, VERSION, Writer},
    render,
};

/// Runs `data` through the whole report pipeline, as is and with its
/// checksums fixed.
pub fn check(data: &[u8]) {
    pipeline(data);
    pipeline(&fix_checksums(data));
}

fn pipeline(data: &[u8]) {
    let Ok(report) = pipeline::build(data, pipeline::WINDOW) else {
        return;
    };
    let _ = render::json::render(&report);
    let _ = render::text::render(
        &report,
        &render::text::TextOptions {
            color: true,
            width: 100,
        },
    );
    let _ = render::text::verdict(&report);
    let _ = render::html::render(&report);
    let _ = render::perfetto::render(&report);
    let _ = render::pprof::render(&report);
}

/// The same bytes with the header's and each frame's CRC made right, the
/// version set to the one this build reads, and lengths clamped to what is
/// there. Bytes that don't start with the recording magic become the
/// payload of one frame after a plain header.
pub(crate) fn fix_checksums(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 64);
    let mut rest: &[u8];
    if data.len() >= 16 && &data[..8] == MAGIC {
        let hlen = (u32::from_le_bytes(data[12..16].try_into().unwrap()) as usize)
            .min(data.len() - 16)
            .min(1 << 20);
        let json = &data[16..16 + hlen];
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(hlen as u32).to_le_bytes());
        out.extend_from_slice(json);
        out.extend_from_slice(&crc32fast::hash(json).to_le_bytes());
        rest = data.get(16 + hlen + 4..).unwrap_or_default();
    } else {
        let header = serde_json::to_vec(&seed_header()).expect("plain data");
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&crc32fast::hash(&header).to_le_bytes());
        let len = data.len().min(MAX_FRAME as usize);
        frame(&mut out, &data[..len]);
        return out;
    }
    // Frames: wherever a magic starts one, its CRC is recomputed; bytes
    // that are not a frame stay as they are (damage to skip).
    while rest.len() >= 12 {
        if &rest[..4] != FRAME_MAGIC {
            out.push(rest[0]);
            rest = &rest[1..];
            continue;
        }
        let len = (u32::from_le_bytes(rest[4..8].try_into().unwrap()) as usize)
            .min(rest.len() - 12)
            .min(MAX_FRAME as usize);
        frame(&mut out, &rest[12..12 + len]);
        rest = &rest[12 + len..];
    }
    out.extend_from_slice(rest);
    out
}

/// The note that ends [`fake_frame_heads`]'s recording, by its time.
pub const LAST_NOTE_NS: u64 = 1 << 40;

/// A recording built to be slow to read where the reader's cost is not
/// linear in the file's size: a good frame (a note
/// at time 0), about `size` bytes of fake frame heads in three patterns,
/// then a good frame (a note at [`LAST_NOTE_NS`]). Every fake head's length
/// is within the bound, most lie within the file, and every CRC is wrong:
///
/// 1. a fake head before each of many good one-note frames (times 1, 2,
///    ...), each claiming a third of `size`: the frame the reader expects
///    after a good one, so checked before any resynchronisation;
/// 2. a run of 20-byte records, each holding a fake head whose payload
///    starts at the next record and covers half the run: whole records,
///    so only the CRC can refuse it;
/// 3. bare fake heads back to back, each claiming a quarter of the run.
///
/// It reads as the notes of 0, of pattern 1 and of [`LAST_NOTE_NS`], one
/// skipped stretch per fake head of pattern 1 and one over patterns 2 and 3.
pub fn fake_frame_heads(size: usize) -> Vec<u8> {
    const BAD_CRC: u32 = 0xDEAD_BEEF;
    let head = |out: &mut Vec<u8>, len: usize| {
        out.extend_from_slice(FRAME_MAGIC);
        out.extend_from_slice(&(len.min(MAX_FRAME as usize) as u32).to_le_bytes());
        out.extend_from_slice(&BAD_CRC.to_le_bytes());
    };
    let note = |out: &mut Vec<u8>, ts: u64| {
        let (kind, bytes) = decode::encode_user(ts, decode::UserBody::Note(format!("n{ts}")));
        let mut payload = Vec::with_capacity(8 + bytes.len());
        payload.extend_from_slice(&kind.to_le_bytes());
        payload.extend_from_slice(&[0, 0]);
        payload.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        payload.extend_from_slice(&bytes);
        frame(out, &payload);
    };
    let header = serde_json::to_vec(&seed_header()).expect("plain data");
    let mut out = Vec::with_capacity(size + header.len() + 256);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&crc32fast::hash(&header).to_le_bytes());
    note(&mut out, 0);
    let third = size / 3;
    let mut ts = 1;
    let end = out.len() + third;
    while out.len() < end {
        head(&mut out, third);
        note(&mut out, ts);
        ts += 1;
    }
    let end = out.len() + third;
    let claim = (third / 2).min(MAX_FRAME as usize) / 20 * 20;
    while out.len() < end {
        out.extend_from_slice(&decode::KIND_NOTE.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&12u32.to_le_bytes());
        head(&mut out, claim);
    }
    let end = out.len() + third;
    while out.len() < end {
        head(&mut out, third / 4);
    }
    note(&mut out, LAST_NOTE_NS);
    out
}

fn frame(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(FRAME_MAGIC);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

fn seed_header() -> RecordingHeader {
    RecordingHeader {
        trainbpf_version: env!("CARGO_PKG_VERSION").into(),
        kernel: "6.18.0".into(),
        hostname: "fuzz".into(),
        page_size: 4096,
        mem_total_kb: 16 << 20,
        ..Default::default()
    }
}

/// A kernel struct with every field zero.
pub(crate) fn zeroed<T: Copy>() -> T {
    // SAFETY: only used for the plain integer #[repr(C)] structs of
    // trainbpf-common, for which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

fn comm<const N: usize>(s: &str) -> [u8; N] {
    let mut b = [0u8; N];
    let n = s.len().min(N - 1);
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
    b
}

/// The header of a record of job process `tgid` at `ts`, as the seed's.
pub fn hdr(kind: u16, tgid: u32, ts: u64) -> c::Header {
    c::Header {
        kind,
        flags: c::FLAG_IN_JOB,
        tgid,
        ts_ns: ts,
        start_ns: 1_000 + tgid as u64,
    }
}

/// A small recording with every kind of record the model reads: a job whose
/// worker grows and is OOM-killed, with pressure, smaps, shared memory,
/// signals and a few GPU calls. The fuzzer's starting point.
pub fn seed() -> Vec<u8> {
    let mut w = Writer::new(Vec::new(), &seed_header()).expect("writing to memory");
    seed_job_start(&mut w);
    seed_growth(&mut w);
    seed_samples(&mut w);
    let t = 7 * S;
    seed_kill(&mut w, t);
    seed_end(&mut w, t);
    w.flush().expect("memory");
    w.get_ref().clone()
}

/// A second, in the seed's nanoseconds.
const S: u64 = 1_000_000_000;

/// A userspace record, as the collector writes it.
fn user(w: &mut Writer<Vec<u8>>, ts: u64, kind: u16, body: serde_json::Value) {
    let bytes = serde_json::to_vec(&json!({"ts_ns": ts, "body": body})).expect("plain data");
    w.record(kind, &bytes);
}

/// The job starts in its cgroup and forks the worker.
fn seed_job_start(w: &mut Writer<Vec<u8>>) {
    user(
        w,
        S,
        decode::KIND_JOB_START,
        json!({"job_start": {"pid": 700, "start_ns": 0, "argv": ["python3", "train.py"],
            "cwd": "/work", "uid": 1000, "gid": 1000, "cgroup": "/trainbpf-1",
            "memory_limit_bytes": 300u64 << 20}}),
    );
    user(
        w,
        S,
        decode::KIND_CGROUP,
        json!({"cgroup": {"id": 77, "path": "/trainbpf-1"}}),
    );
    let mut fork: c::ForkEvent = zeroed();
    fork.hdr = hdr(c::KIND_FORK, 701, S + 1);
    fork.parent_tgid = 700;
    fork.parent_start_ns = 1_700;
    fork.comm = comm("python3");
    w.record(c::KIND_FORK, &pod_bytes(&fork));
    let mut exec: c::ExecEvent = zeroed();
    exec.hdr = hdr(c::KIND_EXEC, 701, S + 2);
    exec.comm = comm("pt_data_worker");
    exec.filename = comm("/usr/bin/python3");
    w.record(c::KIND_EXEC, &pod_bytes(&exec));
    user(
        w,
        S + 2,
        decode::KIND_PROC_INFO,
        json!({"proc_info": {"tgid": 701, "cmdline": ["python3", "-c", "w"], "rank": 0, "local_rank": 0}}),
    );
    w.flush().expect("memory");
}

/// Both processes grow over five seconds, with pressure and CUDA calls.
fn seed_growth(w: &mut Writer<Vec<u8>>) {
    for (i, pages) in [1_000i64, 20_000, 40_000, 60_000, 76_000]
        .into_iter()
        .enumerate()
    {
        let ts = S * (2 + i as u64);
        for (tgid, p) in [(700u32, 5_000i64), (701, pages)] {
            let mut m: c::MemEvent = zeroed();
            m.hdr = hdr(c::KIND_MEM, tgid, ts);
            m.counters[c::MM_ANONPAGES] = p;
            m.counters[c::MM_FILEPAGES] = 100;
            m.faults = p as u64;
            m.reason = if i == 0 {
                c::MEM_REASON_FIRST
            } else {
                c::MEM_REASON_THRESHOLD
            };
            m.comm = comm(if tgid == 700 {
                "python3"
            } else {
                "pt_data_worker"
            });
            m.pgtables_bytes = p as u64 * 8;
            m.memcg_id = 77;
            m.alloc_pages = p as u64 + 10;
            m.freed_pages = 10;
            w.record(c::KIND_MEM, &pod_bytes(&m));
        }
        user(
            w,
            ts,
            decode::KIND_PRESSURE,
            json!({"pressure": {"mem_total_kb": 16u64 << 20, "mem_available_kb": 8u64 << 20,
                "swap_total_kb": 0, "swap_free_kb": 0, "shmem_kb": 1024,
                "committed_as_kb": 4u64 << 20, "commit_limit_kb": 8u64 << 20,
                "overcommit_memory": 0, "cgroup": null, "psi": null}}),
        );
        let mut cuda: c::CudaEvent = zeroed();
        cuda.hdr = hdr(c::KIND_CUDA, 700, ts + 5);
        cuda.op = if i % 2 == 0 { 10 } else { 11 };
        cuda.size = 64 << 20;
        cuda.ptr = 0x7f00_0000_0000 + i as u64 * (64 << 20);
        cuda.device = 0;
        cuda.tid = 700;
        cuda.entry_ns = ts;
        cuda.comm = comm("python3");
        w.record(c::KIND_CUDA, &pod_bytes(&cuda));
        w.flush().expect("memory");
    }
}

/// USS/PSS, shared memory, and the worker's oom_score_adj raised.
fn seed_samples(w: &mut Writer<Vec<u8>>) {
    user(
        w,
        6 * S,
        decode::KIND_SMAPS,
        json!({"smaps": {"procs": [{"tgid": 701, "rss_kb": 304000, "pss_kb": 300000,
            "uss_kb": 299000, "shared_kb": 5000, "swap_kb": 0}], "cost_us": 120}}),
    );
    user(
        w,
        6 * S,
        decode::KIND_SHM,
        json!({"shm": [{"kind": "posix", "name": "/torch_1", "id": 5, "size_kb": 4096,
            "resident_kb": 2048, "owner_tgid": 700, "mappers": 2}]}),
    );
    let mut adj: c::AdjEvent = zeroed();
    adj.hdr = hdr(c::KIND_OOM_ADJ, 701, 6 * S + 1);
    adj.oom_score_adj = 300;
    adj.writer_tgid = 700;
    adj.comm = comm("pt_data_worker");
    w.record(c::KIND_OOM_ADJ, &pod_bytes(&adj));
}

/// The kernel's log line and the OOM records of the worker's kill, at `t`.
fn seed_kill(w: &mut Writer<Vec<u8>>, t: u64) {
    let mut pk: c::PrintkEvent = zeroed();
    pk.hdr = hdr(c::KIND_PRINTK, 701, t);
    let msg = "Memory cgroup out of memory: Killed process 701 (pt_data_worker) total-vm:400000kB, anon-rss:304000kB, file-rss:400kB, shmem-rss:0kB, UID:1000 pgtables:600kB oom_score_adj:300";
    pk.msg = comm(msg);
    pk.len = msg.len().min(c::MSG_LEN - 1) as u32;
    w.record(c::KIND_PRINTK, &pod_bytes(&pk));
    for (kind, source, dt) in [
        (c::KIND_OOM_KILL, c::SRC_FENTRY, 0),
        (c::KIND_OOM_VICTIM, c::SRC_TP_BTF, 50_000),
    ] {
        let mut e: c::OomEvent = zeroed();
        e.hdr = hdr(kind, 701, t + dt);
        e.victim_pid = 701;
        e.trigger_pid = 701;
        e.trigger_tgid = 701;
        e.uid = 1000;
        e.oom_score_adj = 300;
        e.source = source;
        e.counters[c::MM_ANONPAGES] = 76_000;
        e.total_vm = 100_000;
        e.pgtables = 600 << 10;
        e.victim_memcg_id = 77;
        if kind == c::KIND_OOM_KILL {
            e.oom_flags = c::OOM_FLAG_HAS_OC;
            e.constraint = 3;
            e.oc_memcg_id = 77;
            e.chosen_points = 76_150;
            e.totalpages = 76_800;
        }
        e.comm = comm("pt_data_worker");
        e.trigger_comm = comm("pt_data_worker");
        w.record(kind, &pod_bytes(&e));
    }
}

/// After the kill: a SIGTERM to the main process, both exits, the loss
/// counts and the job's end.
fn seed_end(w: &mut Writer<Vec<u8>>, t: u64) {
    let mut sig: c::SignalEvent = zeroed();
    sig.hdr = hdr(c::KIND_SIGNAL, 700, t + 100_000);
    sig.target_pid = 700;
    sig.sig = 15;
    sig.sender_pid = 1;
    sig.sender_tgid = 1;
    sig.sender_comm = comm("systemd");
    sig.comm = comm("python3");
    w.record(c::KIND_SIGNAL, &pod_bytes(&sig));
    user(
        w,
        t + 100_000,
        decode::KIND_EXE,
        json!({"exe": {"tgid": 1, "exe": "/usr/lib/systemd/systemd", "uid": 0}}),
    );
    let mut exit: c::ExitEvent = zeroed();
    exit.hdr = hdr(c::KIND_EXIT, 701, t + 200_000);
    exit.exit_code = 9;
    exit.group_exit_code = 9;
    exit.comm = comm("pt_data_worker");
    w.record(c::KIND_EXIT, &pod_bytes(&exit));
    let mut exit: c::ExitEvent = zeroed();
    exit.hdr = hdr(c::KIND_EXIT, 700, t + 300_000);
    exit.exit_code = 1 << 8;
    exit.group_exit_code = 1 << 8;
    exit.comm = comm("python3");
    w.record(c::KIND_EXIT, &pod_bytes(&exit));
    let mut by_kind = vec![0u64; c::KIND_MAX as usize];
    by_kind[c::KIND_MEM as usize] = 3;
    user(
        w,
        t + 300_000,
        decode::KIND_LOST,
        json!({"lost": {"by_kind": by_kind, "undecodable": 1, "proc_map_full": 0, "job_map_full": 0}}),
    );
    user(w, t + 300_000, decode::KIND_NOTE, json!({"note": "seed"}));
    user(
        w,
        t + 400_000,
        decode::KIND_JOB_EXIT,
        json!({"job_exit": {"pid": 700, "status": {"code": 1}}}),
    );
}

/// A deterministic xorshift generator: the mutation loop needs no crate and
/// replays exactly from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform-ish in `0..n`; 0 when `n` is 0.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

/// One mutation of `input`, as a fuzzer would make: bit flips, byte
/// overwrites, truncation, inserted or deleted runs, a duplicated stretch,
/// a stray frame magic, an extreme length. Several at once now and then.
pub fn mutate(input: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut v = input.to_vec();
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        let n = v.len();
        match rng.below(9) {
            0 if n > 0 => {
                let i = rng.below(n);
                v[i] ^= 1 << rng.below(8);
            }
            1 if n > 0 => {
                let i = rng.below(n);
                v[i] = rng.next_u64() as u8;
            }
            2 => v.truncate(rng.below(n + 1)),
            3 => {
                let i = rng.below(n + 1);
                let k = 1 + rng.below(32);
                let junk: Vec<u8> = (0..k).map(|_| rng.next_u64() as u8).collect();
                v.splice(i..i, junk);
            }
            4 if n > 0 => {
                let i = rng.below(n);
                let k = (1 + rng.below(64)).min(n - i);
                v.drain(i..i + k);
            }
            5 if n > 0 => {
                let i = rng.below(n);
                let k = (1 + rng.below(256)).min(n - i);
                let copy = v[i..i + k].to_vec();
                let at = rng.below(n + 1);
                v.splice(at..at, copy);
            }
            6 => {
                let i = rng.below(n + 1);
                v.splice(i..i, FRAME_MAGIC.iter().copied());
            }
            7 if n >= 4 => {
                // An extreme or off-by-a-little 32-bit value (a length).
                let i = rng.below(n - 3);
                let old = u32::from_le_bytes(v[i..i + 4].try_into().unwrap());
                let x = match rng.below(5) {
                    0 => u32::MAX,
                    1 => MAX_FRAME,
                    2 => MAX_FRAME + 1,
                    3 => old.wrapping_add(1),
                    _ => old.wrapping_sub(1),
                };
                v[i..i + 4].copy_from_slice(&x.to_le_bytes());
            }
            _ if n > 0 => {
                // Swap two stretches' worth of bytes (frames out of order).
                let a = rng.below(n);
                let b = rng.below(n);
                v.swap(a, b);
            }
            _ => {}
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::Reader;

    #[test]
    fn the_seed_is_a_full_report() {
        let seed = seed();
        let mut r = Reader::new(&seed[..]).unwrap();
        let n = r.by_ref().count();
        assert!(n > 20, "{n} events");
        assert_eq!(r.undecodable, 0, "every seed record decodes");
        assert!(r.stop().is_none() && r.skipped().count == 0);
        let report = crate::pipeline::build(&seed[..], crate::pipeline::WINDOW).unwrap();
        assert_eq!(report.kills.len(), 1, "the worker's kill");
        assert!(report.job.is_some());
        check(&seed);
    }

    #[test]
    fn a_damaged_middle_is_skipped_and_the_kill_after_it_still_explained() {
        let mut bytes = seed();
        // The second frame (the first memory samples): flip a payload byte.
        let hlen = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        let first = 16 + hlen + 4;
        let len0 = u32::from_le_bytes(bytes[first + 4..first + 8].try_into().unwrap()) as usize;
        let second = first + 12 + len0;
        bytes[second + 40] ^= 0x20;
        let report = crate::pipeline::build(&bytes[..], crate::pipeline::WINDOW).unwrap();
        assert_eq!(report.skipped.count, 1);
        assert_eq!(report.skipped.ranges[0].offset, second as u64);
        assert_eq!(report.skipped.ranges[0].reason, "frame checksum mismatch");
        assert!(report.stopped_early.is_none());
        assert_eq!(report.kills.len(), 1, "the kill, after the damage, is read");
        let v = render::json::render(&report);
        assert_eq!(v["recording"]["skipped"][0]["offset"], second as u64);
        assert_eq!(v["recording"]["skipped_ranges"], 1);
        let text = render::text::render(
            &report,
            &render::text::TextOptions {
                color: false,
                width: 100,
            },
        );
        assert!(text.contains("1 damaged stretch ("), "{text}");
    }

    #[test]
    fn fixing_checksums_keeps_a_good_recording_as_it_is() {
        let seed = seed();
        assert_eq!(fix_checksums(&seed), seed);
        // And makes a damaged payload readable again.
        let mut bad = seed.clone();
        let n = bad.len();
        bad[n - 20] ^= 0x10;
        let fixed = fix_checksums(&bad);
        let mut r = Reader::new(&fixed[..]).unwrap();
        r.by_ref().for_each(drop);
        assert!(r.stop().is_none() && r.skipped().count == 0);
    }

    /// Inputs the fuzzer found a panic with, kept: each must now pass
    /// the whole pipeline (docs/fuzzing.md, "What it found").
    #[test]
    fn inputs_that_once_broke_it_pass() {
        // victim_not_grower.rs: oom_score_adj × totalpages/1000 in i64.
        check(include_bytes!(
            "../tests/fixtures/fuzz/victim-not-grower-adj-overflow.rec"
        ));
    }

    /// The fuzz target's work, without a fuzzer: a few thousand mutations
    /// of the seed (and of mutants), each through the whole pipeline. The
    /// long run is `cargo xtask fuzz` (docs/fuzzing.md).
    #[test]
    fn mutated_recordings_never_panic() {
        let seed = seed();
        let mut rng = Rng::new(8);
        let mut pool = vec![seed.clone()];
        for i in 0..1500 {
            let base = &pool[rng.below(pool.len())];
            let m = mutate(base, &mut rng);
            check(&m);
            if i % 50 == 0 && pool.len() < 16 {
                pool.push(m);
            }
        }
        // Fake frame heads over good frames, and mutants of them: the
        // resynchronisation's worst case, at a size the fuzzer reaches.
        let heads = fake_frame_heads(8 << 10);
        check(&heads);
        for _ in 0..200 {
            check(&mutate(&heads, &mut rng));
        }
        // Every prefix of the seed: a recorder killed at any byte.
        for cut in (0..seed.len()).step_by(7) {
            check(&seed[..cut]);
        }
        // Plain junk, with and without the magic in front.
        for len in [0, 1, 15, 16, 17, 100, 5000] {
            let junk: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            check(&junk);
            let mut j = MAGIC.to_vec();
            j.extend_from_slice(&junk);
            check(&j);
        }
    }
}
