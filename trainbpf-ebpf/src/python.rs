//! The Python frames of a growth stack (`record --stacks`), read in the
//! kernel at the same point as the native stack, for a process whose
//! interpreter the collector located and described in `PY_PROCS`
//! (`trainbpf::python` finds it and proves the offsets from userspace).
//!
//! The walk: `_PyRuntime` → the main interpreter → the thread state whose
//! `native_thread_id` is this thread's tid (3.11 on; before, the GIL's
//! holder) → its top frame (through `_PyCFrame` on 3.11, 3.12) → each
//! frame's code object and instruction field, following `previous`, shim
//! frames of 3.12 on skipped. The (code, instr) pairs are kept in
//! `PY_STACKS` under a hash of them; userspace names them while the
//! process lives. Every loop is bounded; a read that faults ends the walk
//! with a state that says where.

use core::ffi::c_void;

use aya_ebpf::helpers::bpf_send_signal_thread;
use aya_ebpf::helpers::{bpf_get_current_pid_tgid, generated};
use trainbpf_common::{
    ExeOf, ExecHold, FileKey, PY_AT_EXEC, PY_DEEP, PY_EMPTY, PY_FAULT_FRAMES, PY_FAULT_THREADS,
    PY_MANY_THREADS, PY_MAX_FRAMES, PY_MAX_THREADS, PY_NO_THREAD, PY_NONE, PY_NOT_INIT, PY_OK,
    PY_STORE_FULL, PyProc, PyStack,
};

use crate::{
    maps::{EXE_OF, EXEC_HOLD, PY_EXES, PY_PROCS, PY_SCRATCH, PY_STACKS, ProcKey},
    rd,
};

/// A field the version lacks.
const NONE: u64 = u64::MAX;
const BPF_NOEXIST: u64 = 1;
const EEXIST: i32 = 17;
/// FNV-1a's 64-bit basis and prime: a cheap mix of the pairs.
const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Reads a `u64` at `base + off` of the current process. The helper
/// zero-fills on failure, so nothing branches on the result: the error
/// (negative) is or-ed into `bad`. Few branches per step keep the
/// verifier's walk through the bounded loops short.
#[inline(always)]
fn user(base: u64, off: u64, bad: &mut i64) -> u64 {
    let mut v: u64 = 0;
    // SAFETY: bpf_probe_read_user checks the address and fails cleanly
    // (a page not present is a failure, never a fault taken).
    let r = unsafe {
        generated::bpf_probe_read_user(
            (&mut v as *mut u64).cast::<c_void>(),
            8,
            base.wrapping_add(off) as *const c_void,
        )
    };
    *bad |= r;
    v
}

