//! The profile decoded back with the same prost messages: what a reader
//! gets from a model fixture.

use std::io::Read as _;

use prost::Message as _;

use super::{proto, render};
use crate::decode::{
    Event, ProcKey, Timed,
    stacks::{StackDelta, StackSample},
};
use crate::model::{self, ModelOptions, Process, Report, stacks::Frame};
use crate::render::fixture::sample_report;

fn native(function: &str, line: u32, addr: u64) -> Frame {
    Frame {
        kind: "native".into(),
        addr,
        function: Some(function.into()),
        file: Some("/src/grow.c".into()),
        line: Some(line),
        module: Some("/bin/grow".into()),
        found: None,
    }
}

fn delta(tgid: u32, start_ns: u64, id: i32, kb: u64, count: u64) -> StackDelta {
    StackDelta {
        proc: ProcKey { tgid, start_ns },
        stack_id: id,
        py_id: 0,
        py_state: 0,
        bytes: kb << 10,
        count,
        frames: None,
        error: None,
        gpu: false,
        leaf_ret: 0,
    }
}

/// The demo's report with growth stacks: the worker (812) grew 40 MiB
/// through `grow_here` and 1 MiB through an unsymbolized frame, and had one
/// unreadable stack; its parent (700) ran the same `grow_here` once.
fn with_stacks() -> Report {
    let grow = vec![
        native("grow_here", 7, 0x1139),
        native("step", 12, 0x1180),
        native("main", 17, 0x11a0),
    ];
    let unsym = vec![
        Frame {
            kind: "native".into(),
            addr: 0x7f00_0000_1234,
            ..Default::default()
        },
        native("main", 17, 0x11a0),
    ];
    let mut worker = delta(812, 5, 3, 40 << 10, 80);
    worker.frames = Some(grow.clone());
    let mut other = delta(812, 5, 4, 1024, 2);
    other.frames = Some(unsym);
    let mut bad = delta(812, 5, -14, 512, 1);
    bad.error = Some("stack could not be read: EFAULT".into());
    let mut parent = delta(700, 1, 3, 512, 1);
    parent.frames = Some(grow);
    let events = vec![Timed {
        ts_ns: 1_000_000_000,
        event: Event::Stacks(StackSample {
            stacks: vec![worker, other, bad, parent],
        }),
    }];
    let mut r = sample_report();
    r.stacks = model::build(&r.header, events.into_iter(), &ModelOptions::default()).stacks;
    r.processes.push(Process {
        pid: 812,
        start_ns: 5,
        comm: "pt_data_worker".into(),
        ..r.processes[0].clone()
    });
    r
}

/// The file as a reader gets it: gunzipped and decoded.
fn decode(bytes: &[u8]) -> proto::Profile {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut raw)
        .expect("gzip");
    proto::Profile::decode(raw.as_slice()).expect("profile.proto")
}

fn s(p: &proto::Profile, i: i64) -> &str {
    &p.string_table[usize::try_from(i).unwrap()]
}

/// Innermost-first function names of a sample.
fn names(p: &proto::Profile, sample: &proto::Sample) -> Vec<String> {
    sample
        .location_id
        .iter()
        .map(|&id| {
            let loc = &p.location[(id - 1) as usize];
            assert_eq!(loc.id, id, "locations are numbered from 1 in order");
            match loc.line.first() {
                Some(l) => s(p, p.function[(l.function_id - 1) as usize].name).to_string(),
                None => format!("{:#x}", loc.address),
            }
        })
        .collect()
}

fn label<'a>(p: &'a proto::Profile, sample: &proto::Sample, key: &str) -> Option<&'a str> {
    sample
        .label
        .iter()
        .find(|l| s(p, l.key) == key)
        .map(|l| s(p, l.str))
}

