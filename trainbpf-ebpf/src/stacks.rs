//! Growth stacks (`record --stacks`): while a process's added memory climbs
//! to new highs, its user stack is taken once per `stack_every_pages` of new
//! high, and the bytes are aggregated per (process, stack id) in the kernel.
//!
//! It runs at a batch's end in `pages.rs`, never per page, and only in the
//! `page_alloc_stacks` program that the loader attaches instead of
//! `page_alloc` when stacks are on: with them off, the page programs are
//! the same code as without this module. Memory that is freed and taken
//! again below the high takes no stack, so a fault storm that maps and
//! frees the same buffer pays nothing here.

use core::{
    ffi::c_void,
    intrinsics::{AtomicOrdering, atomic_xadd},
    ptr::addr_of_mut,
};

use aya_ebpf::{
    helpers::bpf_get_current_task,
    maps::HashMap,
    programs::{BtfTracePointContext, tracing::StackIdContext},
};
use trainbpf_common::{STACK_COPY_BYTES, StackCopy, StackKey, StackVal};

use crate::{
    in_job,
    maps::{COUNTERS, ProcKey, ProcState, STACK_AGG, STACK_COPIES, STACK_HIGH, STACKS},
};

/// `BPF_F_USER_STACK` (uapi/linux/bpf.h): the user stack, by frame pointers.
const BPF_F_USER_STACK: u64 = 1 << 8;
/// `BPF_NOEXIST` and the error a racing insert gets.
const BPF_NOEXIST: u64 = 1;
const EEXIST: i32 = 17;

#[inline(always)]
fn count(f: fn(*mut trainbpf_common::Counters) -> *mut u64) {
    if let Some(c) = COUNTERS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, this CPU only.
        unsafe { *f(c) += 1 };
    }
}

fn map_full(c: *mut trainbpf_common::Counters) -> *mut u64 {
    // SAFETY: a field address, no access.
    unsafe { addr_of_mut!((*c).stack_map_full) }
}

fn errors(c: *mut trainbpf_common::Counters) -> *mut u64 {
    // SAFETY: a field address, no access.
    unsafe { addr_of_mut!((*c).stack_errors) }
}

fn copies_lost(c: *mut trainbpf_common::Counters) -> *mut u64 {
    // SAFETY: a field address, no access.
    unsafe { addr_of_mut!((*c).stack_copies_lost) }
}

/// After a batch was added to the current process's entry (`st`): takes its
/// stack when its added memory stands `stack_every_pages` above its high.
/// `ctx` is the page program's own context (the helper wants it).
#[inline(always)]
pub(crate) fn sample(ctx: *mut c_void, st: *mut ProcState, tgid: u32) {
    let every = conf!(stack_every_pages);
    if every <= 0 {
        return;
    }
    // SAFETY: `st` points into a live map value; threads of one process
    // racing here can only take a stack more or fewer.
    let (net, start_ns) = unsafe {
        let cache = (*st).cache_added_pages as i64 - (*st).cache_removed_pages as i64;
        (
            (*st).alloc_pages as i64 - (*st).freed_pages as i64 - cache,
            (*st).start_ns,
        )
    };
    if net < every {
        return;
    }
    let key = ProcKey {
        tgid,
        _pad: 0,
        start_ns,
    };
    let high = match STACK_HIGH.get_ptr_mut(&key) {
        Some(h) => h,
        None => {
            // First high of this process: only the job's are wanted.
            if !in_job(tgid) {
                return;
            }
            match STACK_HIGH.insert(&key, &0i64, BPF_NOEXIST) {
                Ok(()) => {}
                Err(e) if e == -EEXIST => {}
                Err(_) => {
                    count(map_full);
                    return;
                }
            }
            let Some(h) = STACK_HIGH.get_ptr_mut(&key) else {
                return;
            };
            h
        }
    };
    // SAFETY: a live map value.
    let grown = net - unsafe { *high };
    if grown < every || crate::python::hold_unlocated(&key) {
        return;
    }
    // SAFETY: as above.
    unsafe { *high = net };
    let bytes = grown as u64 * conf!(page_size) as u64;
    let tp = BtfTracePointContext::new(ctx);
    let key = take(&tp, &key, leaf_ret());
    if add(&STACK_AGG, &key, bytes) {
        copy(&key);
    }
}

