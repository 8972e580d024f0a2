//! Native frames to function, file and line, with blazesym, while the
//! process lives: its `/proc/PID/maps` says which file each address lies
//! in, and blazesym reads that file through `/proc/PID/map_files/` (the
//! mapped inode itself, not a path the job could swap), its symbols and,
//! where present, its DWARF line tables.

use blazesym::symbolize::{
    Input, Reason, Symbolized, Symbolizer,
    source::{Process, Source},
};
use trainbpf_report::decode::stacks::{Frame, MAX_FRAME_TEXT, MAX_FRAMES};

use crate::record::samplers::procfs::{
    backing::Backing,
    guard::{Count, STATS},
};

thread_local! {
    /// Each `guard` worker's own symbolizer (blazesym's is not `Send`):
    /// its caches stay with the thread, which the pool hands out again.
    /// Replaced after `PROCS_PER_SYMBOLIZER` processes: blazesym keeps an
    /// entry for every path it opened (`/proc/PID/map_files/...`, one set
    /// per process), and a job that forks and execs without end made
    /// that grow without end.
    static NATIVE: std::cell::RefCell<(Native, std::collections::HashSet<u32>)> =
        std::cell::RefCell::new((Native::new(), std::collections::HashSet::new()));
}

/// Processes one symbolizer serves before it is replaced: its files'
/// symbols and line tables are read again then, so a job with a few
/// long-lived processes keeps its caches, and one that churns processes
/// pays a re-read every this many.
const PROCS_PER_SYMBOLIZER: usize = 256;

/// [`Native::resolve`] on a `guard` worker, with its own symbolizer; the
/// frames in files on FUSE (`backing`, looked at by the caller) are not
/// looked up.
pub fn resolve_here(
    pid: u32,
    stacks: &[Vec<u64>],
    backing: Option<&Backing>,
) -> Result<Vec<Resolved>, String> {
    let refs: Vec<&[u64]> = stacks.iter().map(Vec::as_slice).collect();
    NATIVE.with(|n| {
        let mut n = n.borrow_mut();
        if !n.1.contains(&pid) && n.1.len() >= PROCS_PER_SYMBOLIZER {
            *n = (Native::new(), std::collections::HashSet::new());
        }
        n.1.insert(pid);
        n.0.resolve(pid, &refs, backing)
    })
}

