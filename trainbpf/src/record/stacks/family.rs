//! Whose code a forked process runs: the process it was forked from, or
//! that one's own, back to the last exec. A fork that never exec'd has its
//! parent's code at the same addresses, so its stack at death can be named
//! through the parent once it is gone (a worker killed with SIGKILL is
//! gone before its stack is read), and one such naming serves all its
//! siblings. Kept on the thread that drains the rings, which sees each
//! fork before the stacks at death of the child: the stacks' thread takes
//! its forks a batch at a time, and may name a death before the batch
//! that holds its fork.

use std::collections::HashMap;

use trainbpf_report::decode::ProcKey;

/// Forked processes tracked at once, at most: past it a new fork is not
/// tracked, and its stack at death is named as if it had exec'd.
pub const MAX_TRACKED: usize = 65_536;

#[derive(Default)]
pub struct Family {
    /// A forked process that has not exec'd, and whose code it runs.
    owner: HashMap<ProcKey, ProcKey>,
}

impl Family {
    /// `child` was forked from `parent`.
    pub fn fork(&mut self, child: ProcKey, parent: ProcKey) {
        let owner = self.owner.get(&parent).copied().unwrap_or(parent);
        if self.owner.len() < MAX_TRACKED {
            self.owner.insert(child, owner);
        }
    }

    /// `p` exec'd or exited: the code it runs is its own, or none.
    pub fn gone(&mut self, p: ProcKey) {
        self.owner.remove(&p);
    }

    /// Whose code `p` runs, where that is not its own.
    pub fn owner_of(&self, p: ProcKey) -> Option<ProcKey> {
        self.owner.get(&p).copied()
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
        assert_eq!(f.owner_of(p(MAX_TRACKED as u32 + 100_005)), None);
    }
}
