//! Growth stacks as a pprof profile (`report --pprof PATH`): a gzipped
//! `profile.proto` that `go tool pprof`, Pyroscope and Parca read.
//!
//! What goes in:
//!
//! - one sample per (process, stack) over the whole run, with two values,
//!   in the shape of a heap profile's in-use memory so that readers pick
//!   the right views: `inuse_objects/count`, the times the stack was taken,
//!   and `inuse_space/bytes`, the new high of added memory taken there (the
//!   default). Growth is new highs, never freed, so "in use" is an upper
//!   bound of what the stack still holds;
//! - string labels `pid` and `comm` (Pyroscope and Parca keep string
//!   labels, not numeric ones), and `stack_error` for a stack resolved in
//!   part;
//! - a location per distinct frame, innermost first as pprof wants; a
//!   symbolized frame belongs to a mapping per executable or library,
//!   marked as having functions so that no reader re-symbolizes it (the
//!   process is gone and its addresses mean nothing now); an unsymbolized
//!   frame keeps its address only;
//! - a stack without frames (unreadable, or the lighter ones summed) is a
//!   one-frame sample whose function names why, so its bytes stay counted.
//!
//! Names come from processes and `go tool pprof` prints them to a
//! terminal: they are escaped as the text report's are (src/term.rs).

pub(crate) mod proto;

use std::collections::HashMap;
use std::io::Write as _;

use prost::Message as _;

use crate::model::{GrowthStack, Report, stacks::Frame};
use crate::term::escape as esc;

/// The profile, gzipped as the format requires on disk.
pub fn render(r: &Report) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    let _ = gz.write_all(&profile(r).encode_to_vec());
    gz.finish().unwrap_or_default()
}

/// The profile's messages, before encoding.
pub(crate) fn profile(r: &Report) -> proto::Profile {
    let mut b = Builder::default();
    b.p.string_table.push(String::new());
    let objects = b.value_type("inuse_objects", "count");
    let space = b.value_type("inuse_space", "bytes");
    b.p.sample_type = vec![objects, space.clone()];
    b.p.default_sample_type = space.r#type;
    b.p.period_type = Some(b.value_type("space", "bytes"));
    if let Some(first) = r.first_ns {
        b.p.time_nanos = r.realtime_ns(first).map_or(0, clamp);
    }
    b.p.duration_nanos = clamp(r.duration_ns());
    b.comment(
        "trainbpf growth stacks: where each process's new highs of added memory \
         (anon, shmem, copy-on-write) were taken, over the whole run",
    );
    if r.stacks.is_empty() {
        b.comment(&format!("no growth stacks recorded: {}", super::NO_STACKS));
    }
    if r.lost.stack_map_full > 0 {
        b.comment(&format!(
            "{} stacks the kernel could not aggregate (map full) are not in this profile",
            r.lost.stack_map_full
        ));
    }
    for key in r.stacks.processes() {
        let comm = r
            .processes
            .iter()
            .find(|q| q.pid == key.tgid && q.start_ns == key.start_ns)
            .map_or("?", |q| q.comm.as_str());
        for s in r.process_stacks(key.tgid, key.start_ns) {
            b.sample(key.tgid, comm, &s);
        }
    }
    b.p
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A location's identity: the same frame in two processes (a forked
/// worker running its parent's code) is one location.
#[derive(Clone, PartialEq, Eq, Hash)]
struct LocKey {
    addr: u64,
    function: Option<String>,
    file: Option<String>,
    line: Option<u32>,
    module: Option<String>,
}

#[derive(Default)]
struct Builder {
    p: proto::Profile,
    strings: HashMap<String, i64>,
    locations: HashMap<LocKey, u64>,
    functions: HashMap<(i64, i64), u64>,
    /// Module name → index into `p.mapping`.
    mappings: HashMap<String, usize>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if s.is_empty() {
            return 0;
        }
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, ty: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(ty),
            unit: self.string(unit),
        }
    }

    fn comment(&mut self, text: &str) {
        let i = self.string(text);
        self.p.comment.push(i);
    }

    fn label(&mut self, key: &str, value: &str) -> proto::Label {
        proto::Label {
            key: self.string(key),
            str: self.string(value),
            ..Default::default()
        }
    }

    fn sample(&mut self, pid: u32, comm: &str, s: &GrowthStack) {
        let mut location_id: Vec<u64> = s.frames.iter().map(|f| self.location(f)).collect();
        let mut label = vec![
            self.label("pid", &pid.to_string()),
            self.label("comm", &esc(comm)),
        ];
        match &s.error {
            Some(e) if location_id.is_empty() => {
                let why = Frame {
                    kind: "error".into(),
                    function: Some(format!("[{e}]")),
                    ..Default::default()
                };
                location_id.push(self.location(&why));
            }
            Some(e) => label.push(self.label("stack_error", &esc(e))),
            None => {}
        }
        self.p.sample.push(proto::Sample {
            location_id,
            value: vec![clamp(s.count), clamp(s.bytes)],
            label,
        });
    }

    fn location(&mut self, f: &Frame) -> u64 {
        let key = LocKey {
            addr: f.addr,
            function: f.function.as_deref().map(|s| esc(s).into_owned()),
            file: f.file.as_deref().map(|s| esc(s).into_owned()),
            line: f.line,
            module: f.module.as_deref().map(|s| esc(s).into_owned()),
        };
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.p.location.len() as u64 + 1;
        let mut loc = proto::Location {
            id,
            address: f.addr,
            ..Default::default()
        };
        if let Some(name) = &key.function {
            let function_id = self.function(name, key.file.as_deref());
            loc.line.push(proto::Line {
                function_id,
                line: f.line.map_or(0, i64::from),
            });
            if let Some(m) = &key.module {
                loc.mapping_id = self.mapping(m, key.file.is_some(), f.line.is_some());
            }
        }
        self.p.location.push(loc);
        self.locations.insert(key, id);
        id
    }

    fn function(&mut self, name: &str, file: Option<&str>) -> u64 {
        let name = self.string(name);
        let file = file.map_or(0, |f| self.string(f));
        if let Some(&id) = self.functions.get(&(name, file)) {
            return id;
        }
        let id = self.p.function.len() as u64 + 1;
        self.p.function.push(proto::Function {
            id,
            name,
            system_name: name,
            filename: file,
            start_line: 0,
        });
        self.functions.insert((name, file), id);
        id
    }

    /// The mapping of a symbolized frame's module. Its address range is
    /// unknown (not recorded), which readers accept for a mapping that has
    /// its functions.
    fn mapping(&mut self, module: &str, has_file: bool, has_line: bool) -> u64 {
        if let Some(&i) = self.mappings.get(module) {
            let m = &mut self.p.mapping[i];
            m.has_filenames &= has_file;
            m.has_line_numbers &= has_line;
            return m.id;
        }
        let filename = self.string(module);
        let id = self.p.mapping.len() as u64 + 1;
        self.mappings
            .insert(module.to_string(), self.p.mapping.len());
        self.p.mapping.push(proto::Mapping {
            id,
            filename,
            has_functions: true,
            has_filenames: has_file,
            has_line_numbers: has_line,
            ..Default::default()
        });
        id
    }
}

#[cfg(test)]
mod tests;
