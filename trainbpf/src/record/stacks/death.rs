//! The victim's stack at death, the collector's side: names a thread's
//! record from `signal_deliver` at once. The process is on its way out:
//! its maps and memory may be gone by the time the record is read, so a
//! frame the live process cannot name any more is named from what its
//! growth stacks resolved (the same code ran), and what neither names
//! keeps its address, with the reason.

use std::collections::HashMap;

use trainbpf_common::{DeathStack, STACK_DEPTH};
use trainbpf_report::decode::{
    ProcKey,
    stacks::{Frame, MAX_FRAMES, StackAtDeath},
};

use super::{StackCollector, py, stack_error, symbolize::bounded};

/// Native frames remembered per process from its growth stacks.
pub const MAX_KNOWN_PER_PROC: usize = 1 << 16;

/// Remembers the named frames of a process's growth stacks, by address.
pub fn remember(known: &mut HashMap<u64, Frame>, frames: &[Frame]) {
    for f in frames {
        if f.kind == "native" && f.function.is_some() && known.len() < MAX_KNOWN_PER_PROC {
            known.entry(f.addr).or_insert_with(|| f.clone());
        }
    }
}

/// Fills the unnamed frames of `frames` from `known`: how many stay
/// unnamed.
fn fill(frames: &mut [Frame], known: Option<&HashMap<u64, Frame>>) -> usize {
    let mut unnamed = 0;
    for f in frames.iter_mut() {
        if f.function.is_some() {
            continue;
        }
        match known.and_then(|k| k.get(&f.addr)) {
            Some(k) => *f = k.clone(),
            None => unnamed += 1,
        }
    }
    unnamed
}

/// A thread's stacks at a fatal signal, and whose code its process runs
/// where that is not its own (a fork that never exec'd: `family.rs`).
pub type Dying = (Box<DeathStack>, Option<ProcKey>);

/// Where the named stacks at death go, with their time.
pub type DeathOut = Box<dyn FnMut(u64, StackAtDeath) + Send>;

impl StackCollector {
    /// Stacks at death come on `rx` and go, named, to `out`
    /// (`thread.rs`): named between two processes of a drain too
    /// ([`StackCollector::name_deaths`]), while the dying process may still be
    /// read.
    pub fn on_death(&mut self, rx: std::sync::mpsc::Receiver<Dying>, out: DeathOut) {
        self.deaths = Some((rx, out));
    }

    /// Names the stacks at death that wait.
    pub fn name_deaths(&mut self) {
        let Some((rx, mut out)) = self.deaths.take() else {
            return;
        };
        while let Ok((ev, owner)) = rx.try_recv() {
            let named = self.at_death(&ev, owner);
            out(ev.hdr.ts_ns, named);
        }
        self.deaths = Some((rx, out));
    }

    /// A thread's stacks at a fatal signal, named now; `owner`: whose code
    /// its process runs, a fork's parent's.
    pub fn at_death(&mut self, ev: &DeathStack, owner: Option<ProcKey>) -> StackAtDeath {
        let proc = ProcKey {
            tgid: ev.hdr.tgid,
            start_ns: ev.hdr.start_ns,
        };
        let mut notes: Vec<String> = Vec::new();
        let mut why = None;
        let native = if ev.native_len < 0 {
            notes.push(stack_error(ev.native_len as i32));
            Vec::new()
        } else {
            let n = (ev.native_len as usize / 8).min(STACK_DEPTH);
            let mut ips = ev.native[..n].to_vec();
            let via_sp = super::with_leaf(&mut ips, ev.leaf_ret);
            let mut through_owner = false;
            let mut f = self.native_at_death(proc, owner, &ips, &mut why, &mut through_owner);
            if through_owner {
                // Its code at the fork, at the same addresses; a library
                // it loaded since at an address the other reused would
                // be misnamed, so it is said.
                notes.push(
                    "native frames named through the process it was forked from, whose code it ran (it never exec'd)"
                        .into(),
                );
            }
            for (f, how) in f.iter_mut().zip(super::walked(ips.len(), via_sp)) {
                f.found = Some(how.into());
            }
            f
        };
        let (python, note) = self.pythons.frames_at_death(proc, ev.py_state, &ev.py);
        notes.extend(note);
        let frames = if python.is_empty() {
            native
        } else {
            let interp = self.pythons.interpreter_path(proc).unwrap_or_default();
            py::fold(&native, python, interp)
        };
        // Counted among the frames shown: the interpreter's own, folded
        // away, may not have been named.
        let unnamed = frames
            .iter()
            .filter(|f| f.kind == "native" && f.function.is_none())
            .count();
        if unnamed > 0 {
            let why = why.unwrap_or_else(|| "not symbolized".into());
            notes.push(format!(
                "{unnamed} native frames unnamed ({why}; the others named from the live process, or from its growth stacks and files)"
            ));
        }
        StackAtDeath {
            proc,
            tid: ev.tid,
            sig: ev.sig,
            frames,
            error: (!notes.is_empty()).then(|| bounded(&notes.join("; "))),
        }
    }

