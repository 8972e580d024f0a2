//! Where each field a frame walker reads sits, per CPython version.
//!
//! [`PyOffsets`] is plain old data (`#[repr(C)]`, only `u64`s) so that the
//! recorder can copy it as it is into a BPF array map, keyed by interpreter:
//! the in-kernel walker and the userspace walker ([`super::walk`]) then read
//! the same fields at the same offsets, and the userspace walk proves the
//! table right for each interpreter it meets.
//!
//! 3.9 to 3.12 come from the table below; the values are those of release
//! (non-debug) x86-64 builds, read with gdb from the DWARF of pyenv's builds
//! of 3.9.18, 3.10.13, 3.11.7 and 3.12.1 and checked against CPython's
//! headers of those versions. From 3.13 on the interpreter publishes them
//! itself ([`super::debug_offsets`]).

/// A field this interpreter does not have.
pub const NONE: u64 = u64::MAX;

/// How frames hang together and what their instruction field means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Layout {
    /// 3.9: `tstate->frame` is a `PyFrameObject`; `f_lasti` (an `int`) is
    /// a byte offset; lines from `co_lnotab`.
    Py39 = 1,
    /// 3.10: as 3.9, but `f_lasti` counts 2-byte code units and lines come
    /// from 3.10's `co_linetable`.
    Py310 = 2,
    /// 3.11, 3.12: `tstate->cframe->current_frame` is a
    /// `_PyInterpreterFrame`; `prev_instr` points at the instruction being
    /// run, inside the code object's `co_code_adaptive`; lines from the
    /// 3.11 location table.
    Py311 = 3,
    /// 3.13 and later: `tstate->current_frame` directly; `instr_ptr` as
    /// 3.11's `prev_instr`.
    Py313 = 4,
}

/// Byte offsets of every field the walker reads, and the sizes it needs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PyOffsets {
    /// `(major << 8) | minor`: 0x030b for 3.11.
    pub version: u64,
    /// A [`Layout`], as its number.
    pub layout: u64,
    /// `_PyRuntime.interpreters.head`.
    pub runtime_interpreters_head: u64,
    /// `_PyRuntime.gilstate.tstate_current`, the thread holding the GIL
    /// (up to 3.11; [`NONE`] after, where it became thread-local).
    pub runtime_tstate_current: u64,
    /// `PyInterpreterState.tstate_head` / `.threads.head`.
    pub interp_threads_head: u64,
    pub tstate_next: u64,
    /// `frame` (3.9, 3.10), `cframe` (3.11, 3.12), `current_frame` (3.13).
    pub tstate_frame: u64,
    /// `_PyCFrame.current_frame` (3.11, 3.12 only).
    pub cframe_current_frame: u64,
    /// `thread_id`: the thread's `pthread_t`, its TLS base on glibc.
    pub tstate_thread_id: u64,
    /// `native_thread_id`: its tid (3.11 on).
    pub tstate_native_thread_id: u64,
    /// `f_back` / `previous`.
    pub frame_previous: u64,
    /// `f_code` / `f_executable`.
    pub frame_code: u64,
    /// `f_lasti` (an `int`) / `prev_instr` / `instr_ptr` (pointers).
    pub frame_instr: u64,
    /// `owner` (a byte, 3.11 on): 3 is a C-stack shim frame (3.12 on),
    /// which a walker skips.
    pub frame_owner: u64,
    pub code_filename: u64,
    pub code_name: u64,
    /// `co_qualname` (3.11 on).
    pub code_qualname: u64,
    /// `co_firstlineno`, an `int`.
    pub code_firstlineno: u64,
    /// `co_lnotab` (3.9) / `co_linetable`: a bytes object.
    pub code_linetable: u64,
    /// `co_code_adaptive`, where the instructions start (3.11 on).
    pub code_adaptive: u64,
    pub object_type: u64,
    pub type_name: u64,
    pub bytes_size: u64,
    pub bytes_data: u64,
    /// `PyASCIIObject.state` (a bit field in a `u32`).
    pub unicode_state: u64,
    pub unicode_length: u64,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's bytes start.
    pub unicode_ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: where other compact strings'
    /// characters start.
    pub unicode_compact_size: u64,
}

impl PyOffsets {
    pub fn layout(&self) -> Layout {
        match self.layout {
            1 => Layout::Py39,
            2 => Layout::Py310,
            3 => Layout::Py311,
            _ => Layout::Py313,
        }
    }

    /// The struct as bytes, for a BPF map's value.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: repr(C), only u64 fields: no padding, every byte initialised.
        unsafe {
            std::slice::from_raw_parts(
                (self as *const Self).cast::<u8>(),
                std::mem::size_of::<Self>(),
            )
        }
    }
}

