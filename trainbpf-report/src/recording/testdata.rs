//! Recordings the writer's and the reader's tests share.

use super::*;
use crate::decode::{UserBody, encode_user};

pub(super) fn header() -> RecordingHeader {
    RecordingHeader {
        page_size: 4096,
        kernel: "6.18.0".into(),
        ..Default::default()
    }
}

pub(super) fn sample(n: u32) -> Vec<u8> {
    let mut w = Writer::new(Vec::new(), &header()).unwrap();
    for i in 0..n {
        let (k, b) = encode_user(i as u64, UserBody::Note(format!("note {i}")));
        w.record(k, &b);
        w.flush().unwrap();
    }
    w.get_ref().clone()
}

pub(super) fn notes(bytes: &[u8]) -> (Vec<u64>, Option<Stop>) {
    let mut r = Reader::new(bytes).unwrap();
    let ts = r.by_ref().map(|t| t.ts_ns).collect();
    (ts, r.stop().cloned())
}

/// Start offsets of the frames in a well-formed recording.
pub(super) fn frame_starts(bytes: &[u8]) -> Vec<usize> {
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

pub(super) fn read_all(bytes: &[u8]) -> (Vec<u64>, Option<Stop>, Skipped) {
    let mut r = Reader::new(bytes).unwrap();
    let ts = r.by_ref().map(|t| t.ts_ns).collect();
    (ts, r.stop().cloned(), r.skipped().clone())
}
