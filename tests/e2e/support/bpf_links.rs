//! What a process has attached, as the kernel tells it: each BPF link the
//! process holds a descriptor of, with its tracepoint's name. A test asks
//! the kernel, not the recorder's account of itself.

use std::os::fd::{FromRawFd, OwnedFd};

/// `enum bpf_cmd` (uapi/linux/bpf.h).
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
/// `enum bpf_link_type`.
const BPF_LINK_TYPE_RAW_TRACEPOINT: u32 = 1;
const BPF_LINK_TYPE_PERF_EVENT: u32 = 7;
const BPF_LINK_TYPE_UPROBE_MULTI: u32 = 12;
/// `BPF_F_UPROBE_MULTI_RETURN`.
const UPROBE_MULTI_RETURN: u32 = 1;
/// `enum bpf_perf_event_type`.
const BPF_PERF_EVENT_TRACEPOINT: u32 = 5;

/// A link's kind and the tracepoint it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// A BTF or raw tracepoint (`tp_btf`, `raw_tp`).
    Raw(String),
    /// A classic tracepoint, through a perf event.
    Tracepoint(String),
    /// A `uprobe_multi` link: how many offsets it probes, and whether they
    /// are return probes.
    UprobeMulti { count: u32, ret: bool },
    /// Anything else (uprobes, kprobes, tracing programs), by its
    /// `bpf_link_type`.
    Other(u32),
}

fn bpf(cmd: libc::c_long, attr: &mut [u8]) -> libc::c_long {
    // SAFETY: `attr` is a live buffer of the length passed, laid out as the
    // command's `union bpf_attr` member.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) }
}

/// Link `id`'s kind and tracepoint name, or `None` if it is gone.
fn link_info(id: u32) -> Option<Link> {
    let mut attr = [0u8; 16];
    attr[0..4].copy_from_slice(&id.to_ne_bytes());
    let fd = bpf(BPF_LINK_GET_FD_BY_ID, &mut attr);
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just made this descriptor for us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // `struct bpf_link_info`: type, id, prog_id, then (at 16) the union.
    // A raw tracepoint's name pointer and length sit at 16 and 24; a perf
    // event's kind at 16 and its tracepoint's name pointer and length at
    // 24 and 32.
    let mut name = [0u8; 128];
    let mut info = [0u8; 128];
    let mut attr = [0u8; 16];
    let fill = |info: &mut [u8; 128], at: usize, name: &mut [u8; 128]| {
        info[at..at + 8].copy_from_slice(&(name.as_mut_ptr() as u64).to_ne_bytes());
        info[at + 8..at + 12].copy_from_slice(&(name.len() as u32).to_ne_bytes());
    };
    let query = |info: &mut [u8; 128], attr: &mut [u8; 16]| {
        use std::os::fd::AsRawFd;
        attr[0..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
        attr[4..8].copy_from_slice(&(info.len() as u32).to_ne_bytes());
        attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
        bpf(BPF_OBJ_GET_INFO_BY_FD, attr) == 0
    };
    let word = |b: &[u8], at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
    let text =
        |n: &[u8]| String::from_utf8_lossy(n.split(|&b| b == 0).next().unwrap()).into_owned();
    // First with no name buffer: the kind says where the name goes.
    if !query(&mut info, &mut attr) {
        return None;
    }
    match word(&info, 0) {
        BPF_LINK_TYPE_RAW_TRACEPOINT => {
            info = [0; 128];
            fill(&mut info, 16, &mut name);
            query(&mut info, &mut attr).then(|| Link::Raw(text(&name)))
        }
        BPF_LINK_TYPE_PERF_EVENT if word(&info, 16) == BPF_PERF_EVENT_TRACEPOINT => {
            info = [0; 128];
            fill(&mut info, 24, &mut name);
            query(&mut info, &mut attr).then(|| Link::Tracepoint(text(&name)))
        }
        // `uprobe_multi`: path, offsets, ref_ctr_offsets and cookies (8
        // bytes each, at 16), then path_size, count and flags.
        BPF_LINK_TYPE_UPROBE_MULTI => Some(Link::UprobeMulti {
            count: word(&info, 52),
            ret: word(&info, 56) & UPROBE_MULTI_RETURN != 0,
        }),
        other => Some(Link::Other(other)),
    }
}

/// Every BPF link process `pid` holds a descriptor of.
pub fn bpf_links_of(pid: u32) -> Vec<Link> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    fds.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("link_id:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .filter_map(link_info)
        .collect()
}
