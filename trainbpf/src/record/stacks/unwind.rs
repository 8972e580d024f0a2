//! Native frames by the binaries' own unwind tables, where frame pointers
//! are missing (pip wheels, glibc's string functions): a new growth
//! stack's first sample comes with the user registers and a copy of the
//! stack above its pointer (`StackCopy`), and it is unwound here with
//! each mapped file's `.eh_frame` (or `.debug_frame`), as a debugger or
//! `perf --call-graph dwarf` would, by framehop.
//!
//! The tables are read from the files the process maps, held open by
//! descriptor (`code_files`), within fixed bounds (`util::elf_image`):
//! a file's sections are the job's to make. They are kept per file
//! (device and inode) on the worker that reads them, up to a bound.

use std::{
    cell::RefCell,
    collections::HashMap,
    fs::File,
    ops::{Deref, Range},
    os::unix::fs::MetadataExt as _,
    sync::Arc,
};

use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _,
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
};
use object::{elf, read::elf::ProgramHeader as _, read::elf::SectionHeader as _};
use trainbpf_report::decode::stacks::{FOUND_CFI, FOUND_FP, FOUND_IP, FOUND_SP};

use super::namer::CopyMsg;
use crate::util::elf_image::Image;

/// What is read of one file's unwind sections, at most: the largest
/// libraries people train with (a CUDA build of torch) have tens of MiB.
const MAX_UNWIND_BYTES: u64 = 64 << 20;
/// What the worker keeps of files' unwind sections: past it, they are
/// dropped and read again when next needed.
const MAX_KEPT_BYTES: u64 = 256 << 20;
/// Frames unwound per stack (the kernel's frame-pointer walk keeps as
/// many).
const MAX_UNWOUND: usize = trainbpf_common::STACK_DEPTH;

/// Section data framehop borrows: shared by every process mapping the
/// file.
#[derive(Clone)]
pub struct Bytes(Arc<[u8]>);

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// One file's unwind sections, and where its segments lie.
pub struct Tables {
    text: Option<Range<u64>>,
    got: Option<Range<u64>>,
    eh_frame: Option<(Range<u64>, Bytes)>,
    eh_frame_hdr: Option<(Range<u64>, Bytes)>,
    debug_frame: Option<Bytes>,
    /// Loadable segments: file offset, address, size in the file.
    loads: Vec<(u64, u64, u64)>,
}

impl Tables {
    fn bytes(&self) -> u64 {
        [
            self.eh_frame.as_ref().map(|e| e.1.len()),
            self.eh_frame_hdr.as_ref().map(|e| e.1.len()),
            self.debug_frame.as_ref().map(|d| d.len()),
        ]
        .into_iter()
        .flatten()
        .sum::<usize>() as u64
    }

    fn has_cfi(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some()
    }

    /// Reads a file's unwind sections, within the bound.
    pub fn read(f: &File) -> Result<Tables, String> {
        let mut h = Image::headers(f).map_err(|e| e.to_string())?;
        let e = h.endian;
        if let Some(i) = h.shstrndx {
            h.image
                .load_sections(
                    f,
                    (&h.sections, e),
                    &[i as usize],
                    1 << 20,
                    "its section names",
                )
                .map_err(|e| e.to_string())?;
        }
        let names: Vec<Vec<u8>> = h
            .sections
            .iter()
            .map(|s| h.image.section_name(&h, s).unwrap_or_default().to_vec())
            .collect();
        let find = |n: &[u8]| names.iter().position(|x| x == n);
        let wanted: Vec<usize> = [&b".eh_frame"[..], b".eh_frame_hdr", b".debug_frame"]
            .iter()
            .filter_map(|n| find(n))
            .filter(|&i| h.sections[i].sh_type(e) != elf::SHT_NOBITS)
            .collect();
        h.image
            .load_sections(
                f,
                (&h.sections, e),
                &wanted,
                MAX_UNWIND_BYTES,
                "its unwind tables",
            )
            .map_err(|e| e.to_string())?;
        let range = |i: usize| {
            let s = &h.sections[i];
            let a = s.sh_addr(e);
            a..a.saturating_add(s.sh_size(e))
        };
        let data = |i: usize| -> Option<Bytes> {
            let (at, size) = h.sections[i].file_range(e)?;
            Some(Bytes(Arc::from(h.image.bytes(at, size)?)))
        };
        let with_range = |n: &[u8]| {
            let i = find(n)?;
            Some((range(i), data(i)?))
        };
        Ok(Tables {
            text: find(b".text").map(range),
            got: find(b".got").map(range),
            eh_frame: with_range(b".eh_frame"),
            eh_frame_hdr: with_range(b".eh_frame_hdr"),
            debug_frame: find(b".debug_frame").and_then(data),
            loads: h
                .segments
                .iter()
                .filter(|p| p.p_type(e) == elf::PT_LOAD)
                .map(|p| (p.p_offset(e), p.p_vaddr(e), p.p_filesz(e)))
                .collect(),
        })
    }