/// Cuts a name or path to `MAX_FRAME_TEXT` bytes (at a char boundary) and
/// replaces control characters: what a process's files hold reaches a
/// terminal later (where `term` escapes it again).
pub fn bounded(s: &str) -> String {
    let mut end = s.len().min(MAX_FRAME_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out: String = s[..end]
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if end < s.len() {
        out.push('…');
    }
    out
}

/// The addresses to look up: a return address points past its call, so
/// every frame but the innermost is looked up one byte earlier (the call
/// itself, and its line).
pub fn lookup_addrs(ips: &[u64]) -> Vec<u64> {
    ips.iter()
        .take(MAX_FRAMES)
        .enumerate()
        .map(|(i, &ip)| if i == 0 { ip } else { ip.saturating_sub(1) })
        .collect()
}

/// A stack's frames, and why none of them resolved (if none did).
pub type Resolved = (Vec<Frame>, Option<String>);

pub struct Native {
    symbolizer: Symbolizer,
}

impl Default for Native {
    fn default() -> Self {
        Native::new()
    }
}

impl Native {
    pub fn new() -> Native {
        Native {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(false)
                .build(),
        }
    }

    /// The frames of stacks of one live process (`ips`: innermost first,
    /// as the kernel took them). A frame that did not resolve keeps its
    /// address, with no function; a process gone already is an error.
    /// With each stack, why none of its frames resolved, if none did. A
    /// frame in a file on FUSE (`backing`) is not looked up: its server
    /// may never answer.
    pub fn resolve(
        &self,
        pid: u32,
        stacks: &[&[u64]],
        backing: Option<&Backing>,
    ) -> Result<Vec<Resolved>, String> {
        let src = Source::Process(Process::new(pid.into()));
        let mut out = Vec::with_capacity(stacks.len());
        for ips in stacks {
            let mut addrs = lookup_addrs(ips);
            let mut skipped: Option<(usize, String)> = None;
            for a in addrs.iter_mut() {
                if let Some(fs) = backing.and_then(|b| b.at(*a, 1)) {
                    let s = skipped.get_or_insert_with(|| (0, fs.to_string()));
                    s.0 += 1;
                    // Address 0 is mapped nowhere: nothing is read for it.
                    *a = 0;
                }
            }
            let syms = self
                .symbolizer
                .symbolize(&src, Input::AbsAddr(&addrs))
                .map_err(|e| bounded(&format!("process {pid}: {e}")))?;
            let why = syms.iter().all(|s| matches!(s, Symbolized::Unknown(_))).then(|| {
                if let Some((_, fs)) = &skipped {
                    return format!("unsymbolized: in files on a {fs} filesystem, not read");
                }
                match syms.first() {
                    Some(Symbolized::Unknown(Reason::Unmapped)) => {
                        "unsymbolized: not mapped when resolved (taken before an exec, or unmapped since)".to_string()
                    }
                    Some(Symbolized::Unknown(r)) => format!("unsymbolized: {r}"),
                    _ => "unsymbolized".to_string(),
                }
            });
            let frames = ips
                .iter()
                .zip(syms.iter())
                .map(|(&ip, s)| match s {
                    Symbolized::Sym(sym) => Frame {
                        kind: "native".into(),
                        addr: ip,
                        function: Some(bounded(&sym.name)),
                        file: sym
                            .code_info
                            .as_ref()
                            .map(|c| bounded(&c.to_path().display().to_string())),
                        line: sym.code_info.as_ref().and_then(|c| c.line),
                        module: sym.module.as_ref().map(|m| bounded(&m.to_string_lossy())),
                        found: None,
                    },
                    Symbolized::Unknown(_) => Frame {
                        kind: "native".into(),
                        addr: ip,
                        ..Default::default()
                    },
                })
                .collect();
            let why = match (why, skipped) {
                (None, Some((n, fs))) => {
                    STATS.add(Count::FuseSkipped, 1);
                    STATS.note(|| {
                        format!(
                            "pid {pid}: native frames in files on a {fs} filesystem: not looked up"
                        )
                    });
                    Some(format!(
                        "{n} frames unsymbolized: in files on a {fs} filesystem, not read"
                    ))
                }
                (why, Some(_)) => {
                    STATS.add(Count::FuseSkipped, 1);
                    why
                }
                (why, None) => why,
            };
            out.push((frames, why));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_bounded_and_controls_replaced() {
        assert_eq!(bounded("a\x1b[31mb"), "a?[31mb");
        let long = "é".repeat(MAX_FRAME_TEXT);
        let b = bounded(&long);
        assert!(b.len() <= MAX_FRAME_TEXT + '…'.len_utf8());
        assert!(b.ends_with('…'));
    }

    #[test]
    fn return_addresses_are_looked_up_at_their_call() {
        assert_eq!(lookup_addrs(&[100, 200, 300]), vec![100, 199, 299]);
    }

    /// This test's own process: a function of it resolves by name.
    /// A frame in a file on FUSE is not looked up, and the stack says so.
    #[test]
    fn frames_on_fuse_are_not_looked_up() {
        let ip = frames_on_fuse_are_not_looked_up as *const () as usize as u64;
        let me = std::process::id();
        let maps = std::fs::read_to_string(format!("/proc/{me}/maps")).unwrap();
        let line = maps
            .lines()
            .find(|l| {
                crate::record::samplers::procfs::maps_line(l)
                    .is_some_and(|m| m.start <= ip && ip < m.end)
            })
            .unwrap();
        let m = crate::record::samplers::procfs::maps_line(line).unwrap();
        let (major, minor) = (libc::major(m.dev), libc::minor(m.dev));
        let mountinfo = format!("1 0 {major}:{minor} / / rw - fuse.test test rw\n");
        let b = Backing::parse(line, &mountinfo);
        let r = Native::new().resolve(me, &[&[ip]], Some(&b)).unwrap();
        assert_eq!(r[0].0[0].function, None);
        assert_eq!(r[0].0[0].addr, ip, "the address is kept");
        let why = r[0].1.as_deref().unwrap_or("");
        assert!(why.contains("fuse.test"), "{why}");
    }

    #[test]
    fn resolves_a_live_process() {
        if !crate::util::privileged("resolving through /proc/self/map_files") {
            return;
        }
        let ip = resolves_a_live_process as *const () as usize as u64;
        let frames = Native::new()
            .resolve(std::process::id(), &[&[ip]], None)
            .unwrap();
        let f = frames[0].0[0].function.as_deref().unwrap_or("");
        assert!(f.contains("resolves_a_live_process"), "{f}");
    }
}