    /// The native frames: from what this process's stacks named before
    /// where all are known (a thread pool's threads share their frames),
    /// or what its `owner`'s did (a fork runs its parent's code at the same
    /// addresses, and its siblings died the same way), else from the live
    /// process, else from its held files, else from its owner, live or
    /// through its held files. What is named is remembered for its other
    /// threads, or, named from the owner's maps, for the owner's other
    /// forks; `through_owner` is set where the owner named any of them.
    fn native_at_death(
        &mut self,
        proc: ProcKey,
        owner: Option<ProcKey>,
        ips: &[u64],
        why: &mut Option<String>,
        through_owner: &mut bool,
    ) -> Vec<Frame> {
        let bare = |addr: u64| Frame {
            kind: "native".into(),
            addr,
            ..Default::default()
        };
        let mut frames: Vec<Frame> = ips.iter().take(MAX_FRAMES).map(|&a| bare(a)).collect();
        let left = fill(&mut frames, self.known.get(&proc));
        if left == 0 {
            return frames;
        }
        if let Some(o) = owner {
            let still = fill(&mut frames, self.known.get(&o));
            *through_owner = still < left;
            if still == 0 {
                return frames;
            }
        }
        let lives = |c: &StackCollector, p: &ProcKey| {
            !c.exited.contains(p) && crate::record::samplers::procfs::alive(p.tgid)
        };
        // Its files (read anew from its maps while it lives, else those
        // held since its exec), named in the namer, on a worker.
        let (whose, refresh, note) = if lives(self, &proc) {
            (proc, true, None)
        } else if self.mapped.contains_key(&proc) {
            (
                proc,
                false,
                Some("the process was gone; named from the files it ran"),
            )
        } else if let Some(o) = owner.filter(|o| lives(self, o)) {
            (o, true, Some("the process was gone"))
        } else if let Some(o) = owner.filter(|o| self.mapped.contains_key(o)) {
            (o, false, Some("the process was gone"))
        } else {
            *why = Some("the process was gone, and no file it ran was held".into());
            return frames;
        };
        let stack = super::namer::StackMsg {
            ips: ips.to_vec(),
            hows: Vec::new(),
            copy: None,
        };
        match self.name_with(whose, refresh, vec![stack], note) {
            Ok(mut r) if !r.is_empty() => {
                let (f, w) = r.swap_remove(0);
                *why = w;
                frames = f;
                for f in &mut frames {
                    f.found = None;
                }
                // Only what `whose`'s own maps named is kept as its: a
                // fork's own names may be a library only it loaded.
                remember(self.known.entry(whose).or_default(), &frames);
                // The owner's earlier names were replaced with these.
                *through_owner = whose != proc && frames.iter().any(|f| f.function.is_some());
            }
            Ok(_) => {}
            Err(e) => *why = Some(e),
        }
        let left = fill(&mut frames, self.known.get(&proc));
        if let Some(o) = owner
            && fill(&mut frames, self.known.get(&o)) < left
        {
            *through_owner = true;
        }
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(addr: u64, name: Option<&str>) -> Frame {
        Frame {
            kind: "native".into(),
            addr,
            function: name.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn frames_named_before_fill_the_gone_process() {
        let mut known = HashMap::new();
        remember(&mut known, &[f(10, Some("grow_here")), f(20, None)]);
        let mut frames = vec![f(10, None), f(20, None), f(30, Some("main"))];
        assert_eq!(fill(&mut frames, Some(&known)), 1);
        assert_eq!(frames[0].function.as_deref(), Some("grow_here"));
        assert_eq!(fill(&mut frames, None), 1);
    }
}
