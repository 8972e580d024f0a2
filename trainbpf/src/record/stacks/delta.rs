//! The kernel's growth-stack map holds running totals; the recording gets
//! what moved since the last drain. Pure: fed the map's contents, it gives
//! the deltas, and forgets a process once its keys leave the map.

use std::collections::HashMap;

use trainbpf_common::{StackKey, StackVal};

/// The totals last seen per key.
#[derive(Debug, Default)]
pub struct Deltas {
    last: HashMap<StackKey, StackVal>,
}

impl Deltas {
    /// The map's contents now in, what each key added since the last call
    /// out (keys that did not move are left out). A total below the last
    /// (the key was deleted and made again) counts from zero.
    pub fn next(
        &mut self,
        now: impl IntoIterator<Item = (StackKey, StackVal)>,
    ) -> Vec<(StackKey, StackVal)> {
        let mut out = Vec::new();
        for (k, v) in now {
            let last = self.last.get(&k).copied().unwrap_or_default();
            let d = if v.bytes < last.bytes || v.count < last.count {
                v
            } else {
                StackVal {
                    bytes: v.bytes - last.bytes,
                    count: v.count - last.count,
                }
            };
            if d.count > 0 || d.bytes > 0 {
                out.push((k, d));
            }
            self.last.insert(k, v);
        }
        out.sort_by_key(|(k, _)| (k.tgid, k.start_ns, k.stack_id, k.py_id, k.py_state));
        out
    }

    /// The keys of a process (by tgid and start time), to delete from the
    /// kernel's map after its last drain; forgotten here.
    pub fn forget(&mut self, tgid: u32, start_ns: u64) -> Vec<StackKey> {
        let keys: Vec<StackKey> = self
            .last
            .keys()
            .filter(|k| k.tgid == tgid && k.start_ns == start_ns)
            .copied()
            .collect();
        for k in &keys {
            self.last.remove(k);
        }
        keys
    }

    /// Whether any process still known has this stack id.
    pub fn in_use(&self, stack_id: i32) -> bool {
        self.last.keys().any(|k| k.stack_id == stack_id)
    }

    /// Whether any process still known has these Python frames.
    pub fn py_in_use(&self, py_id: u64) -> bool {
        self.last.keys().any(|k| k.py_id == py_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(tgid: u32, id: i32) -> StackKey {
        StackKey {
            tgid,
            stack_id: id,
            start_ns: 5,
            ..Default::default()
        }
    }

    fn v(bytes: u64, count: u64) -> StackVal {
        StackVal { bytes, count }
    }

    /// A fixture of three drains of the kernel's map: new keys, moved keys,
    /// still keys, an unreadable stack's key (negative id), and a key made
    /// again after its process's keys were deleted.
    #[test]
    fn drains_give_what_moved() {
        let mut d = Deltas::default();
        let first = d.next([
            (k(1, 3), v(4096, 1)),
            (k(1, -14), v(8192, 2)),
            (k(2, 3), v(100, 1)),
        ]);
        assert_eq!(
            first,
            vec![
                (k(1, -14), v(8192, 2)),
                (k(1, 3), v(4096, 1)),
                (k(2, 3), v(100, 1))
            ]
        );
        let second = d.next([
            (k(1, 3), v(12288, 3)),
            (k(1, -14), v(8192, 2)),
            (k(2, 3), v(100, 1)),
        ]);
        assert_eq!(second, vec![(k(1, 3), v(8192, 2))]);
        assert!(d.in_use(3));
        let gone = d.forget(1, 5);
        assert_eq!(gone.len(), 2);
        assert!(d.in_use(3), "process 2 still has stack 3");
        assert!(!d.in_use(-14));
        // Deleted in the kernel and made again: counted from zero.
        let third = d.next([(k(1, 3), v(4096, 1)), (k(2, 3), v(50, 1))]);
        assert_eq!(third, vec![(k(1, 3), v(4096, 1)), (k(2, 3), v(50, 1))]);
    }
}