/// The current thread's thread state, or the state that says why none.
#[inline(always)]
fn thread_state(p: &PyProc) -> Result<u64, u32> {
    let mut bad = 0;
    let interp = user(p.runtime, p.runtime_interpreters_head, &mut bad);
    if bad != 0 {
        return Err(PY_FAULT_THREADS);
    }
    if interp == 0 {
        return Err(PY_NOT_INIT);
    }
    if p.tstate_native_thread_id == NONE {
        // Before 3.11 a thread state holds only its pthread_t: the thread
        // running Python is the GIL's holder.
        let t = user(p.runtime, p.runtime_tstate_current, &mut bad);
        return match (bad, t) {
            (0, 0) => Err(PY_NO_THREAD),
            (0, t) => Ok(t),
            _ => Err(PY_FAULT_THREADS),
        };
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    let (native_off, next_off) = (p.tstate_native_thread_id, p.tstate_next);
    let mut t = user(interp, p.interp_threads_head, &mut bad);
    for _ in 0..PY_MAX_THREADS {
        if t == 0 {
            return Err(if bad != 0 {
                PY_FAULT_THREADS
            } else {
                PY_NO_THREAD
            });
        }
        if user(t, native_off, &mut bad) as u32 == tid {
            return Ok(t);
        }
        t = user(t, next_off, &mut bad);
    }
    Err(PY_MANY_THREADS)
}

/// The current thread's Python frames, when `key` is a located
/// interpreter: `(py_id, state)`, `py_id` 0 where nothing was kept.
///
/// Each kept pair is `(code | owner << 56, instr)` as read: the owner
/// byte (3.12 on; userspace points it at a byte of the code pointer
/// before) and the whole 8 bytes at the instruction field (`f_lasti` is an
/// `int`: userspace keeps the low half). Userspace drops shim frames.
#[inline(always)]
pub(crate) fn walk(key: &ProcKey) -> (u64, u32) {
    let Some(s) = PY_SCRATCH.get_ptr_mut(0) else {
        return (0, PY_FAULT_FRAMES);
    };
    let (hash, state) = read(key, s);
    if hash == 0 {
        return (0, state);
    }
    // SAFETY: this CPU's scratch slot; the map copies the value from it.
    match PY_STACKS.insert(&hash, unsafe { &*s }, BPF_NOEXIST) {
        Ok(()) => (hash, state),
        Err(e) if e == -EEXIST => (hash, state),
        Err(_) => (0, PY_STORE_FULL),
    }
}

/// Reads the current thread's frames into `out` (its `len` set): their
/// hash (0: none read) and the walk's state. `out` is a map value or a
/// reserved ring-buffer record (the victim's stack at death).
#[inline(always)]
pub(crate) fn read(key: &ProcKey, out: *mut PyStack) -> (u64, u32) {
    // SAFETY: `out` is writable for its size (the callers' contract).
    unsafe { (*out).len = 0 };
    // An attached process is described under its pid alone until the
    // collector meets its start time (`locate_attached`).
    let wild = ProcKey {
        tgid: key.tgid,
        _pad: 0,
        start_ns: 0,
    };
    let Some(p) = PY_PROCS
        .get_ptr_mut(key)
        .or_else(|| PY_PROCS.get_ptr_mut(&wild))
    else {
        return (0, PY_NONE);
    };
    // SAFETY: a live map value; the collector replaces it whole, and
    // `find_lib` writes only what every walker would write.
    let p = unsafe { &mut *p };
    if p.lib_dynamic != 0 && !find_lib(p) {
        // The loader has not mapped it yet: no Python code runs before.
        return (0, PY_NOT_INIT | PY_AT_EXEC);
    }
    let (id, state) = read_with(p, out);
    // The collector names a walk made with the kernel's own description
    // only once it has met the exec that made it.
    let tag = if p.at_exec != 0 { PY_AT_EXEC } else { 0 };
    (id, state | tag)
}

#[inline(always)]
fn read_with(p: &PyProc, out: *mut PyStack) -> (u64, u32) {
    let tstate = match thread_state(p) {
        Ok(t) => t,
        Err(state) => return (0, state),
    };
    let mut bad = 0;
    let mut frame = user(tstate, p.tstate_frame, &mut bad);
    if p.cframe_current_frame != NONE && frame != 0 {
        frame = user(frame, p.cframe_current_frame, &mut bad);
    }
    if bad != 0 {
        return (0, PY_FAULT_THREADS);
    }
    let (code_off, instr_off, owner_off, prev_off) =
        (p.frame_code, p.frame_instr, p.frame_owner, p.frame_previous);
    let mut n: usize = 0;
    let mut hash = FNV_BASIS;
    for i in 0..PY_MAX_FRAMES {
        if frame == 0 {
            break;
        }
        let code = user(frame, code_off, &mut bad);
        let instr = user(frame, instr_off, &mut bad);
        let owner = user(frame, owner_off, &mut bad) & 0xff;
        let tagged = code | owner << 56;
        // SAFETY: `out` as above; `i` is below its length.
        if let Some(slot) = unsafe { (*out).frames.get_mut(i) } {
            slot[0] = tagged;
            slot[1] = instr;
        }
        hash = (hash ^ tagged).wrapping_mul(FNV_PRIME);
        hash = (hash ^ instr).wrapping_mul(FNV_PRIME);
        n = i + 1;
        frame = user(frame, prev_off, &mut bad);
    }
    let state = if bad != 0 {
        PY_FAULT_FRAMES
    } else if frame != 0 {
        PY_DEEP
    } else if n == 0 {
        return (0, PY_EMPTY);
    } else {
        PY_OK
    };
    if n == 0 {
        return (0, state);
    }
    // SAFETY: as above.
    unsafe { (*out).len = n as u64 };
    let id = match (hash ^ n as u64).wrapping_mul(FNV_PRIME) {
        0 => 1,
        h => h,
    };
    (id, state)
}

/// A forked child of a located Python runs the same interpreter at the
/// same addresses: it gets its parent's description here, in the parent's
/// context before the child first runs, so that a worker's copy-on-write
/// growth, which starts at once, is walked from its first stack (the
/// collector reads the fork later). A full map leaves the child to the
/// collector's own look-up.
#[inline(always)]
pub(crate) fn inherit(parent: &ProcKey, child: &ProcKey) {
    // SAFETY: the helper copies the value (a copy here would be a call
    // to `memcpy`, as in `at_exec`).
    let Some(p) = (unsafe { PY_PROCS.get(parent) }) else {
        return;
    };
    let _ = PY_PROCS.insert(child, p, 0);
}

/// A process exec'd: its description no longer fits its program.
/// Whether it had one.
#[inline(always)]
pub(crate) fn forget(key: &ProcKey) -> bool {
    PY_PROCS.remove(key).is_ok()
}

const SIGSTOP: u32 = 19;

/// What `at_exec` did.
pub(crate) enum AtExec {
    /// Nothing: no interpreter filed under the file, and no hold.
    Nothing,
    /// Described from `PY_EXES`: its first stack is walked.
    Described,
    /// Stopped (SIGSTOP to itself, taken before its first instruction):
    /// the collector looks for its interpreter, then continues it.
    Held,
}

/// A job process exec'd (`task`, current, keyed `key`): notes the file
/// and load address in `EXE_OF`, and describes its interpreter at once
/// when the collector filed one under that file (`PY_EXES`), `_PyRuntime`
/// moved by where this exec loaded the code. Else, for the job's root
/// (`EXEC_HOLD`), where `may_hold` (nothing was described before the
/// exec, and its record is reserved), holds it.
#[inline(always)]
pub(crate) fn at_exec(task: u64, key: &ProcKey, may_hold: bool) -> AtExec {
    let Some((exe, start_code)) = exe_of(task) else {
        return AtExec::Nothing;
    };
    let _ = EXE_OF.insert(key, &ExeOf { exe, start_code }, 0);
    // SAFETY: the value is copied out at once.
    if let Some(t) = unsafe { PY_EXES.get(&exe) } {
        // Copied by the helper and moved in place: a copy of the struct
        // here would be a call to `memcpy`, which kernels before 6.x
        // refuse in a tracing program.
        if PY_PROCS.insert(key, t, 0).is_err() {
            return AtExec::Nothing;
        }
        let Some(p) = PY_PROCS.get_ptr_mut(key) else {
            return AtExec::Nothing;
        };
        // SAFETY: a live map value; an exec is its process's only thread.
        unsafe {
            if (*p).lib_dynamic == 0 {
                (*p).runtime = (*p).runtime.wrapping_add(start_code);
            } else {
                // The library is found at the first walk after the loader
                // mapped it (`find_lib`).
                (*p).debug_slot = (*p).debug_slot.wrapping_add(start_code);
            }
            (*p).at_exec = 1;
        }
        return AtExec::Described;
    }
    // A program that was a located Python exec'ing another is not held:
    // its stacks before the exec must be named with the interpreter the
    // collector has, before it looks for the new one.
    if !may_hold {
        return AtExec::Nothing;
    }
    let Some(h) = EXEC_HOLD.get_ptr_mut(&key.tgid) else {
        return AtExec::Nothing;
    };
    // SAFETY: a live map value; an exec is its process's only thread.
    unsafe {
        if (*h).left == 0 {
            return AtExec::Nothing;
        }
        (*h).left -= 1;
        (*h).armed = 0;
    }
    if stop(h) {
        AtExec::Held
    } else {
        AtExec::Nothing
    }
}

/// Stops the current process (SIGSTOP to the current thread, taken on
/// its way back to user mode), the stop marked as the hold's own.
#[inline(always)]
fn stop(h: *mut ExecHold) -> bool {
    // SAFETY: a live map value; `signal_generate` runs inside the send,
    // on this CPU, and reads the mark.
    unsafe {
        (*h).sending = 1;
        let r = bpf_send_signal_thread(SIGSTOP);
        (*h).sending = 0;
        r == 0
    }
}

/// Whether a SIGSTOP to `tgid` being generated is the hold's own
/// (`signals.rs`: not the job's story, not recorded).
#[inline(always)]
pub(crate) fn own_stop(tgid: u32) -> bool {
    // SAFETY: read only.
    unsafe { EXEC_HOLD.get(&tgid) }.is_some_and(|h| h.sending != 0)
}

/// How long a stack of the held root waits for the collector (the
/// trampoline's parent-death signal continues it if the recorder dies).
const HOLD_WAIT_NS: u64 = 2_000_000_000;

/// A growth stack of `key` is due. Where the collector armed the root's
/// hold (its exec held, no interpreter mapped yet) and the kernel has no
/// description of it, stops it for the collector, which polls
/// `EXEC_HOLD`, to look again; true while that stack should wait: its
/// growth goes to the next one, taken once the root runs again (a stack
/// taken now would have no Python frames). Threads racing here may each
/// send a stop: one continue ends them all.
#[inline(always)]
pub(crate) fn hold_unlocated(key: &ProcKey) -> bool {
    let Some(h) = EXEC_HOLD.get_ptr_mut(&key.tgid) else {
        return false;
    };
    // SAFETY: helper without preconditions.
    let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    // SAFETY: a live map value.
    unsafe {
        if (*h).held_ns != 0 {
            return now.wrapping_sub((*h).held_ns) < HOLD_WAIT_NS;
        }
        if (*h).armed == 0 {
            return false;
        }
        // SAFETY: read only.
        if PY_PROCS.get(key).is_some() {
            return false;
        }
        // Saturating: two threads may both have seen it armed.
        (*h).armed = (*h).armed.saturating_sub(1);
        if !stop(h) {
            return false;
        }
        (*h).held_ns = now.max(1);
    }
    true
}

/// Objects of the loader's list looked at for the library.
const LINK_MAPS: usize = 64;
/// `struct r_debug`'s `r_map`; `struct link_map`'s `l_addr`, `l_ld`,
/// `l_next` (the public head of glibc's and musl's alike).
const R_MAP: u64 = 8;
const L_ADDR: u64 = 0;
const L_LD: u64 = 16;
const L_NEXT: u64 = 24;

/// Finds a described `libpython` (`PyProc::lib_dynamic`) in the current
/// process through the dynamic loader's list, and completes the
/// description with its `_PyRuntime`. Every walker that finds it writes
/// the same two fields, `runtime` first.
#[inline(always)]
fn find_lib(p: &mut PyProc) -> bool {
    let mut bad = 0;
    let r_debug = user(p.debug_slot, 0, &mut bad);
    if bad != 0 || r_debug == 0 {
        return false;
    }
    let mut lm = user(r_debug, R_MAP, &mut bad);
    for _ in 0..LINK_MAPS {
        if lm == 0 || bad != 0 {
            return false;
        }
        let l_addr = user(lm, L_ADDR, &mut bad);
        let l_ld = user(lm, L_LD, &mut bad);
        if bad == 0 && l_ld.wrapping_sub(l_addr) == p.lib_dynamic {
            p.runtime = l_addr.wrapping_add(p.lib_runtime);
            p.lib_dynamic = 0;
            return true;
        }
        lm = user(lm, L_NEXT, &mut bad);
    }
    false
}

/// The current process's executable (the kernel's dev_t and inode) and
/// its code's load address.
#[inline(always)]
fn exe_of(task: u64) -> Option<(FileKey, u64)> {
    let mm: u64 = rd(task, conf!(task_mm)).ok()?;
    let file: u64 = rd(mm, conf!(mm_exe_file)).ok()?;
    let start_code: u64 = rd(mm, conf!(mm_start_code)).ok()?;
    let inode: u64 = rd(file, conf!(file_inode)).ok()?;
    let ino: u64 = rd(inode, conf!(inode_ino)).ok()?;
    let sb: u64 = rd(inode, conf!(inode_sb)).ok()?;
    let dev: u32 = rd(sb, conf!(sb_dev)).ok()?;
    Some((
        FileKey {
            dev: dev as u64,
            ino,
        },
        start_code,
    ))
}
