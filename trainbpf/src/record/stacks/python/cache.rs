//! The code objects read from one process, and the bounds on them: what a
//! process's code objects say (names and line tables) is the process's to
//! choose, and a hostile one could make each as large as the readers
//! allow and have thousands. Per process, at most [`MAX_CODES`] code
//! objects and [`MAX_BYTES`] of their text are kept (the cache is
//! cleared when full), and at most [`READ_BUDGET`] bytes are read over its
//! life; all processes together keep at most [`MAX_HELD`]. Each bound,
//! when hit, is counted (`procfs::guard::STATS`) and said with the frames
//! it leaves unnamed. A forked child starts with its parent's entries,
//! shared, not copied.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use crate::record::samplers::procfs::guard::{Count, STATS};

/// Code objects kept per process: a training loop runs a few hundred.
pub const MAX_CODES: usize = 4096;
/// Bytes of names and line tables kept per process.
pub const MAX_BYTES: usize = 8 << 20;
/// Bytes of names and line tables read per process over its life.
pub const READ_BUDGET: u64 = 64 << 20;
/// Bytes kept by every process's cache together.
pub const MAX_HELD: usize = 256 << 20;

/// What every cache holds, each code object once however many share it.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// What a code object says, once read.
#[derive(Debug)]
pub struct Code {
    pub file: String,
    pub function: String,
    pub first_line: i32,
    pub table: Vec<u8>,
    /// The words from `co_filename` on, as they were when read.
    pub fingerprint: [u8; 24],
    /// Its share of `HELD`, given back when the last holder drops it.
    held: usize,
}

impl Code {
    pub fn new(file: String, function: String, first_line: i32, table: Vec<u8>) -> Code {
        let held = file.len() + function.len() + table.len() + 64;
        HELD.fetch_add(held, Ordering::Relaxed);
        Code {
            file,
            function,
            first_line,
            table,
            fingerprint: [0; 24],
            held,
        }
    }

    /// What reading it cost, bytes.
    pub fn size(&self) -> usize {
        self.held
    }
}

impl Drop for Code {
    fn drop(&mut self) {
        HELD.fetch_sub(self.held, Ordering::Relaxed);
    }
}

/// One process's code objects.
#[derive(Clone, Default)]
pub struct Codes {
    map: HashMap<u64, Arc<Code>>,
    bytes: usize,
    /// Bytes read for this process so far.
    read: u64,
    /// The read budget ran out (counted once).
    spent: bool,
}

impl Codes {
    pub fn get(&self, addr: &u64) -> Option<&Arc<Code>> {
        self.map.get(addr)
    }

    /// Whether another code object may be read: `Err` once this process's
    /// budget is spent.
    pub fn may_read(&mut self, pid: u32) -> Result<(), super::PyError> {
        if self.read < READ_BUDGET {
            return Ok(());
        }
        if !self.spent {
            self.spent = true;
            STATS.add(Count::PyBudgetSpent, 1);
            STATS.note(|| {
                format!(
                    "pid {pid}: more than {READ_BUDGET} bytes of its code objects read: no more are"
                )
            });
        }
        Err(super::PyError::Budget { limit: READ_BUDGET })
    }

    /// Keeps a code object just read (counted against the budget),
    /// clearing the cache first where it is full; returns it.
    pub fn insert(&mut self, addr: u64, code: Code) -> Arc<Code> {
        self.read = self.read.saturating_add(code.size() as u64);
        let size = code.size();
        if let Some(old) = self.map.remove(&addr) {
            self.bytes -= old.size();
        }
        let full = self.map.len() >= MAX_CODES
            || self.bytes + size > MAX_BYTES
            || HELD.load(Ordering::Relaxed) > MAX_HELD;
        if full && !self.map.is_empty() {
            self.map.clear();
            self.bytes = 0;
            STATS.add(Count::PyCacheCleared, 1);
        }
        let code = Arc::new(code);
        // All processes together over their bound, even with this one's
        // cleared: named, not kept.
        if HELD.load(Ordering::Relaxed) <= MAX_HELD {
            self.bytes += size;
            self.map.insert(addr, code.clone());
        }
        code
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(table: usize) -> Code {
        Code::new("f.py".into(), "f".into(), 1, vec![0; table])
    }

    #[test]
    fn a_full_cache_is_cleared_and_counted() {
        let before = STATS.snapshot().py_cache_cleared;
        let mut c = Codes::default();
        for a in 0..MAX_CODES as u64 {
            c.insert(a, code(0));
        }
        assert_eq!(c.len(), MAX_CODES);
        c.insert(u64::MAX, code(0));
        assert_eq!(c.len(), 1, "cleared, then kept");
        assert!(c.get(&u64::MAX).is_some());
        // Big tables fill it by bytes first.
        let mut c = Codes::default();
        for a in 0..(MAX_BYTES / (1 << 20) + 1) as u64 {
            c.insert(a, code(1 << 20));
        }
        assert!(c.len() < MAX_BYTES / (1 << 20) + 1);
        assert!(STATS.snapshot().py_cache_cleared >= before + 2);
    }

    #[test]
    fn the_read_budget_runs_out_once() {
        let before = STATS.snapshot().py_budget_spent;
        let mut c = Codes::default();
        assert!(c.may_read(1).is_ok());
        let mut a = 0;
        while c.may_read(1).is_ok() {
            c.insert(a, code(1 << 20));
            a += 1;
        }
        assert!(a >= READ_BUDGET / (1 << 20) - 1);
        assert!(c.may_read(1).is_err(), "and stays spent");
        assert_eq!(STATS.snapshot().py_budget_spent, before + 1);
    }

    #[test]
    fn shared_entries_are_held_once() {
        let start = HELD.load(Ordering::Relaxed);
        let mut parent = Codes::default();
        parent.insert(1, code(1000));
        let child = parent.clone();
        let with_both = HELD.load(Ordering::Relaxed);
        drop(parent);
        assert_eq!(child.len(), 1);
        drop(child);
        // Other tests run beside this one: only this one's share is
        // checked to come back.
        assert!(with_both >= start);
        assert!(HELD.load(Ordering::Relaxed) <= with_both);
    }
}