    /// Where a mapping of `offset` in the file at `start` puts the
    /// file's addresses: the module's base in the process.
    /// A mapping starts at a page boundary, often below its segment's
    /// offset, inside the segment before it: the last segment whose first
    /// page it starts in is the one mapped.
    fn base(&self, start: u64, offset: u64) -> Option<u64> {
        let &(off, vaddr, _) = self
            .loads
            .iter()
            .filter(|&&(off, _, size)| off & !0xfff <= offset && offset < off.saturating_add(size))
            .max_by_key(|l| l.0)?;
        let svma = if offset >= off {
            vaddr.checked_add(offset - off)?
        } else {
            vaddr.checked_sub(off - offset)?
        };
        start.checked_sub(svma)
    }
}

type Kept = HashMap<(u64, u64), Result<Arc<Tables>, String>>;

thread_local! {
    /// Each worker's files' tables, by device and inode.
    static KEPT: RefCell<(Kept, u64)> = RefCell::new((HashMap::new(), 0));
}

/// A file's tables, read once per worker (a failure too: it says why
/// once).
fn tables(f: &File) -> Result<Arc<Tables>, String> {
    let md = f.metadata().map_err(|e| e.to_string())?;
    let id = (md.dev(), md.ino());
    KEPT.with(|k| {
        let mut k = k.borrow_mut();
        if let Some(t) = k.0.get(&id) {
            return t.clone();
        }
        let t = Tables::read(f).map(Arc::new);
        let size = t.as_ref().map_or(0, |t| t.bytes());
        if k.1.saturating_add(size) > MAX_KEPT_BYTES {
            *k = (HashMap::new(), 0);
        }
        k.1 += size;
        k.0.insert(id, t.clone());
        t
    })
}

/// A mapping of code, as `code_files` holds it.
pub struct Mapping<'a> {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: &'a str,
    pub file: &'a File,
}

/// One process's modules, ready to unwind its stacks.
pub struct Process {
    unwinder: UnwinderX86_64<Bytes>,
    /// The address ranges whose files have unwind tables.
    cfi: Vec<Range<u64>>,
    /// Files whose tables could not be read, and why.
    pub failed: Vec<String>,
}

/// A stack unwound: its addresses (the first where the thread was, the
/// others return addresses) each with how it was found, and why the
/// unwinding stopped where it did not reach the stack's root.
#[derive(Debug, Default, PartialEq)]
pub struct Unwound {
    pub frames: Vec<(u64, &'static str)>,
    pub stopped: Option<String>,
}

impl Process {
    pub fn new<'a>(maps: impl IntoIterator<Item = Mapping<'a>>) -> Process {
        let mut p = Process {
            unwinder: UnwinderX86_64::new(),
            cfi: Vec::new(),
            failed: Vec::new(),
        };
        for m in maps {
            let t = match tables(m.file) {
                Ok(t) => t,
                Err(e) => {
                    p.failed.push(super::bounded(&format!(
                        "{}: unwind tables not read: {e}",
                        m.path
                    )));
                    continue;
                }
            };
            let Some(base) = t.base(m.start, m.offset) else {
                continue;
            };
            if t.has_cfi() {
                p.cfi.push(m.start..m.end);
            }
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: t.text.clone(),
                got_svma: t.got.clone(),
                eh_frame_svma: t.eh_frame.as_ref().map(|e| e.0.clone()),
                eh_frame: t.eh_frame.as_ref().map(|e| e.1.clone()),
                eh_frame_hdr_svma: t.eh_frame_hdr.as_ref().map(|e| e.0.clone()),
                eh_frame_hdr: t.eh_frame_hdr.as_ref().map(|e| e.1.clone()),
                debug_frame: t.debug_frame.clone(),
                text: None,
                stubs_svma: None,
                stub_helper_svma: None,
                unwind_info: None,
                text_segment_svma: None,
                text_segment: None,
            };
            p.unwinder
                .add_module(Module::new(m.path.to_string(), m.start..m.end, base, info));
        }
        p
    }

    /// Unwinds one stack from its registers and copy (`stack`, the bytes
    /// at `sp` and above).
    pub fn unwind(&self, ip: u64, sp: u64, bp: u64, stack: &[u8]) -> Unwound {
        let mut read = |addr: u64| -> Result<u64, ()> {
            let at = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
            let b = stack.get(at..at.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(b.try_into().map_err(|_| ())?))
        };
        let mut cache = CacheX86_64::new();
        let regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut it = self.unwinder.iter_frames(ip, regs, &mut cache, &mut read);
        let mut out = Unwound::default();
        let mut callee: Option<u64> = None;
        while out.frames.len() < MAX_UNWOUND {
            match it.next() {
                Ok(Some(a)) => {
                    let how = match (a, callee) {
                        (FrameAddress::InstructionPointer(_), _) | (_, None) => FOUND_IP,
                        (_, Some(c)) if self.cfi.iter().any(|r| r.contains(&c)) => FOUND_CFI,
                        _ => FOUND_FP,
                    };
                    callee = Some(a.address_for_lookup());
                    out.frames.push((a.address(), how));
                }
                Ok(None) => break,
                Err(e) => {
                    out.stopped = Some(stop_text(e, stack.len()));
                    break;
                }
            }
        }
        out
    }
}

