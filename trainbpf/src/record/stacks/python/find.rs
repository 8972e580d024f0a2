//! Which mapped file of a process holds its CPython: `libpython3.x.so`
//! when the interpreter is a shared library, else the executable itself
//! (Debian's `python3.11` links it statically). The file is read through
//! `/proc/PID/map_files`, which names the very file mapped, never through
//! a path the process could have replaced since.

use std::{
    fs::{self, File},
    os::unix::fs::MetadataExt as _,
};

use object::{
    Object as _, ObjectSection as _, ObjectSegment as _, ObjectSymbol as _, ReadRef as _,
};

use super::PyError;
use crate::record::samplers::procfs::backing::Backing;

/// One file-backed mapping of /proc/PID/maps.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub dev: u64,
    pub inode: u64,
    pub path: String,
}

/// The file-backed lines of a maps file.
pub fn mappings(maps: &str) -> Vec<Mapping> {
    maps.lines()
        .filter_map(|line| {
            let m = crate::record::samplers::procfs::maps_line(line)?;
            let offset = u64::from_str_radix(line.split(' ').nth(2)?, 16).ok()?;
            (m.inode != 0).then(|| Mapping {
                start: m.start,
                end: m.end,
                offset,
                dev: m.dev,
                inode: m.inode,
                path: m.path.to_string(),
            })
        })
        .collect()
}

/// The interpreter's file as the process maps it.
#[derive(Debug)]
pub struct Located {
    pub path: String,
    /// Load address minus the ELF's link-time address.
    pub bias: u64,
    /// `_PyRuntime`, in the process.
    pub runtime: u64,
    /// `Py_Version` (3.11 on), in the process.
    pub py_version: Option<u64>,
    /// Where the interpreter is a `libpython`: how the kernel finds it in
    /// a later exec of the same executable, through the dynamic loader's
    /// list (`py/exes.rs`).
    pub link: Option<LibLink>,
}

/// How to find a `libpython` in a process from its executable alone:
/// the loader's `r_debug`, whose address it writes into the executable's
/// `DT_DEBUG` entry, lists each loaded object's load bias (`l_addr`) and
/// dynamic section (`l_ld`); the one whose `l_ld - l_addr` is the
/// library's link-time dynamic section is the library.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LibLink {
    /// The library's `.dynamic`, link-time address.
    pub dynamic: u64,
    /// The executable's `DT_DEBUG` value, relative to where its code is
    /// loaded (the kernel's `mm->start_code`: the lowest executable
    /// segment's address plus the bias).
    pub debug_slot: u64,
    /// `_PyRuntime`, link-time address in the library.
    pub runtime: u64,
}

/// `3.x` from a file name: `libpython3.10.so.1.0`, `python3.9`,
/// `libpython3.6m.so`.
pub fn version_from_name(path: &str) -> Option<(u8, u8)> {
    let base = path.rsplit('/').next()?;
    let rest = &base[base.find("python")? + "python".len()..];
    let (major, rest) = rest.split_once('.')?;
    let minor: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((major.parse().ok()?, minor.parse().ok()?))
}

pub(crate) fn is_libpython(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|b| b.starts_with("libpython3") && b.contains(".so"))
}

/// Files tried for one process: a CPython maps one `libpython` and its
/// executable; a job that maps dozens is not read past these (each is a
/// descriptor handed to the namer in one message).
const MAX_CANDIDATES: usize = 8;

/// A file that may hold the interpreter: every mapping of it, and the
/// file itself as mapped (or why it could not be opened).
#[derive(Debug)]
pub struct Candidate {
    pub whole: Vec<Mapping>,
    pub file: Result<File, String>,
}

