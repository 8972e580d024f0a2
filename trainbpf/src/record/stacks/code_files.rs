//! The files a job process runs code from, held open while it lives, so
//! that a stack taken as it dies (when `/proc/PID/maps` is already empty)
//! still resolves: each executable mapping's range, file offset and an
//! open descriptor of the mapped inode itself (through
//! `/proc/PID/map_files/`, never a path the job could swap).

use std::{
    collections::HashMap,
    fs::File,
    os::fd::AsRawFd,
    sync::atomic::{AtomicUsize, Ordering},
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};
use trainbpf_report::decode::stacks::Frame;

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
            if let (Some(b), Some(m)) = (backing, crate::record::samplers::procfs::maps_line(line))
                && b.dev(m.dev).is_some()
            {
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
            if self.maps.iter().any(|m| m.start == start && m.end == end) {
                continue;
            }
            let Ok(file) = File::open(format!("/proc/{tgid}/map_files/{range}")) else {
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

    /// Each stack named from the held files alone, with why: for a process
    /// that is dying, whose `/proc/PID` is still there but whose maps are
    /// gone already (`why`: what reading them said). Held nothing: `why`.
    pub fn name_all(
        &self,
        stacks: &[Vec<u64>],
        why: &str,
    ) -> Result<Vec<super::symbolize::Resolved>, String> {
        if self.maps.is_empty() {
            return Err(why.to_string());
        }
        let note = bounded(&format!("{why}; named from the files it ran"));
        Ok(stacks
            .iter()
            .map(|ips| {
                let mut frames: Vec<Frame> = ips
                    .iter()
                    .take(trainbpf_report::decode::stacks::MAX_FRAMES)
                    .map(|&addr| Frame {
                        kind: "native".into(),
                        addr,
                        ..Default::default()
                    })
                    .collect();
                self.name(&mut frames);
                (frames, Some(note.clone()))
            })
            .collect())
    }

    /// Names from the held files the stacks of which no frame resolved:
    /// an OOM victim's `/proc/PID` lives on while the kernel tears down
    /// its memory, and its maps read empty before its exit is seen.
    pub fn name_unresolved(
        &self,
        mut stacks: Vec<super::symbolize::Resolved>,
    ) -> Vec<super::symbolize::Resolved> {
        for (frames, why) in &mut stacks {
            let Some(w) = why.as_deref() else { continue };
            self.name(frames);
            if frames.iter().any(|f| f.function.is_some()) {
                *why = Some(bounded(&format!("{w}; named from the files it ran")));
            }
        }
        stacks
    }

    /// Names the frames still unnamed from the held files: their file
    /// offsets, each file's symbols and line tables read anew (a fresh
    /// symbolizer: a descriptor's path names another file once closed).
    pub fn name(&self, frames: &mut [Frame]) {
        let sym = Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(false)
            .build();
        for (i, f) in frames.iter_mut().enumerate() {
            if f.function.is_some() {
                continue;
            }
            // A return address points past its call.
            let addr = if i == 0 {
                f.addr
            } else {
                f.addr.saturating_sub(1)
            };
            let Some(m) = self.maps.iter().find(|m| m.start <= addr && addr < m.end) else {
                continue;
            };
            let fd_path = format!("/proc/self/fd/{}", m.file.as_raw_fd());
            let src = Source::Elf(Elf::new(fd_path));
            let off = addr - m.start + m.offset;
            let Ok(syms) = sym.symbolize(&src, Input::FileOffset(&[off])) else {
                continue;
            };
            if let Some(Symbolized::Sym(s)) = syms.first() {
                f.function = Some(bounded(&s.name));
                f.file = s
                    .code_info
                    .as_ref()
                    .map(|c| bounded(&c.to_path().display().to_string()));
                f.line = s.code_info.as_ref().and_then(|c| c.line);
                f.module = Some(m.path.clone());
            }
        }
    }
}

impl Mapped {
    /// The held mappings, for the unwinder.
    pub fn for_unwinding(&self) -> Vec<super::unwind::Mapping<'_>> {
        self.maps
            .iter()
            .map(|m| super::unwind::Mapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                path: &m.path,
                file: &m.file,
            })
            .collect()
    }
}

/// Every job process's held mappings, by process.
pub type ByProc = HashMap<trainbpf_report::decode::ProcKey, Mapped>;

#[cfg(test)]
mod tests {
    use super::*;

    /// This test's own function, named from its held file alone.
    #[test]
    fn names_a_frame_from_the_held_file() {
        if !crate::util::privileged("opening /proc/self/map_files") {
            return;
        }
        let mut m = Mapped::default();
        m.refresh(std::process::id(), None);
        assert!(!m.maps.is_empty());
        let ip = names_a_frame_from_the_held_file as *const () as usize as u64;
        let mut frames = vec![Frame {
            kind: "native".into(),
            addr: ip,
            ..Default::default()
        }];
        m.name(&mut frames);
        let f = frames[0].function.as_deref().unwrap_or("");
        assert!(f.contains("names_a_frame_from_the_held_file"), "{f}");
    }
}
