//! The Python frames of a stack, named: what the kernel's walker is told
//! of an interpreter, how to read the pairs it keeps, and how they take
//! the interpreter's own native frames' place. No reads of their own:
//! each pair is named by the caller's function.

use trainbpf_common::{
    PY_DEEP, PY_EMPTY, PY_FAULT_FRAMES, PY_FAULT_THREADS, PY_MANY_THREADS, PY_MAX_FRAMES,
    PY_MAX_THREADS, PY_NO_THREAD, PY_NONE, PY_NOT_INIT, PY_OK, PY_STORE_FULL, PyProc, PyStack,
};
use trainbpf_report::decode::stacks::{FOUND_PYTHON, Frame};

use super::super::symbolize::bounded;
use crate::record::stacks::python::{Layout, PyError, PyFrame, PyOffsets, offsets::NONE};

/// What the kernel's walker needs, from the offsets the userspace walker
/// reads with.
pub fn describe_offsets(o: &PyOffsets, runtime: u64) -> PyProc {
    PyProc {
        runtime,
        version: o.version,
        runtime_interpreters_head: o.runtime_interpreters_head,
        runtime_tstate_current: o.runtime_tstate_current,
        interp_threads_head: o.interp_threads_head,
        tstate_next: o.tstate_next,
        tstate_frame: o.tstate_frame,
        cframe_current_frame: if o.layout() == Layout::Py311 {
            o.cframe_current_frame
        } else {
            NONE
        },
        tstate_native_thread_id: o.tstate_native_thread_id,
        frame_previous: o.frame_previous,
        frame_code: o.frame_code,
        frame_instr: o.frame_instr,
        // Shim frames (owner 3) exist from 3.12; before, the walker reads
        // a byte of the code pointer instead (it never branches on a
        // missing field), which `pair` ignores.
        frame_owner: if o.version >= 0x030c {
            o.frame_owner
        } else {
            o.frame_code
        },
        instr_is_int: u64::from(matches!(o.layout(), Layout::Py39 | Layout::Py310)),
        at_exec: 0,
        lib_dynamic: 0,
        lib_runtime: 0,
        debug_slot: 0,
    }
}

/// `CODE_MASK` keeps a kept pair's code pointer, the bits above it hold
/// the frame's owner byte (`python.rs` in the eBPF crate).
const CODE_MASK: u64 = (1 << 56) - 1;
/// 3.12's `FRAME_OWNED_BY_CSTACK`.
const OWNED_BY_CSTACK: u64 = 3;

/// A pair as the kernel kept it, as `Interpreter::resolve` takes it:
/// `None` for a shim frame (3.12 on) that stands for no Python code.
pub fn pair(p: &PyProc, tagged: u64, instr: u64) -> Option<(u64, u64)> {
    let owner = tagged >> 56;
    if p.version >= 0x030c && owner == OWNED_BY_CSTACK {
        return None;
    }
    let instr = if p.instr_is_int != 0 {
        // `f_lasti` is an int: the low half, sign-extended.
        instr as u32 as i32 as i64 as u64
    } else {
        instr
    };
    Some((tagged & CODE_MASK, instr))
}

/// Why a walk kept no frames (or not all), in the report's words.
pub fn state_text(state: u32, kept: usize) -> Option<String> {
    let s = match state {
        PY_OK | PY_NONE => return None,
        PY_DEEP => format!("Python stack deeper than {PY_MAX_FRAMES} frames: the innermost kept"),
        PY_FAULT_FRAMES => {
            format!("Python frame chain unreadable after {kept} frames (a read fault)")
        }
        PY_NO_THREAD => "Python frames not read: this thread has no Python thread state".into(),
        PY_EMPTY => "no Python frame running on this thread".into(),
        PY_FAULT_THREADS => {
            "Python frames not read: the interpreter's thread states could not be read (a read fault)".into()
        }
        PY_NOT_INIT => "Python frames not read: the interpreter was not initialised yet".into(),
        PY_MANY_THREADS => {
            format!("Python frames not read: more than {PY_MAX_THREADS} thread states")
        }
        PY_STORE_FULL => "Python frames not kept: the kernel's Python stack table was full".into(),
        s => format!("Python frames not read (state {s})"),
    };
    Some(s)
}

