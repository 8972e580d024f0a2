//! The CUDA uprobes loaded a second way, for `uprobe_multi` links (Linux
//! 6.6): one link per program and library, holding every offset that
//! program probes in that library.
//!
//! A perf-event uprobe's release takes the kernel's `event_mutex` and waits
//! out the tracing grace periods under it, about 87 ms a link here. The 44
//! links of one driver library held the recorder 4 s past its job, one
//! after another whatever the threads, and a second recorder's attach
//! waited on the same lock. A multi link's release takes no such lock, so
//! released on threads of their own (record/links.rs) the waits overlap.
//!
//! aya 0.14 loads a uprobe with no expected attach type, which the kernel's
//! multi link refuses, and it has no multi link. So the programs' code is
//! taken from the same object with aya-obj (aya's own parser), relocated to
//! the maps aya created (the frozen globals included), and loaded here with
//! `BPF_TRACE_UPROBE_MULTI`. Only these programs are: every other one stays
//! aya's.

use std::{
    collections::HashMap,
    ffi::{CStr, CString},
    os::{
        fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

use crate::util::phases;
use aya::{
    Btf, Ebpf,
    maps::{Map, MapData},
};
use aya_obj::{
    Object, ProgramSection,
    btf::BtfKind,
    generated::{
        BPF_F_UPROBE_MULTI_RETURN, bpf_attach_type, bpf_attr, bpf_cmd, bpf_insn, bpf_prog_type,
    },
};

/// Test switch: the perf-event uprobes, as on a kernel before 6.6.
pub const ENV_OFF: &str = "TRAINBPF_TEST_NO_UPROBE_MULTI";

/// The uprobe programs of the object, loaded for multi links.
pub struct UprobeMulti {
    progs: HashMap<String, Prog>,
}

struct Prog {
    fd: OwnedFd,
    /// A `uretprobe`: its links are return probes.
    ret: bool,
}

impl UprobeMulti {
    /// Loads every uprobe program of `object` (the bytes aya loaded into
    /// `ebpf`), relocated to `ebpf`'s maps: call it before any map is
    /// taken out. `Err` says why not, for the fallback's line: a kernel
    /// without multi links, or a program it refused.
    pub fn load(ebpf: &Ebpf, object: &[u8], btf: &Btf) -> Result<UprobeMulti, String> {
        // A test's way to the fallback on a kernel that has multi links.
        if std::env::var_os(ENV_OFF).is_some() {
            return Err(format!("turned off by {ENV_OFF}"));
        }
        if btf
            .id_by_type_name_kind("bpf_uprobe_multi_link", BtfKind::Struct)
            .is_err()
        {
            return Err("the kernel has no uprobe_multi links (Linux 6.6 and later)".into());
        }
        let mut obj = Object::parse(object).map_err(|e| format!("parsing the object: {e}"))?;
        obj.relocate_btf(btf)
            .map_err(|e| format!("relocating the object: {e}"))?;
        // The map definitions, out of the object so that it can be
        // relocated against them; the descriptors are aya's.
        let defs = std::mem::take(&mut obj.maps);
        let fds: Vec<(&str, RawFd, &aya_obj::Map)> = ebpf
            .maps()
            .filter_map(|(name, m)| {
                let def = defs.get(name)?;
                Some((name, data(m).fd().as_fd().as_raw_fd(), def))
            })
            .collect();
        let text = obj.functions.keys().map(|(section, _)| *section).collect();
        obj.relocate_maps(fds.into_iter(), &text)
            .map_err(|e| format!("relocating the object's maps: {e}"))?;
        obj.relocate_calls(&text)
            .map_err(|e| format!("relocating the object's calls: {e}"))?;
        let mut progs = HashMap::new();
        for (name, p) in &obj.programs {
            let ret = match p.section {
                ProgramSection::UProbe { .. } => false,
                ProgramSection::URetProbe { .. } => true,
                _ => continue,
            };
            let f = obj
                .functions
                .get(&p.function_key())
                .ok_or_else(|| format!("program {name}: its code is missing from the object"))?;
            let fd = phases::verify(|| prog_load(name, &f.instructions, &obj.license))
                .map_err(|e| format!("{name}: {e}"))?;
            progs.insert(name.clone(), Prog { fd, ret });
        }
        if progs.is_empty() {
            return Err("the object has no uprobe programs".into());
        }
        Ok(UprobeMulti { progs })
    }

    /// Probes `offsets` in the file `target` (a descriptor's
    /// `/proc/self/fd/N`) with the program `prog`, on every process that
    /// runs them; dropping the link detaches them all.
    pub fn attach(&self, prog: &str, target: &Path, offsets: &[u64]) -> Result<OwnedFd, String> {
        let p = self
            .progs
            .get(prog)
            .ok_or_else(|| format!("program {prog} missing from the object"))?;
        if offsets.is_empty() {
            return Err("no offset to probe".into());
        }
        let path = CString::new(target.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: bpf_attr is plain integers; zero is every field's unset.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // SAFETY: writing fields of the union's member for this command.
        unsafe {
            let lc = &mut attr.link_create;
            lc.__bindgen_anon_1.prog_fd = p.fd.as_raw_fd() as u32;
            lc.attach_type = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
            let u = &mut lc.__bindgen_anon_3.uprobe_multi;
            u.path = path.as_ptr() as u64;
            u.offsets = offsets.as_ptr() as u64;
            u.cnt = offsets.len() as u32;
            u.flags = if p.ret { BPF_F_UPROBE_MULTI_RETURN } else { 0 };
        }
        // `path` and `offsets` outlive the call, which copies them.
        phases::attach(|| bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)).map_err(|e| e.to_string())
    }
}

/// `BPF_PROG_LOAD` of one kprobe-type program for multi uprobe links. A
/// refusal is retried with the verifier's log, whose last line says why.
fn prog_load(name: &str, insns: &[bpf_insn], license: &CStr) -> Result<OwnedFd, String> {
    let load = |log: &mut [u8]| {
        // SAFETY: as in `attach`.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // SAFETY: writing fields of the union's member for this command.
        unsafe {
            let u = &mut attr.__bindgen_anon_3;
            u.prog_type = bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32;
            u.expected_attach_type = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
            u.insns = insns.as_ptr() as u64;
            u.insn_cnt = insns.len() as u32;
            u.license = license.as_ptr() as u64;
            // The kernel's name: 15 bytes of letters, digits and '_'.
            for (d, s) in u.prog_name.iter_mut().zip(name.bytes().take(15)) {
                *d = if s.is_ascii_alphanumeric() { s } else { b'_' } as _;
            }
            if !log.is_empty() {
                u.log_level = 1;
                u.log_buf = log.as_mut_ptr() as u64;
                u.log_size = log.len() as u32;
            }
        }
        bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr)
    };
    load(&mut []).or_else(|first| {
        let mut log = vec![0u8; 1 << 20];
        load(&mut log).map_err(|_| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            match text.lines().rev().find(|l| !l.trim().is_empty()) {
                Some(last) => format!("{first}: {last}"),
                None => first.to_string(),
            }
        })
    })
}

/// The `bpf` system call for a command that returns a new descriptor.
fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a whole, initialized bpf_attr, and every pointer in
    // it is to memory the caller keeps alive across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_int,
            attr as *mut bpf_attr,
            size_of::<bpf_attr>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// The map's data, whatever its kind.
fn data(m: &Map) -> &MapData {
    match m {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    }
}
