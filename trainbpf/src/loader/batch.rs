//! A whole hash map read, and a list of keys deleted, in a few `bpf`
//! calls each (`BPF_MAP_LOOKUP_BATCH`, `BPF_MAP_DELETE_BATCH`, kernel
//! 5.6+), where aya's iterator makes two calls a key and its `remove` one.
//! On a node where a thousand processes start and exit a second
//! (`record --all`), the growth stacks' totals were read and pruned a key
//! at a time, and those calls were most of the stacks' thread's time.
//! Where the kernel has no batch calls for the map, the caller falls back
//! to aya's, and nothing else changes.

use std::os::fd::{AsFd, AsRawFd};

use aya::{
    Pod,
    maps::{HashMap, IterableMap, MapData},
};
use aya_obj::generated::{bpf_attr, bpf_cmd};

/// Keys asked for per call: the stacks' maps hold up to 16,384.
const CHUNK: u32 = 4096;

/// Why a batch call could not be used: the kernel lacks it (`EINVAL`,
/// `ENOTSUPP`) or refused it for another reason. The caller falls back.
#[derive(Debug, thiserror::Error)]
#[error("batch map call: {0}")]
pub struct Unbatched(std::io::Error);

fn map_fd(map: &MapData) -> u32 {
    map.fd().as_fd().as_raw_fd() as u32
}

fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> Result<(), std::io::Error> {
    // SAFETY: `attr` is a valid, fully initialised `bpf_attr` whose
    // pointers (set by the callers) point at buffers that outlive the call
    // and hold `count` keys and values of the map's sizes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut bpf_attr,
            size_of::<bpf_attr>() as libc::c_long,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Every (key, value) of a hash map of `K` to `V`, read `CHUNK` at a time.
/// A map that changes meanwhile gives what a key-by-key walk would: each
/// key at most once, those added during the read perhaps not.
pub fn read_all<K: Pod, V: Pod, M: IterableMap<K, V>>(map: &M) -> Result<Vec<(K, V)>, Unbatched> {
    let fd = map_fd(map.map());
    let mut out = Vec::new();
    // The kernel's position in a hash map is a bucket index (a u32); room
    // for more costs nothing.
    let mut batch_in = [0u64; 1];
    let mut batch_out = [0u64; 1];
    let mut first = true;
    let mut keys: Vec<K> = Vec::with_capacity(CHUNK as usize);
    let mut values: Vec<V> = Vec::with_capacity(CHUNK as usize);
    loop {
        // SAFETY: zeroes are a valid `bpf_attr` (integers only).
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // SAFETY: writing the batch member of a zeroed union.
        let b = unsafe { &mut attr.batch };
        b.in_batch = if first {
            0
        } else {
            batch_in.as_mut_ptr() as u64
        };
        b.out_batch = batch_out.as_mut_ptr() as u64;
        b.keys = keys.as_mut_ptr() as u64;
        b.values = values.as_mut_ptr() as u64;
        b.count = CHUNK;
        b.map_fd = fd;
        let r = sys_bpf(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr);
        // SAFETY: reading back the member written above.
        let n = unsafe { attr.batch.count } as usize;
        let end = match r {
            Ok(()) => false,
            // The end of the map: `n` (perhaps none) are the last.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(e) => return Err(Unbatched(e)),
        };
        // SAFETY: the kernel wrote `n` <= CHUNK keys and values (plain
        // old data) into the buffers' reserved room.
        unsafe {
            keys.set_len(n.min(CHUNK as usize));
            values.set_len(n.min(CHUNK as usize));
        }
        out.extend(keys.drain(..).zip(values.drain(..)));
        if end {
            return Ok(out);
        }
        batch_in = batch_out;
        first = false;
    }
}

/// Deletes `keys` from a hash map. A key already gone (the kernel stops a
/// batch at the first) is skipped, and the rest still deleted. What could
/// not be deleted in batches is left to the caller.
pub fn delete_all<K: Pod, V: Pod, M: IterableMap<K, V>>(
    map: &M,
    keys: &[K],
) -> Result<(), Unbatched> {
    let fd = map_fd(map.map());
    let mut rest = keys;
    while !rest.is_empty() {
        let take = rest.len().min(CHUNK as usize);
        // SAFETY: zeroes are a valid `bpf_attr` (integers only).
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // SAFETY: writing the batch member of a zeroed union.
        let b = unsafe { &mut attr.batch };
        b.keys = rest.as_ptr() as u64;
        b.count = take as u32;
        b.map_fd = fd;
        let r = sys_bpf(bpf_cmd::BPF_MAP_DELETE_BATCH, &mut attr);
        // SAFETY: reading back the member written above.
        let done = (unsafe { attr.batch.count } as usize).min(take);
        match r {
            Ok(()) => rest = &rest[take..],
            // Stopped at a key that is not there: past it.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => rest = &rest[done + 1..],
            Err(e) => return Err(Unbatched(e)),
        }
    }
    Ok(())
}

/// [`read_all`], or aya's key-by-key walk where the kernel has no batch
/// read for the map: the same entries, at two calls a key.
pub fn read_or_walk<K: Pod, V: Pod>(map: &HashMap<MapData, K, V>) -> Vec<(K, V)> {
    read_all(map).unwrap_or_else(|_| map.iter().filter_map(Result::ok).collect())
}

/// [`delete_all`], or one call a key where the kernel has no batch
/// delete for the map. Keys already gone are no error.
pub fn delete_or_remove<K: Pod, V: Pod>(map: &mut HashMap<MapData, K, V>, keys: &[K]) {
    if !keys.is_empty() && delete_all(map, keys).is_err() {
        for k in keys {
            let _ = map.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real kernel map (root: `CAP_BPF`); skipped without it unless the
    /// run requires privileged tests, as CI's does.
    fn map(entries: u32) -> Option<HashMap<MapData, u64, u64>> {
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("TRAINBPF_PRIVILEGED_REQUIRED").is_none(),
                "creating a BPF map needs root"
            );
            return None;
        }
        Some(HashMap::create(entries, 0).expect("creating a BPF hash map"))
    }

    #[test]
    fn a_map_bigger_than_a_chunk_is_read_whole() {
        let Some(mut m) = map(12_000) else { return };
        for k in 0..9_000u64 {
            m.insert(k, k * 3, 0).unwrap();
        }
        let mut got = read_all(&m).expect("batch read");
        got.sort_unstable();
        assert_eq!(got.len(), 9_000);
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &(k, v))| k == i as u64 && v == k * 3)
        );
        let empty = map(16).unwrap();
        assert!(read_all(&empty).unwrap().is_empty());
    }

    #[test]
    fn keys_already_gone_do_not_stop_the_others_deletion() {
        let Some(mut m) = map(12_000) else { return };
        for k in 0..6_000u64 {
            m.insert(k, k, 0).unwrap();
        }
        // Every other key asked for is not there; more than a chunk asked.
        let ask: Vec<u64> = (0..4_500u64).flat_map(|k| [k, 100_000 + k]).collect();
        delete_all(&m, &ask).expect("batch delete");
        let mut left: Vec<u64> = read_or_walk(&m).into_iter().map(|(k, _)| k).collect();
        left.sort_unstable();
        assert_eq!(left, (4_500..6_000u64).collect::<Vec<_>>());
        delete_or_remove(&mut m, &[]);
        delete_or_remove(&mut m, &[5_999, 7]);
        assert_eq!(read_or_walk(&m).len(), 1_499);
    }
}