/// Fields every version from 3.9 shares.
const BASE: PyOffsets = PyOffsets {
    version: 0,
    layout: 0,
    runtime_interpreters_head: NONE,
    runtime_tstate_current: NONE,
    interp_threads_head: NONE,
    tstate_next: 8,
    tstate_frame: NONE,
    cframe_current_frame: NONE,
    tstate_thread_id: NONE,
    tstate_native_thread_id: NONE,
    frame_previous: NONE,
    frame_code: NONE,
    frame_instr: NONE,
    frame_owner: NONE,
    code_filename: NONE,
    code_name: NONE,
    code_qualname: NONE,
    code_firstlineno: NONE,
    code_linetable: NONE,
    code_adaptive: NONE,
    object_type: 8,
    type_name: 24,
    bytes_size: 16,
    bytes_data: 32,
    unicode_state: 32,
    unicode_length: 16,
    unicode_ascii_size: 48,
    unicode_compact_size: 72,
};

/// The table for a version below 3.13, or `None` for one it lacks.
pub fn table(major: u8, minor: u8) -> Option<PyOffsets> {
    let v = (u64::from(major) << 8) | u64::from(minor);
    let o = match (major, minor) {
        (3, 9) | (3, 10) => PyOffsets {
            version: v,
            layout: if minor == 9 {
                Layout::Py39
            } else {
                Layout::Py310
            } as u64,
            runtime_interpreters_head: 32,
            runtime_tstate_current: 568,
            interp_threads_head: 8,
            tstate_frame: 24,
            tstate_thread_id: 176,
            frame_previous: 24,
            frame_code: 32,
            frame_instr: if minor == 9 { 104 } else { 96 },
            code_filename: 104,
            code_name: 112,
            code_firstlineno: 40,
            code_linetable: 120,
            ..BASE
        },
        (3, 11) => PyOffsets {
            version: v,
            layout: Layout::Py311 as u64,
            runtime_interpreters_head: 40,
            runtime_tstate_current: 576,
            interp_threads_head: 16,
            tstate_frame: 56,
            cframe_current_frame: 8,
            tstate_thread_id: 152,
            tstate_native_thread_id: 160,
            frame_previous: 48,
            frame_code: 32,
            frame_instr: 56,
            frame_owner: 69,
            code_filename: 112,
            code_name: 120,
            code_qualname: 128,
            code_firstlineno: 72,
            code_linetable: 136,
            code_adaptive: 184,
            ..BASE
        },
        (3, 12) => PyOffsets {
            version: v,
            layout: Layout::Py311 as u64,
            runtime_interpreters_head: 40,
            interp_threads_head: 72,
            tstate_frame: 56,
            cframe_current_frame: 0,
            tstate_thread_id: 136,
            tstate_native_thread_id: 144,
            frame_previous: 8,
            frame_code: 0,
            frame_instr: 56,
            frame_owner: 70,
            code_filename: 112,
            code_name: 120,
            code_qualname: 128,
            code_firstlineno: 68,
            code_linetable: 136,
            code_adaptive: 192,
            // 3.12 dropped `wstr`.
            unicode_ascii_size: 40,
            unicode_compact_size: 56,
            ..BASE
        },
        _ => return None,
    };
    Some(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_fills_what_its_layout_reads() {
        for minor in 9..=12 {
            let o = table(3, minor).unwrap();
            assert_eq!(o.version, 0x0300 | u64::from(minor));
            let always = [
                o.runtime_interpreters_head,
                o.interp_threads_head,
                o.tstate_frame,
                o.tstate_thread_id,
                o.frame_previous,
                o.frame_code,
                o.frame_instr,
                o.code_filename,
                o.code_name,
                o.code_firstlineno,
                o.code_linetable,
            ];
            assert!(always.iter().all(|&f| f != NONE), "3.{minor}: {o:?}");
            if o.layout() == Layout::Py311 {
                assert_ne!(o.cframe_current_frame, NONE);
                assert_ne!(o.code_adaptive, NONE);
                assert_ne!(o.code_qualname, NONE);
                assert_ne!(o.tstate_native_thread_id, NONE);
            }
        }
        assert!(table(3, 8).is_none());
        assert!(table(3, 13).is_none(), "3.13 reads its own offsets");
    }

    #[test]
    fn the_map_value_is_every_field_in_order() {
        let o = table(3, 11).unwrap();
        let b = o.as_bytes();
        assert_eq!(b.len(), 8 * 28);
        assert_eq!(u64::from_ne_bytes(b[..8].try_into().unwrap()), 0x030b);
        assert_eq!(u64::from_ne_bytes(b[8..16].try_into().unwrap()), 3);
    }
}