#[test]
fn samples_are_growth_per_process_and_stack() {
    let p = decode(&render(&with_stacks()));
    assert_eq!(p.string_table[0], "");
    let types: Vec<_> = p
        .sample_type
        .iter()
        .map(|t| (s(&p, t.r#type), s(&p, t.unit)))
        .collect();
    assert_eq!(
        types,
        [("inuse_objects", "count"), ("inuse_space", "bytes")]
    );
    assert_eq!(s(&p, p.default_sample_type), "inuse_space");
    assert_eq!(p.sample.len(), 4, "one per (process, stack)");

    let heavy = p
        .sample
        .iter()
        .max_by_key(|x| x.value[1])
        .expect("a sample");
    assert_eq!(heavy.value, [80, 40 << 20]);
    assert_eq!(names(&p, heavy), ["grow_here", "step", "main"]);
    assert_eq!(label(&p, heavy, "pid"), Some("812"));
    assert_eq!(label(&p, heavy, "comm"), Some("pt_data_worker"));
    let leaf = &p.location[(heavy.location_id[0] - 1) as usize];
    assert_eq!(leaf.address, 0x1139);
    assert_eq!(leaf.line[0].line, 7);
    let f = &p.function[(leaf.line[0].function_id - 1) as usize];
    assert_eq!(s(&p, f.filename), "/src/grow.c");
    let m = &p.mapping[(leaf.mapping_id - 1) as usize];
    assert_eq!(s(&p, m.filename), "/bin/grow");
    assert!(m.has_functions && m.has_filenames && m.has_line_numbers);

    // The parent's same stack is its own sample on the same locations.
    let parent = p
        .sample
        .iter()
        .find(|x| label(&p, x, "pid") == Some("700"))
        .expect("the parent's sample");
    assert_eq!(parent.location_id, heavy.location_id);
    assert_eq!(parent.value, [1, 512 << 10]);
    assert_eq!(label(&p, parent, "comm"), Some("python3"));
    // grow_here, step, main, an unsymbolized one, the unreadable stack's.
    assert_eq!(p.location.len(), 5);
    assert_eq!(p.function.len(), 4);
    assert_eq!(p.mapping.len(), 1);
    assert_eq!(
        p.time_nanos,
        1_709_251_199_999_000_000 - 20_500_000_000 + 500_000_000
    );
}

/// An unsymbolized frame keeps its address and no mapping (a reader would
/// otherwise re-symbolize it from a file that no longer matches); an
/// unreadable stack keeps its bytes under a frame that says why.
#[test]
fn unsymbolized_and_unreadable_stacks_are_kept() {
    let p = decode(&render(&with_stacks()));
    let unsym = p
        .sample
        .iter()
        .find(|x| x.value[1] == 1 << 20)
        .expect("the unsymbolized stack");
    assert_eq!(names(&p, unsym), ["0x7f0000001234", "main"]);
    let loc = &p.location[(unsym.location_id[0] - 1) as usize];
    assert!(loc.line.is_empty());
    assert_eq!(loc.mapping_id, 0);
    let bad = p
        .sample
        .iter()
        .find(|x| x.value[1] == 512 << 10 && label(&p, x, "pid") == Some("812"))
        .expect("the unreadable stack");
    assert_eq!(names(&p, bad), ["[stack could not be read: EFAULT]"]);
    assert_eq!(bad.value[0], 1);
}

/// A recording without stacks gives a valid profile with no samples,
/// which says why.
#[test]
fn no_stacks_is_an_empty_profile() {
    let p = decode(&render(&sample_report()));
    assert!(p.sample.is_empty() && p.location.is_empty());
    assert_eq!(p.sample_type.len(), 2);
    assert!(
        p.comment.iter().any(|&c| s(&p, c).contains("--no-stacks")),
        "{:?}",
        p.string_table
    );
}

/// Names from the process reach `go tool pprof`'s terminal escaped.
#[test]
fn control_characters_are_escaped() {
    let mut r = with_stacks();
    r.processes.last_mut().unwrap().comm = "evil\x1b]0;x\x07".into();
    let p = decode(&render(&r));
    assert!(p.string_table.iter().all(|s| !s.contains('\x1b')));
    assert!(
        p.string_table.iter().any(|s| s == "evil\\x1b]0;x\\x07"),
        "{:?}",
        p.string_table
    );
}
