//! The files a job process runs code from, held open while it lives, so
//! that a stack taken as it dies (when `/proc/PID/maps` is already empty)
//! still resolves: each executable mapping's range, file offset and an
//! open descriptor of the mapped inode itself (through
//! `/proc/PID/map_files/`, never a path the job could swap).

use std::{
    collections::HashMap,
    fs::File,
    sync::atomic::{AtomicUsize, Ordering},
};

use super::symbolize::bounded;
use crate::record::samplers::procfs::backing::Backing;

/// Executable mappings held per process (a Python with its extension
/// modules maps a few dozen files).
const MAX_PER_PROC: usize = 128;
/// Files held in all: well under the recorder's descriptor limit (1024
/// by default), however many processes the job forks.
const MAX_HELD: usize = 512;
static HELD: AtomicUsize = AtomicUsize::new(0);

struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    path: String,
    file: File,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One process's executable mappings.
#[derive(Default)]
pub struct Mapped {
    maps: Vec<Mapping>,
    /// Mappings of files on FUSE, not opened: range, offset, path and
    /// filesystem type, so that their frames say why they have no names.
    skipped: Vec<(u64, u64, u64, String, String)>,
}

impl Mapped {
    /// Reads `tgid`'s executable file mappings and opens those not held
    /// yet (a library loaded since the last look is added). A file on FUSE
    /// (`backing`) is not opened: its server may never answer.
    pub fn refresh(&mut self, tgid: u32, backing: Option<&Backing>) {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{tgid}/maps")) else {
            return;
        };
        for line in text.lines() {
            if self.maps.len() >= MAX_PER_PROC || HELD.load(Ordering::Relaxed) >= MAX_HELD {
                break;
            }
            let mut it = line.split_whitespace();
            let (Some(range), Some(perms), Some(off)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let path = it.nth(2).unwrap_or("");
            if !perms.contains('x') || !path.starts_with('/') {
                continue;
            }
            let Some((s, e)) = range.split_once('-') else {
                continue;
            };
            let (Ok(start), Ok(end), Ok(offset)) = (
                u64::from_str_radix(s, 16),
                u64::from_str_radix(e, 16),
                u64::from_str_radix(off, 16),
            ) else {
                continue;
            };
            if let (Some(b), Some(m)) = (backing, crate::record::samplers::procfs::maps_line(line))
                && let Some(fs) = b.dev(m.dev)
            {
                if self.skipped.len() < MAX_PER_PROC
                    && !self.skipped.iter().any(|k| (k.0, k.1) == (start, end))
                {
                    let fs = bounded(fs);
                    self.skipped.push((start, end, offset, bounded(path), fs));
                }
                continue;
            }
            if self.maps.iter().any(|m| m.start == start && m.end == end) {
                continue;
            }
            // map_files names a range without the maps file's padding
            // ("41f000-6d2000" for "0041f000-006d2000", a non-PIE
            // executable such as Debian's python3.11).
            let Ok(file) = File::open(format!("/proc/{tgid}/map_files/{start:x}-{end:x}")) else {
                continue;
            };
            HELD.fetch_add(1, Ordering::Relaxed);
            self.maps.push(Mapping {
                start,
                end,
                offset,
                path: bounded(path),
                file,
            });
        }
    }

    /// Names `stacks` from the held files, in the namer (a process
    /// without privileges, handed the descriptors).
    pub fn name(
        &self,
        stacks: Vec<super::namer::StackMsg>,
    ) -> Result<Vec<super::namer::Named>, String> {
        if self.maps.is_empty() && self.skipped.is_empty() {
            return Err("none of the files it runs could be held".into());
        }
        let held = self.maps.iter().map(|m| {
            (
                super::namer::MapMsg {
                    start: m.start,
                    end: m.end,
                    offset: m.offset,
                    path: m.path.clone(),
                    skipped: None,
                },
                Some(&m.file),
            )
        });
        let skipped = self.skipped.iter().map(|(start, end, offset, path, fs)| {
            (
                super::namer::MapMsg {
                    start: *start,
                    end: *end,
                    offset: *offset,
                    path: path.clone(),
                    skipped: Some(fs.clone()),
                },
                None,
            )
        });
        let maps: Vec<(super::namer::MapMsg, Option<&File>)> = held.chain(skipped).collect();
        super::namer::name(&maps, stacks)
    }
}

/// Every job process's held mappings, by process.
pub type ByProc = HashMap<trainbpf_report::decode::ProcKey, Mapped>;
