//! Which of the job's processes one shared-memory look reads the maps and
//! descriptors of. A job of a few hundred processes is read whole at each
//! look. A bigger one (`record --all` on a node of ten thousand) is read
//! in slices: the processes whose last memory record showed shared memory
//! resident first, then the others in turn, by pid, from where the last
//! look stopped. Each slice costs the same, however crowded the node, and
//! every process is read within a few looks.

use std::collections::HashSet;

/// Processes read in one look.
pub const MAX_SCAN: usize = 256;
/// Processes remembered as holding shared memory.
const MAX_HOLDERS: usize = 4096;

#[derive(Default)]
pub struct Picker {
    /// Processes whose last memory record showed shared memory resident.
    holders: HashSet<u32>,
    /// The last pid read in turn: the next slice starts after it.
    cursor: u32,
}

impl Picker {
    /// A memory record of `tgid`, with its resident shared memory.
    pub fn saw(&mut self, tgid: u32, shmem_kb: u64) {
        if shmem_kb == 0 {
            self.holders.remove(&tgid);
        } else if self.holders.len() < MAX_HOLDERS {
            self.holders.insert(tgid);
        }
    }

    /// `tgid` exited.
    pub fn gone(&mut self, tgid: u32) {
        self.holders.remove(&tgid);
    }

    /// The job's processes to read now, at most `max`, ascending.
    pub fn pick(&mut self, job: &HashSet<u32>, max: usize) -> Vec<u32> {
        let mut all: Vec<u32> = job.iter().copied().collect();
        all.sort_unstable();
        if all.len() <= max {
            return all;
        }
        let mut out: Vec<u32> = all
            .iter()
            .copied()
            .filter(|p| self.holders.contains(p))
            .take(max)
            .collect();
        let from = all.partition_point(|&p| p <= self.cursor);
        let turn = all[from..].iter().chain(&all[..from]);
        let room = max - out.len();
        let mut last = None;
        for &p in turn.filter(|p| !self.holders.contains(p)).take(room) {
            out.push(p);
            last = Some(p);
        }
        if let Some(p) = last {
            self.cursor = p;
        }
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_job_is_read_whole() {
        let mut p = Picker::default();
        let job: HashSet<u32> = [30, 10, 20].into();
        assert_eq!(p.pick(&job, 4), vec![10, 20, 30]);
        assert_eq!(p.pick(&job, 4), vec![10, 20, 30]);
    }

    /// Ten processes, four a look: the holder of shared memory at every
    /// look, the rest in turn, each within three looks.
    #[test]
    fn a_big_one_in_slices_holders_first() {
        let mut p = Picker::default();
        let job: HashSet<u32> = (1..=10).collect();
        p.saw(7, 512);
        p.saw(3, 0);
        assert_eq!(p.pick(&job, 4), vec![1, 2, 3, 7]);
        assert_eq!(p.pick(&job, 4), vec![4, 5, 6, 7]);
        assert_eq!(p.pick(&job, 4), vec![7, 8, 9, 10]);
        // Round again, from the start.
        assert_eq!(p.pick(&job, 4), vec![1, 2, 3, 7]);
        // 7 let its memory go, and 2 exited: read in turn like the rest.
        p.saw(7, 0);
        p.gone(2);
        let job: HashSet<u32> = job.into_iter().filter(|&x| x != 2).collect();
        assert_eq!(p.pick(&job, 4), vec![4, 5, 6, 7]);
        assert_eq!(p.pick(&job, 4), vec![1, 8, 9, 10]);
    }
}