/// The recorder's half of a look-up: which files of `pid` may hold its
/// interpreter (each `libpython3.x.so`, then the executable), opened as
/// mapped. Nothing in them is read here; a file on FUSE (`backing`) is
/// not opened at all.
pub fn candidates(pid: u32, backing: &Backing) -> Result<Vec<Candidate>, PyError> {
    let proc_err = |what, source| PyError::Process { pid, what, source };
    if crate::record::samplers::procfs::runs_the_recorder(pid) {
        return Err(PyError::NotPython { pid });
    }
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| proc_err("read its maps", e))?;
    let exe = fs::metadata(format!("/proc/{pid}/exe")).map_err(|e| proc_err("stat its exe", e))?;
    let maps = mappings(&maps);
    // The lowest mapping of each file, in the order tried.
    let mut files: Vec<&Mapping> = Vec::new();
    let libs = maps.iter().filter(|m| is_libpython(&m.path));
    let exes = maps
        .iter()
        .filter(|m| (m.dev, m.inode) == (exe.dev(), exe.ino()));
    for m in libs.chain(exes) {
        if files.len() < MAX_CANDIDATES
            && !files.iter().any(|f| (f.dev, f.inode) == (m.dev, m.inode))
        {
            files.push(m);
        }
    }
    let mut out = Vec::new();
    for first in &files {
        let whole: Vec<Mapping> = maps
            .iter()
            .filter(|m| (m.dev, m.inode) == (first.dev, first.inode))
            .cloned()
            .collect();
        if let Some(fs) = backing.dev(first.dev) {
            crate::record::samplers::procfs::guard::STATS.add(
                crate::record::samplers::procfs::guard::Count::FuseSkipped,
                1,
            );
            crate::record::samplers::procfs::guard::STATS.note(|| {
                format!("pid {pid}: its interpreter's file lies on a {fs} filesystem: not read")
            });
            return Err(PyError::FileStalls {
                path: first.path.clone(),
                fs: fs.to_string(),
            });
        }
        let file = match whole
            .iter()
            .filter(|m| m.offset == 0)
            .min_by_key(|m| m.start)
        {
            Some(head) => open_mapped(pid, head),
            None => Err("its first page is not mapped".into()),
        };
        out.push(Candidate { whole, file });
    }
    Ok(out)
}

