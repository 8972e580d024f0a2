//! The namer's side: drops every privilege before it reads a byte, then
//! answers requests on its standard input (a socket to the recorder)
//! until the recorder closes it.

use std::{
    collections::HashMap,
    ffi::OsString,
    fs::File,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{fs::MetadataExt as _, net::UnixStream},
    },
};

use blazesym::symbolize::{
    Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};
use trainbpf_report::decode::stacks::Frame;

use super::{
    Answer, Ask, MapMsg, Named, PYTHON_ARG, Reply, Request, StackMsg, cpython::PyState, exit, recv,
    sandbox, send,
};
use crate::record::stacks::{
    symbolize::bounded,
    unwind::{self, Process},
};

/// The child's heap, at most: a library's line tables take tens of MiB.
const MAX_HEAP: u64 = 1 << 30;
/// Files kept open (their parsed symbols cached by blazesym under their
/// descriptor's path): past it, both are dropped.
const MAX_KEPT_FILES: usize = 512;

/// `trainbpf __name-frames UID GID [python]`: runs as that user, with
/// nothing more. With `python`, the CPython reader, which needs no C
/// library tables read ahead.
pub fn main(args: &[OsString]) -> i32 {
    let id = |i: usize| {
        args.get(i)
            .and_then(|a| a.to_str())
            .and_then(|s| s.parse::<u32>().ok())
    };
    let (Some(uid), Some(gid)) = (id(0), id(1)) else {
        return exit::USAGE;
    };
    if drop_privileges(uid, gid).is_err() {
        return exit::PRIVILEGES;
    }
    // SAFETY: fd 0 is the socket the recorder made for this process.
    let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(0) });
    let python = args.get(2).is_some_and(|a| a == PYTHON_ARG);
    let mut st = State::new();
    let mut py = PyState::default();
    if !python {
        st.warm();
    }
    // From here on, only what answering takes (the C library read above
    // opened files by path; requests bring their files as descriptors).
    if sandbox::confine().is_err() {
        return exit::SECCOMP;
    }
    loop {
        let Ok((bytes, fds)) = recv(&sock, None) else {
            return 0;
        };
        let Ok(ask) = serde_json::from_slice::<Ask>(&bytes) else {
            return exit::REQUEST;
        };
        let reply = match ask {
            Ask::Name(req) => Answer::Named(st.handle(req, fds)),
            Ask::Locate(m) => Answer::Located(Box::new(py.locate(*m, fds))),
            Ask::Resolve(m) => Answer::Resolved(Box::new(py.resolve(*m, fds))),
        };
        let Ok(out) = serde_json::to_vec(&reply) else {
            return exit::REQUEST;
        };
        if send(&sock, &out, &[]).is_err() {
            return 0;
        }
    }
}

/// No supplementary groups, the given ids, no capabilities left (checked;
/// the bounding set emptied too), `no_new_privs`, a bounded heap and no
/// core file.
fn drop_privileges(uid: u32, gid: u32) -> Result<(), ()> {
    // SAFETY: plain syscalls on this process's credentials and limits.
    unsafe {
        // Past the last capability the kernel knows, EINVAL: ignored.
        for cap in 0..64 {
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        let heap = libc::rlimit {
            rlim_cur: MAX_HEAP,
            rlim_max: MAX_HEAP,
        };
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::setrlimit(libc::RLIMIT_DATA, &heap) != 0
            || libc::setrlimit(libc::RLIMIT_CORE, &none) != 0
            || libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(gid, gid, gid) != 0
            || libc::setresuid(uid, uid, uid) != 0
            || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        {
            return Err(());
        }
    }
    // Leaving uid 0 clears the capability sets; where it did not (uid 0
    // itself asked for), the child does not go on.
    let status = std::fs::read_to_string("/proc/self/status").map_err(|_| ())?;
    let caps_clear = ["CapPrm:", "CapEff:", "CapAmb:", "CapBnd:"]
        .iter()
        .all(|k| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .is_some_and(|v| u64::from_str_radix(v.trim(), 16) == Ok(0))
        });
    if caps_clear { Ok(()) } else { Err(()) }
}

struct State {
    symbolizer: Symbolizer,
    /// Each file once, by device and inode: its descriptor's path stays
    /// the same across requests, so blazesym's cache of it stays right.
    kept: HashMap<(u64, u64), File>,
    /// Refusals said already.
    said: std::collections::HashSet<String>,
}

impl State {
    fn new() -> State {
        State {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(false)
                .build(),
            kept: HashMap::new(),
            said: std::collections::HashSet::new(),
        }
    }