/// A new stack's key and copy, from a `STACK_COPIES` record.
pub fn from_record(rec: &[u8]) -> Option<(trainbpf_common::StackKey, CopyMsg)> {
    use trainbpf_common::{STACK_COPY_BYTES, StackCopy};
    let key_len = size_of::<trainbpf_common::StackKey>();
    if rec.len() < size_of::<StackCopy>() {
        return None;
    }
    // SAFETY: a `StackKey` is plain integers, read unaligned from a record
    // at least as long as a `StackCopy`.
    let key = unsafe { std::ptr::read_unaligned(rec.as_ptr().cast::<trainbpf_common::StackKey>()) };
    let word = |i: usize| {
        let at = key_len + 8 * i;
        u64::from_ne_bytes(rec[at..at + 8].try_into().unwrap_or_default())
    };
    let len = (word(3) as usize).min(STACK_COPY_BYTES);
    let data_at = key_len + 32;
    Some((
        key,
        CopyMsg {
            ip: word(0),
            sp: word(1),
            bp: word(2),
            data: rec[data_at..data_at + len].to_vec(),
        },
    ))
}

/// A `found` value as the constant it names (frame pointer if unknown).
pub fn how_of(h: &str) -> &'static str {
    [FOUND_IP, FOUND_SP, FOUND_FP, FOUND_CFI]
        .into_iter()
        .find(|c| *c == h)
        .unwrap_or(FOUND_FP)
}

