//! Whose code a forked process runs: the process it was forked from, or
//! that one's own, back to the last exec. A fork that never exec'd has its
//! parent's code at the same addresses, so its stack at death can be named
//! through the parent once it is gone (a worker killed with SIGKILL is
//! gone before its stack is read), and one such naming serves all its
//! siblings. Kept on the thread that drains the rings, which sees each
//! fork before the stacks at death of the child: the stacks' thread takes
//! its forks a batch at a time, and may name a death before the batch
//! that holds its fork.

use std::collections::{HashMap, HashSet};

use trainbpf_report::decode::ProcKey;

/// Forked processes tracked at once, at most: past it a new fork is not
/// tracked, and its stack at death is named as if it had exec'd.
pub const MAX_TRACKED: usize = 65_536;

#[derive(Default)]
pub struct Family {
    /// A forked process that has not exec'd, and whose code it runs.
    owner: HashMap<ProcKey, ProcKey>,
    /// Owners that still run that code: one that exec'd runs another
    /// program, and one that exited may have its pid taken by any other,
    /// so neither names its forks' frames any more.
    live: HashSet<ProcKey>,
}

impl Family {
    /// `child` was forked from `parent`: it runs what its parent's owner
    /// runs, or, where that one is gone, what its parent runs.
    pub fn fork(&mut self, child: ProcKey, parent: ProcKey) {
        let owner = self
            .owner
            .get(&parent)
            .copied()
            .filter(|o| self.live.contains(o))
            .unwrap_or(parent);
        if self.owner.len() < MAX_TRACKED
            && (self.live.contains(&owner) || self.live.len() < MAX_TRACKED)
        {
            self.owner.insert(child, owner);
            self.live.insert(owner);
        }
    }

    /// `p` exec'd or exited: the code it runs is its own, or none, and its
    /// forks' is no longer its.
    pub fn gone(&mut self, p: ProcKey) {
        self.owner.remove(&p);
        self.live.remove(&p);
    }

    /// Whose code `p` runs, where that is not its own and its owner still
    /// runs it.
    pub fn owner_of(&self, p: ProcKey) -> Option<ProcKey> {
        self.owner
            .get(&p)
            .copied()
            .filter(|o| self.live.contains(o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(tgid: u32) -> ProcKey {
        ProcKey {
            tgid,
            start_ns: u64::from(tgid) * 10,
        }
    }

    #[test]
    fn a_fork_runs_the_code_of_its_last_execd_ancestor() {
        let mut f = Family::default();
        f.fork(p(2), p(1));
        f.fork(p(3), p(2));
        assert_eq!(f.owner_of(p(2)), Some(p(1)));
        // A fork of a fork: still the first one's code, even once the
        // middle one is gone.
        f.gone(p(2));
        assert_eq!(f.owner_of(p(3)), Some(p(1)));
        assert_eq!(f.owner_of(p(1)), None);
        // An exec: its own code from then on, and its forks run that.
        f.gone(p(3));
        f.fork(p(4), p(3));
        assert_eq!(f.owner_of(p(3)), None);
        assert_eq!(f.owner_of(p(4)), Some(p(3)));
        // The owner exits (its pid free for another program) or execs:
        // its forks have no owner any more; a fork made after that of one
        // of them runs that one's code.
        f.fork(p(5), p(4));
        assert_eq!(f.owner_of(p(5)), Some(p(3)));
        f.gone(p(3));
        assert_eq!(f.owner_of(p(4)), None);
        assert_eq!(f.owner_of(p(5)), None);
        f.fork(p(6), p(5));
        assert_eq!(f.owner_of(p(6)), Some(p(5)));
        // The same pid started again is another process.
        let again = ProcKey {
            tgid: 4,
            start_ns: 99,
        };
        assert_eq!(f.owner_of(again), None);
    }

    #[test]
    fn tracking_stops_at_its_bound() {
        let mut f = Family::default();
        for t in 0..MAX_TRACKED as u32 + 10 {
            f.fork(p(t + 100_000), p(1));
        }
        assert_eq!(f.owner.len(), MAX_TRACKED);
        assert_eq!(f.live.len(), 1);
        assert_eq!(f.owner_of(p(MAX_TRACKED as u32 + 100_005)), None);
    }
}