    /// Reads the C library's symbols and line tables before the first
    /// request: nearly every job process maps the same file (the same
    /// inode, kept here under one descriptor, so the job's requests find
    /// it read). This process's own mapping of it, opened by the path its
    /// own maps give, as the unprivileged user it is now.
    fn warm(&mut self) {
        let addr = libc::malloc as *const () as usize as u64;
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
            return;
        };
        let Some((start, offset, path)) = maps.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            let (s, e) = it.next()?.split_once('-')?;
            let (start, end) = (
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            );
            let _ = it.next()?;
            let off = u64::from_str_radix(it.next()?, 16).ok()?;
            let path = it.nth(2)?;
            (start <= addr && addr < end && path.starts_with('/')).then_some((start, off, path))
        }) else {
            return;
        };
        let Ok(f) = File::open(path) else { return };
        let Ok(md) = f.metadata() else { return };
        let f = self.kept.entry((md.dev(), md.ino())).or_insert(f);
        let src = Source::Elf(Elf::new(format!("/proc/self/fd/{}", f.as_raw_fd())));
        let _ = self
            .symbolizer
            .symbolize(&src, Input::FileOffset(&[addr - start + offset]));
    }

    fn handle(&mut self, req: Request, fds: Vec<OwnedFd>) -> Reply {
        if self.kept.len() + fds.len() > MAX_KEPT_FILES {
            let said = std::mem::take(&mut self.said);
            *self = State::new();
            self.said = said;
        }
        let mut ids: Vec<Option<(u64, u64)>> = Vec::with_capacity(fds.len());
        for fd in fds {
            let f = File::from(fd);
            let id = f.metadata().ok().map(|m| (m.dev(), m.ino()));
            if let Some(id) = id {
                self.kept.entry(id).or_insert(f);
            }
            ids.push(id);
        }
        // Each opened file's descriptor, in order; a skipped one has none.
        let mut ids = ids.iter();
        let maps: Vec<(&MapMsg, Option<&File>)> = req
            .maps
            .iter()
            .filter_map(|m| {
                if m.skipped.is_some() {
                    return Some((m, None));
                }
                let id = ids.next()?.as_ref()?;
                Some((m, Some(self.kept.get(id)?)))
            })
            .collect();
        let process = req.stacks.iter().any(|s| s.copy.is_some()).then(|| {
            Process::new(maps.iter().filter_map(|(m, f)| {
                Some(unwind::Mapping {
                    start: m.start,
                    end: m.end,
                    offset: m.offset,
                    path: &m.path,
                    file: (*f)?,
                })
            }))
        });
        let stacks = req
            .stacks
            .into_iter()
            .map(|s| self.one(s, &maps, process.as_ref()))
            .collect();
        let mut refused = Vec::new();
        for f in process.iter().flat_map(|p| &p.failed) {
            if self.said.len() < 4096 && self.said.insert(f.clone()) {
                refused.push(f.clone());
            }
        }
        Reply { stacks, refused }
    }

    /// One stack: unwound by the tables where it came with a copy, then
    /// each address named from the file it lies in.
    fn one(&self, s: StackMsg, maps: &[(&MapMsg, Option<&File>)], p: Option<&Process>) -> Named {
        let mut ips = s.ips;
        let mut hows: Vec<&'static str> = s.hows.iter().map(|h| unwind::how_of(h)).collect();
        hows.resize(ips.len(), trainbpf_report::decode::stacks::FOUND_FP);
        let mut notes = Vec::new();
        if let (Some(c), Some(p)) = (&s.copy, p) {
            notes.extend(unwind::apply(p, &mut ips, &mut hows, c));
        }
        let mut first_miss: Option<String> = None;
        let frames: Vec<Frame> = ips
            .iter()
            .zip(&hows)
            .take(trainbpf_report::decode::stacks::MAX_FRAMES)
            .enumerate()
            .map(|(i, (&ip, how))| {
                let mut f = Frame {
                    kind: "native".into(),
                    addr: ip,
                    found: Some((*how).into()),
                    ..Default::default()
                };
                if let Err(why) = self.name(&mut f, i, maps) {
                    first_miss.get_or_insert(why);
                }
                f
            })
            .collect();
        if frames.iter().all(|f| f.function.is_none()) {
            notes.insert(
                0,
                format!(
                    "unsymbolized: {}",
                    first_miss.unwrap_or_else(|| "no frames".into())
                ),
            );
        }
        Named {
            frames,
            note: (!notes.is_empty()).then(|| bounded(&notes.join("; "))),
        }
    }

    /// Names one frame from the file it lies in (a return address looked
    /// up at its call, one byte before it).
    fn name(
        &self,
        f: &mut Frame,
        i: usize,
        maps: &[(&MapMsg, Option<&File>)],
    ) -> Result<(), String> {
        let addr = if i == 0 {
            f.addr
        } else {
            f.addr.saturating_sub(1)
        };
        let Some((m, file)) = maps.iter().find(|(m, _)| m.start <= addr && addr < m.end) else {
            return Err(
                "not in a file the process maps (taken before an exec, anonymous or generated code, or unmapped since)"
                    .into(),
            );
        };
        let Some(file) = file else {
            f.module = Some(bounded(&m.path));
            return Err(format!(
                "{} lies on a {} filesystem, whose server may never answer: not read",
                m.path,
                m.skipped.as_deref().unwrap_or("stalling")
            ));
        };
        let src = Source::Elf(Elf::new(format!("/proc/self/fd/{}", file.as_raw_fd())));
        let off = addr - m.start + m.offset;
        let syms = self
            .symbolizer
            .symbolize(&src, Input::FileOffset(&[off]))
            .map_err(|e| bounded(&format!("{}: {e}", m.path)))?;
        match syms.first() {
            Some(Symbolized::Sym(s)) => {
                f.function = Some(bounded(&s.name));
                f.file = s
                    .code_info
                    .as_ref()
                    .map(|c| bounded(&c.to_path().display().to_string()));
                f.line = s.code_info.as_ref().and_then(|c| c.line);
                f.module = Some(bounded(&m.path));
                Ok(())
            }
            Some(Symbolized::Unknown(r)) => {
                f.module = Some(bounded(&m.path));
                Err(format!("{r}"))
            }
            None => Err("no symbol".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The namer's own work, in this process: a function of this test
    /// binary named from its file, handed over as a descriptor of the
    /// mapped inode; an address in no file says so, and one in a file the
    /// recorder skipped (on FUSE, no descriptor) names the file and why.
    #[test]
    fn names_a_frame_from_a_descriptor() {
        if !crate::util::privileged("opening /proc/self/map_files") {
            return;
        }
        let ip = names_a_frame_from_a_descriptor as *const () as usize as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let (range, msg) = maps
            .lines()
            .find_map(|l| {
                let mut it = l.split_whitespace();
                let range = it.next()?;
                let _ = it.next()?;
                let off = u64::from_str_radix(it.next()?, 16).ok()?;
                let path = it.nth(2)?.to_string();
                let (s, e) = range.split_once('-')?;
                let (start, end) = (
                    u64::from_str_radix(s, 16).ok()?,
                    u64::from_str_radix(e, 16).ok()?,
                );
                (start <= ip && ip < end).then(|| {
                    (
                        range.to_string(),
                        MapMsg {
                            start,
                            end,
                            offset: off,
                            path,
                            skipped: None,
                        },
                    )
                })
            })
            .unwrap();
        let f = File::open(format!("/proc/self/map_files/{range}")).unwrap();
        let fuse = MapMsg {
            start: 0x1000,
            end: 0x2000,
            offset: 0,
            path: "/mnt/fuse/libx.so".into(),
            skipped: Some("fuse.sshfs".into()),
        };
        let req = Request {
            maps: vec![fuse, msg],
            stacks: vec![
                StackMsg {
                    ips: vec![ip],
                    hows: vec!["ip".into()],
                    copy: None,
                },
                StackMsg {
                    ips: vec![8],
                    hows: Vec::new(),
                    copy: None,
                },
                StackMsg {
                    ips: vec![0x1800],
                    hows: Vec::new(),
                    copy: None,
                },
            ],
        };
        let reply = State::new().handle(req, vec![f.into()]);
        let named = &reply.stacks[0].frames[0];
        let name = named.function.as_deref().unwrap_or("");
        assert!(name.contains("names_a_frame_from_a_descriptor"), "{name}");
        assert_eq!(named.found.as_deref(), Some("ip"));
        let note = reply.stacks[1].note.as_deref().unwrap_or("");
        assert!(note.contains("not in a file the process maps"), "{note}");
        let fused = &reply.stacks[2];
        let note = fused.note.as_deref().unwrap_or("");
        assert!(
            note.contains("/mnt/fuse/libx.so lies on a fuse.sshfs filesystem"),
            "{note}"
        );
        assert_eq!(fused.frames[0].module.as_deref(), Some("/mnt/fuse/libx.so"));
    }
}