/// Unwinds one stack's copy with `p`'s tables and puts the result in
/// place of its walk (`ips`, `hows`); what to say where it could not.
pub fn apply(
    p: &Process,
    ips: &mut Vec<u64>,
    hows: &mut Vec<&'static str>,
    c: &CopyMsg,
) -> Option<String> {
    if c.data.is_empty() {
        return Some("frame pointers only: the user stack could not be copied".into());
    }
    let un = p.unwind(c.ip, c.sp, c.bp, &c.data);
    if un.frames.len() < 2 {
        let why = un
            .stopped
            .clone()
            .unwrap_or_else(|| "no caller found".into());
        return Some(super::bounded(&format!(
            "frame pointers only: not unwound by the tables ({why})"
        )));
    }
    let fp: Vec<(u64, &'static str)> = ips.iter().copied().zip(hows.iter().copied()).collect();
    let merged = merge(&fp, &un);
    *ips = merged.iter().map(|f| f.0).collect();
    *hows = merged.iter().map(|f| f.1).collect();
    None
}

/// Why an unwinding stopped, for the report.
fn stop_text(e: framehop::Error, copied: usize) -> String {
    match e {
        framehop::Error::CouldNotReadStack(_) => {
            format!("unwound to the end of the {copied} bytes of stack copied")
        }
        e => format!("unwinding stopped: {e}"),
    }
}

/// A stack by frame pointers (`fp`, with how each was found) and the same
/// stack unwound by the tables: the unwound one where it has more than
/// the innermost frame, and past its end the frame-pointer walk's frames
/// beyond the last one both found (a deep stack outruns the copy). The
/// frame-pointer walk alone where the unwinding found nothing.
pub fn merge(fp: &[(u64, &'static str)], unwound: &Unwound) -> Vec<(u64, &'static str)> {
    if unwound.frames.len() < 2 {
        return fp.to_vec();
    }
    let mut out = unwound.frames.clone();
    if unwound.stopped.is_some()
        && let Some(&(last, _)) = out.last()
        && let Some(at) = fp.iter().skip(1).position(|&(a, _)| a == last)
    {
        out.extend_from_slice(&fp[at + 2..]);
    }
    out.truncate(MAX_UNWOUND);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(frames: &[(u64, &'static str)], stopped: bool) -> Unwound {
        Unwound {
            frames: frames.to_vec(),
            stopped: stopped.then(|| "x".into()),
        }
    }

    #[test]
    fn the_unwound_stack_wins_and_the_walk_extends_it() {
        let fp = [(1, FOUND_IP), (3, FOUND_FP), (4, FOUND_FP), (5, FOUND_FP)];
        // Unwinding found the frame the walk skipped (2), and stopped at 3.
        let un = u(&[(1, FOUND_IP), (2, FOUND_CFI), (3, FOUND_CFI)], true);
        assert_eq!(
            merge(&fp, &un),
            vec![
                (1, FOUND_IP),
                (2, FOUND_CFI),
                (3, FOUND_CFI),
                (4, FOUND_FP),
                (5, FOUND_FP)
            ]
        );
        // Reached the root: nothing is added.
        let un = u(&[(1, FOUND_IP), (2, FOUND_CFI), (3, FOUND_CFI)], false);
        assert_eq!(merge(&fp, &un).len(), 3);
        // The walk's garbage past a frameless function is not taken.
        let fp = [(1, FOUND_IP), (99, FOUND_FP), (98, FOUND_FP)];
        let un = u(&[(1, FOUND_IP), (2, FOUND_CFI)], true);
        assert_eq!(merge(&fp, &un), vec![(1, FOUND_IP), (2, FOUND_CFI)]);
        // Nothing unwound: the walk.
        assert_eq!(merge(&fp, &u(&[(1, FOUND_IP)], true)), fp.to_vec());
    }

    /// Segments as a linker lays them out (this test binary's): a code
    /// mapping starts a page below its segment, and one may start past a
    /// segment's first page.
    #[test]
    fn a_mapping_finds_its_segment() {
        let t = Tables {
            text: None,
            got: None,
            eh_frame: None,
            eh_frame_hdr: None,
            debug_frame: None,
            loads: vec![(0, 0, 0x355560), (0x355560, 0x356560, 0x9045d0)],
        };
        assert_eq!(t.base(0x7000_0000, 0x355000), Some(0x7000_0000 - 0x356000));
        assert_eq!(t.base(0x7000_1000, 0x356000), Some(0x7000_1000 - 0x357000));
        assert_eq!(t.base(0x7000_0000, 0), Some(0x7000_0000));
        assert_eq!(t.base(0x7000_0000, 0x10_000_000), None);
    }

    /// This test's own stack, copied and unwound with the tables of the
    /// files this process maps: it reaches the test's function and past it.
    #[test]
    #[inline(never)]
    fn unwinds_its_own_stack() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let mut files = Vec::new();
        for line in maps.lines() {
            let Some(m) = crate::record::samplers::procfs::maps_line(line) else {
                continue;
            };
            let path = line.split_whitespace().nth(5).unwrap_or("");
            if !line.split_whitespace().nth(1).unwrap_or("").contains('x') || !path.starts_with('/')
            {
                continue;
            }
            let Some(off) = line
                .split_whitespace()
                .nth(2)
                .and_then(|o| u64::from_str_radix(o, 16).ok())
            else {
                continue;
            };
            let Ok(f) = File::open(path) else { continue };
            files.push((m.start, m.end, off, path.to_string(), f));
        }
        let p = Process::new(files.iter().map(|(s, e, o, path, f)| Mapping {
            start: *s,
            end: *e,
            offset: *o,
            path,
            file: f,
        }));
        let (ip, sp, bp, stack) = here();
        let un = p.unwind(ip, sp, bp, &stack);
        let me = unwinds_its_own_stack as *const () as usize as u64;
        // The return address into this test lies in its body, after `me`.
        assert!(
            un.frames
                .iter()
                .skip(1)
                .any(|&(a, how)| a > me && a < me + 4096 && how == FOUND_CFI),
            "{un:?} (test at {me:#x})"
        );
    }

    /// The registers and 16 KiB of stack at a call from the test.
    #[inline(never)]
    fn here() -> (u64, u64, u64, Vec<u8>) {
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: reads three registers, writes nothing.
        unsafe {
            std::arch::asm!(
                "lea {ip}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                ip = out(reg) ip,
                sp = out(reg) sp,
                bp = out(reg) bp,
            );
        }
        let mut stack = vec![0u8; 16384];
        // SAFETY: the live stack above this frame, well within the thread's.
        unsafe { std::ptr::copy_nonoverlapping(sp as *const u8, stack.as_mut_ptr(), 4096) };
        stack.truncate(4096);
        (ip, sp, bp, stack)
    }
}