/// The namer's half: finds `_PyRuntime` in the first candidate that has
/// it, parsing each file's ELF (the job's file: not done as root).
pub fn locate_in(pid: u32, candidates: Vec<Candidate>) -> Result<Located, PyError> {
    let mut lib_error = None;
    let mut candidates = candidates;
    for i in 0..candidates.len() {
        let file = std::mem::replace(&mut candidates[i].file, Err(String::new()));
        let lib = is_libpython(&candidates[i].whole[0].path);
        match in_file(&candidates[i].whole, file) {
            Ok(mut found) => {
                // A libpython's link needs the executable's dynamic
                // section: the executable is a later candidate.
                let exe = candidates
                    .iter_mut()
                    .find(|c| !is_libpython(&c.whole[0].path))
                    .and_then(|c| std::mem::replace(&mut c.file, Err(String::new())).ok());
                found.link = match (lib, found.link, exe) {
                    (true, Some(l), Some(exe)) => debug_slot(exe).ok().map(|slot| LibLink {
                        debug_slot: slot,
                        ..l
                    }),
                    _ => None,
                };
                return Ok(found);
            }
            Err(e) if lib => lib_error = Some(e),
            Err(PyError::NoRuntime { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Err(lib_error.unwrap_or(PyError::NotPython { pid }))
}

/// `_PyRuntime` in one mapped file, whose mappings are `whole`.
fn in_file(whole: &[Mapping], file: Result<File, String>) -> Result<Located, PyError> {
    let path = whole[0].path.clone();
    let elf_err = |reason: String| PyError::Elf {
        path: path.clone(),
        reason,
    };
    let head = whole
        .iter()
        .filter(|m| m.offset == 0)
        .min_by_key(|m| m.start)
        .ok_or_else(|| elf_err("its first page is not mapped".into()))?;
    let file = file.map_err(&elf_err)?;
    let data = object::ReadCache::new(file);
    let obj = object::File::parse(&data).map_err(|e| elf_err(format!("not an ELF file: {e}")))?;
    let symbol = |name: &str| {
        obj.dynamic_symbols()
            .chain(obj.symbols())
            .find(|s| s.is_definition() && s.name() == Ok(name))
            .map(|s| s.address())
    };
    let Some(runtime) = symbol("_PyRuntime") else {
        return Err(PyError::NoRuntime {
            path,
            reason: "no _PyRuntime symbol (CPython before 3.7, or its symbols stripped)".into(),
        });
    };
    let first_load = obj
        .segments()
        .find(|s| s.file_range().0 == 0)
        .ok_or_else(|| elf_err("no loadable segment at file offset 0".into()))?;
    let bias = head.start.wrapping_sub(first_load.address() & !0xfff);
    // Kept whole by `locate_in` only for a libpython (its `debug_slot`
    // from the executable).
    let link = obj.section_by_name(".dynamic").map(|d| LibLink {
        dynamic: d.address(),
        debug_slot: 0,
        runtime,
    });
    Ok(Located {
        runtime: bias.wrapping_add(runtime),
        py_version: symbol("Py_Version").map(|a| bias.wrapping_add(a)),
        bias,
        path,
        link,
    })
}

/// `DT_DEBUG`.
const DT_DEBUG: i64 = 21;
/// `.dynamic` entries read at most: a real executable has a few dozen.
const DYNAMIC_ENTRIES: u64 = 4096;
/// `PF_X`.
const PF_X: u32 = 1;

/// Where an executable's `DT_DEBUG` value lies, relative to the lowest
/// address of its executable segments (what the kernel calls the
/// process's `start_code`, less the bias).
fn debug_slot(file: File) -> Result<u64, String> {
    use object::SegmentFlags;
    let data = object::ReadCache::new(file);
    let obj = object::File::parse(&data).map_err(|e| e.to_string())?;
    if obj.endianness() != object::Endianness::Little || !obj.is_64() {
        return Err("not a 64-bit little-endian ELF".into());
    }
    let code = obj
        .segments()
        .filter(|s| matches!(s.flags(), SegmentFlags::Elf { p_flags } if p_flags & PF_X != 0))
        .map(|s| s.address())
        .min()
        .ok_or("no executable segment")?;
    let dynamic = obj.section_by_name(".dynamic").ok_or("no .dynamic")?;
    // The job's file says how large its section is: only the first
    // DYNAMIC_ENTRIES entries are read, whatever it claims (a sparse file
    // can claim terabytes).
    let (offset, size) = dynamic.file_range().ok_or(".dynamic has no file data")?;
    let bytes = (&data)
        .read_bytes_at(offset, size.min(DYNAMIC_ENTRIES * 16))
        .map_err(|()| format!(".dynamic at file offset {offset:#x} is not in the file"))?;
    // Each entry: d_tag (i64), d_un (u64).
    let at = bytes
        .chunks_exact(16)
        .position(|e| i64::from_le_bytes(e[..8].try_into().unwrap_or_default()) == DT_DEBUG)
        .ok_or("no DT_DEBUG entry")?;
    let slot = dynamic.address() + at as u64 * 16 + 8;
    slot.checked_sub(code)
        .ok_or_else(|| "DT_DEBUG below the code".into())
}

/// The file mapped at `m`, checked to be the regular file the maps line
/// names.
fn open_mapped(pid: u32, m: &Mapping) -> Result<File, String> {
    let link = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
    let file = File::open(&link).map_err(|e| format!("{link}: {e}"))?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() || (meta.dev(), meta.ino()) != (m.dev, m.inode) {
        return Err(format!(
            "{link} is no longer the file the maps line names (device {} inode {})",
            m.dev, m.inode
        ));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An executable whose `.dynamic` claims a terabyte, in a sparse file
    /// that long: its `DT_DEBUG` slot is found from the first entries, and
    /// nothing near the claim is read.
    #[test]
    fn a_dynamic_section_claiming_a_terabyte_reads_its_first_entries() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let dir = std::env::temp_dir().join(format!("trainbpf-dynamic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (plain, huge) = (dir.join("plain"), dir.join("huge"));
        std::fs::write(&plain, &exe).unwrap();
        let want = debug_slot(File::open(&plain).unwrap()).expect("a PIE test binary has DT_DEBUG");
        let obj = object::File::parse(&*exe).unwrap();
        let index = obj.section_by_name(".dynamic").unwrap().index().0 as u64;
        let u = |at: usize, n: usize| {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&exe[at..at + n]);
            u64::from_le_bytes(b)
        };
        let (shoff, shentsize) = (u(0x28, 8), u(0x3a, 2));
        let size_at = (shoff + index * shentsize + 0x20) as usize;
        let mut patched = exe.clone();
        patched[size_at..size_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        std::fs::write(&huge, &patched).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&huge).unwrap();
        f.set_len(1 << 40).unwrap();
        assert_eq!(debug_slot(File::open(&huge).unwrap()), Ok(want));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn versions_from_file_names() {
        assert_eq!(
            version_from_name("/x/lib/libpython3.10.so.1.0"),
            Some((3, 10))
        );
        assert_eq!(version_from_name("/usr/bin/python3.9"), Some((3, 9)));
        assert_eq!(version_from_name("libpython3.6m.so.1.0"), Some((3, 6)));
        assert_eq!(version_from_name("/usr/bin/python3"), None);
        assert_eq!(version_from_name("/usr/bin/sleep"), None);
    }

    #[test]
    fn file_mappings_with_their_offsets() {
        let maps = "\
00400000-00420000 r--p 00000000 fe:01 1234                               /usr/bin/python3.11
00420000-00600000 r-xp 00020000 fe:01 1234                               /usr/bin/python3.11
7f00000000-7f00001000 rw-p 00000000 00:00 0 
7f10000000-7f10100000 r--p 00000000 fe:01 99 /root/lib/my lib/libpython3.12.so.1.0
";
        let m = mappings(maps);
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(m[1].offset, 0x20000);
        assert_eq!(m[2].path, "/root/lib/my lib/libpython3.12.so.1.0");
        assert!(is_libpython(&m[2].path));
        assert!(!is_libpython(&m[0].path));
    }
}