/// The native frames, the interpreter's own folded, with the Python
/// frames in their place: the native frames inside the allocation (libc,
/// an extension) down to the first frame of the interpreter's file (or
/// one not symbolized: without frame pointers, what follows is guesswork),
/// then the Python frames, innermost first.
pub fn fold(native: &[Frame], python: Vec<Frame>, interpreter: &str) -> Vec<Frame> {
    if python.is_empty() {
        return native.to_vec();
    }
    let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    let interp = base(interpreter);
    let mut out: Vec<Frame> = native
        .iter()
        .take_while(|f| {
            f.function.is_some() && f.module.as_deref().is_some_and(|m| base(m) != interp)
        })
        .cloned()
        .collect();
    out.extend(python);
    out.truncate(trainbpf_report::decode::stacks::MAX_FRAMES);
    out
}

/// The pairs of `st` that [`name_pairs`] will ask to name, in its order,
/// with `left` names left in the pass.
pub fn pairs_to_name(desc: &PyProc, st: &PyStack, left: usize) -> Vec<(u64, u64)> {
    let n = (st.len as usize).min(PY_MAX_FRAMES);
    st.frames[..n]
        .iter()
        .filter_map(|&[tagged, instr]| pair(desc, tagged, instr))
        .take(left)
        .collect()
}