/// A new stack's registers and the user stack above its pointer, into
/// `STACK_COPIES` for the collector's unwinder: once per key, so a process
/// that keeps growing along the same stacks pays nothing more. The read
/// fails whole where the stack's mapping ends sooner (a main thread's
/// stack ends a few KiB above its first frames): then a quarter, then a
/// sixteenth is tried.
#[inline(always)]
fn copy(key: &StackKey) {
    let (ip_off, sp_off, bp_off) = (conf!(user_ip), conf!(user_sp), conf!(user_bp));
    if ip_off < 0 || sp_off < 0 || bp_off < 0 {
        return;
    }
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let Ok(stack) = crate::rd::<u64>(task, conf!(task_stack)) else {
        return;
    };
    let (Ok(ip), Ok(sp), Ok(bp)) = (
        crate::rd::<u64>(stack, ip_off),
        crate::rd::<u64>(stack, sp_off),
        crate::rd::<u64>(stack, bp_off),
    ) else {
        return;
    };
    let Some(mut entry) = STACK_COPIES.reserve::<StackCopy>(0) else {
        count(copies_lost);
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: the reserved record, written field by field before submit;
    // the reads write within `data`.
    unsafe {
        (*ev).key = *key;
        (*ev).ip = ip;
        (*ev).sp = sp;
        (*ev).bp = bp;
        let data = addr_of_mut!((*ev).data).cast::<c_void>();
        let src = sp as *const c_void;
        let read = |n: u32| aya_ebpf::helpers::generated::bpf_probe_read_user(data, n, src) == 0;
        (*ev).len = if read(STACK_COPY_BYTES as u32) {
            STACK_COPY_BYTES as u64
        } else if read(STACK_COPY_BYTES as u32 / 4) {
            STACK_COPY_BYTES as u64 / 4
        } else if read(STACK_COPY_BYTES as u32 / 16) {
            STACK_COPY_BYTES as u64 / 16
        } else {
            0
        };
    }
    entry.submit(0);
}

/// The word at the current thread's user stack pointer, where the code
/// just before it is a call (`StackKey::leaf_ret`), else 0. Two user
/// reads, once per stack taken. The collector puts it after the innermost
/// frame where the frame-pointer walk did not already find it.
#[inline(always)]
pub(crate) fn leaf_ret() -> u64 {
    let off = conf!(user_sp);
    if off < 0 {
        return 0;
    }
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let Ok(stack) = crate::rd::<u64>(task, conf!(task_stack)) else {
        return 0;
    };
    let Ok(sp) = crate::rd::<u64>(stack, off) else {
        return 0;
    };
    let Ok(ret) = user_u64(sp) else { return 0 };
    if ret < 8 {
        return 0;
    }
    let Ok(code) = user_u64(ret - 8) else {
        return 0;
    };
    if ends_in_call(code.to_le_bytes()) {
        ret
    } else {
        0
    }
}

/// Whether the eight bytes before an address end in an x86-64 call: the
/// forms compilers emit for a call to a function (direct `e8 rel32`,
/// through the GOT `ff 15 disp32`, through a register `[41] ff d0+r`, or
/// a pointer in memory `ff 50+r disp8`, `ff 90+r disp32`).
#[inline(always)]
fn ends_in_call(b: [u8; 8]) -> bool {
    b[3] == 0xe8
        || (b[2] == 0xff && (b[3] == 0x15 || b[3] & 0xf8 == 0x90))
        || (b[6] == 0xff && b[7] & 0xf8 == 0xd0)
        || (b[5] == 0xff && b[6] & 0xf8 == 0x50)
}

#[inline(always)]
fn user_u64(addr: u64) -> Result<u64, i64> {
    let mut v: u64 = 0;
    // SAFETY: bpf_probe_read_user checks the address and fails cleanly.
    let r = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            (&mut v as *mut u64).cast::<c_void>(),
            8,
            addr as *const c_void,
        )
    };
    if r == 0 { Ok(v) } else { Err(r) }
}

/// The key of the current thread's stack in the aggregation maps: its
/// user stack (native, by frame pointers, into `STACKS`), its Python
/// frames where the collector located an interpreter for `key`, and
/// `leaf_ret` (0 where there is no leaf to complete). Shared by the
/// growth stacks and the CUDA allocation probes (`gpu.rs`), so that both
/// make their keys alike.
#[inline(always)]
pub(crate) fn take<C: StackIdContext>(ctx: &C, key: &ProcKey, leaf_ret: u64) -> StackKey {
    let stack_id = match ctx.get_stackid(&STACKS, BPF_F_USER_STACK) {
        Ok(id) => id as i32,
        // Aggregated under the error (-EFAULT: the stack could not be
        // read; -EEXIST: its bucket holds another stack), so the bytes
        // still show, as unreadable.
        Err(e) => {
            count(errors);
            e
        }
    };
    // A located Python's frames, walked at the same point.
    let (py_id, py_state) = crate::python::walk(key);
    StackKey {
        tgid: key.tgid,
        stack_id,
        start_ns: key.start_ns,
        py_id,
        py_state,
        _pad: 0,
        leaf_ret,
    }
}

/// Adds `bytes` and one capture to `key`'s total in `map` (`STACK_AGG`,
/// `GPU_STACK_AGG`); a full map is counted, never silent. Whether the key
/// is new (this call made it).
#[inline(always)]
pub(crate) fn add(map: &HashMap<StackKey, StackVal>, key: &StackKey, bytes: u64) -> bool {
    if let Some(v) = map.get_ptr_mut(key) {
        // SAFETY: aligned u64s in a live map value.
        unsafe {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(addr_of_mut!((*v).bytes), bytes);
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(addr_of_mut!((*v).count), 1);
        }
        return false;
    }
    match map.insert(key, &StackVal { bytes, count: 1 }, BPF_NOEXIST) {
        Ok(()) => return true,
        // Another CPU made it first: add to that one.
        Err(e) if e == -EEXIST => {
            if let Some(v) = map.get_ptr_mut(key) {
                // SAFETY: as above.
                unsafe {
                    atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
                        addr_of_mut!((*v).bytes),
                        bytes,
                    );
                    atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
                        addr_of_mut!((*v).count),
                        1,
                    );
                }
            }
        }
        Err(_) => count(map_full),
    }
    false
}