/// Names the kept pairs of `st`, innermost first, each by `name` (which
/// may add a note on how it named it: through a parent, from an earlier
/// read); a frame it cannot name keeps its code object's address, and the
/// first reason becomes the stack's note.
pub fn name_pairs(
    desc: &PyProc,
    state: u32,
    st: &PyStack,
    left: &mut usize,
    mut name: impl FnMut(u64, u64) -> (Result<PyFrame, PyError>, Option<&'static str>),
) -> (Vec<Frame>, Option<String>) {
    let n = (st.len as usize).min(PY_MAX_FRAMES);
    let mut note = state_text(state, n);
    let mut out = Vec::with_capacity(n);
    let mut cut = 0;
    for &[tagged, instr] in &st.frames[..n] {
        let Some((code, instr)) = pair(desc, tagged, instr) else {
            continue;
        };
        // Past the pass's bound, a frame keeps its code object's address.
        if *left == 0 {
            cut += 1;
            out.push(Frame {
                kind: "python".into(),
                addr: code,
                found: Some(FOUND_PYTHON.into()),
                ..Default::default()
            });
            continue;
        }
        *left -= 1;
        let (named, how) = name(code, instr);
        if let Some(how) = how {
            note.get_or_insert_with(|| how.into());
        }
        match named {
            Ok(f) => out.push(Frame {
                kind: "python".into(),
                addr: code,
                function: Some(bounded(&f.function)),
                file: Some(bounded(&f.file)),
                line: f.line.and_then(|l| u32::try_from(l).ok()),
                module: None,
                found: Some(FOUND_PYTHON.into()),
            }),
            Err(e) => {
                note.get_or_insert_with(|| bounded(&format!("a Python frame: {e}")));
                out.push(Frame {
                    kind: "python".into(),
                    addr: code,
                    found: Some(FOUND_PYTHON.into()),
                    ..Default::default()
                });
            }
        }
    }
    if cut > 0 {
        super::frames_cut(cut);
        note.get_or_insert_with(|| {
            format!(
                "{cut} Python frames not named: more than {} were named for this process in one pass",
                super::MAX_FRAMES_PER_PASS
            )
        });
    }
    (out, note)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(f: &str, module: &str) -> Frame {
        Frame {
            kind: "native".into(),
            function: Some(f.into()),
            module: Some(module.into()),
            ..Default::default()
        }
    }

    fn py(f: &str) -> Frame {
        Frame {
            kind: "python".into(),
            function: Some(f.into()),
            file: Some("leak.py".into()),
            line: Some(3),
            ..Default::default()
        }
    }

    /// The allocation's own native frames stay, the interpreter's are
    /// folded, and the Python frames follow them, innermost first.
    #[test]
    fn interpreter_frames_are_folded() {
        let n = vec![
            native("__memset_avx2", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
            native("bytearray_init", "/usr/bin/python3.11"),
            native("_PyEval_EvalFrameDefault", "/usr/bin/python3.11"),
            native("main", "/usr/bin/python3.11"),
        ];
        let out = fold(&n, vec![py("leak_step"), py("main")], "/usr/bin/python3.11");
        let names: Vec<_> = out.iter().map(|f| f.function.clone().unwrap()).collect();
        assert_eq!(names, ["__memset_avx2", "leak_step", "main"]);
        assert_eq!(out[1].kind, "python");
        // An unsymbolized frame ends the native part too.
        let mut odd = n.clone();
        odd[1].function = None;
        assert_eq!(fold(&odd, vec![py("f")], "python3.11").len(), 2);
        // No Python frames: the native stack as it was.
        assert_eq!(fold(&n, Vec::new(), "python3.11"), n);
    }

    #[test]
    fn every_state_has_words() {
        assert_eq!(state_text(PY_OK, 3), None);
        for s in [
            PY_DEEP,
            PY_FAULT_FRAMES,
            PY_NO_THREAD,
            PY_EMPTY,
            PY_FAULT_THREADS,
            PY_NOT_INIT,
            PY_MANY_THREADS,
            PY_STORE_FULL,
        ] {
            let t = state_text(s, 2).unwrap();
            assert!(!t.contains("(state"), "{s}: {t}");
        }
    }

    /// The kernel's walker gets the fields of the table the userspace
    /// walker is tested with, and each layout's quirks.
    #[test]
    fn describes_each_layout() {
        use crate::record::stacks::python::offsets::table;
        let p = describe_offsets(&table(3, 11).unwrap(), 0x1000);
        assert_eq!((p.runtime, p.version), (0x1000, 0x030b));
        assert_eq!(p.cframe_current_frame, 8);
        assert_eq!(p.frame_owner, p.frame_code, "3.11 has no shim frames");
        assert_eq!(p.instr_is_int, 0);
        let p = describe_offsets(&table(3, 12).unwrap(), 0);
        assert_eq!((p.cframe_current_frame, p.frame_owner), (0, 70));
        let p = describe_offsets(&table(3, 10).unwrap(), 0);
        assert_eq!(p.instr_is_int, 1);
        assert_eq!(
            p.tstate_native_thread_id, NONE,
            "the GIL's holder is walked"
        );
        assert_eq!(p.cframe_current_frame, NONE);
    }

    /// The kernel's pairs: the owner byte above the code pointer, an
    /// `int` instruction field's other half ignored.
    #[test]
    fn pairs_as_kept() {
        use crate::record::stacks::python::offsets::table;
        let p312 = describe_offsets(&table(3, 12).unwrap(), 0);
        let code = 0x7f12_3456_7890;
        assert_eq!(pair(&p312, code | 3 << 56, 5), None, "a shim frame");
        assert_eq!(pair(&p312, code, 0x55), Some((code, 0x55)));
        let p311 = describe_offsets(&table(3, 11).unwrap(), 0);
        // Before 3.12 the byte read is the code pointer's own.
        assert_eq!(pair(&p311, code | 0x90 << 56, 7), Some((code, 7)));
        assert_eq!(pair(&p311, code | 3 << 56, 7), Some((code, 7)));
        let p310 = describe_offsets(&table(3, 10).unwrap(), 0);
        assert_eq!(
            pair(&p310, code, 0x1234_5678_ffff_fffe),
            Some((code, -2i64 as u64)),
            "f_lasti is the low half"
        );
    }

    /// Past a pass's bound, frames keep only their code objects'
    /// addresses, the stack says so, and the cut is counted.
    #[test]
    fn a_pass_names_a_bounded_number_of_frames() {
        use crate::record::stacks::python::offsets::table;
        let desc = describe_offsets(&table(3, 11).unwrap(), 0);
        let mut st = PyStack {
            len: 3,
            frames: [[0; 2]; PY_MAX_FRAMES],
        };
        for (i, f) in st.frames.iter_mut().take(3).enumerate() {
            *f = [0x1000 * (i as u64 + 1), 0];
        }
        let before = crate::record::samplers::procfs::guard::STATS
            .snapshot()
            .py_frames_cut;
        let mut left = 1;
        let mut asked = 0;
        let (frames, note) = name_pairs(&desc, PY_OK, &st, &mut left, |code, instr| {
            asked += 1;
            (
                Ok(PyFrame {
                    code,
                    instr,
                    file: "a.py".into(),
                    function: "f".into(),
                    line: Some(1),
                }),
                None,
            )
        });
        assert_eq!((asked, left), (1, 0));
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[0].function.as_deref(), Some("f"));
        assert!(frames[1].function.is_none() && frames[1].addr == 0x2000);
        assert!(note.is_some_and(|n| n.starts_with("2 Python frames not named")));
        assert!(
            crate::record::samplers::procfs::guard::STATS
                .snapshot()
                .py_frames_cut
                >= before + 2
        );
    }
}
