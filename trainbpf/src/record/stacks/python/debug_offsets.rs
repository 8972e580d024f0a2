//! 3.13's `_Py_DebugOffsets`: the interpreter's own description of its
//! structs, at the very start of `_PyRuntime` (CPython's
//! `Include/internal/pycore_debug_offsets.h` in 3.13, `pycore_runtime.h`'s
//! `_Py_DebugOffsets`). Every field is a `uint64_t`; the layout of the
//! description itself is that of 3.13 and is checked by its cookie and
//! version before a field is trusted. 3.14 reorders the description, so a
//! later version is refused with its reason rather than misread.

use super::{
    PyError,
    offsets::{Layout, PyOffsets},
};

/// The first bytes of a `_Py_DebugOffsets`.
pub const COOKIE: &[u8; 8] = b"xdebugpy";

/// Bytes of 3.13's `_Py_DebugOffsets` (gdb `ptype /o` of 3.13.0).
pub const SIZE: usize = 584;

/// Byte positions of the fields read, within 3.13's `_Py_DebugOffsets`.
mod at {
    pub const VERSION: usize = 8;
    pub const FREE_THREADED: usize = 16;
    pub const RUNTIME_INTERPRETERS_HEAD: usize = 40;
    pub const INTERP_THREADS_HEAD: usize = 72;
    pub const TSTATE_NEXT: usize = 168;
    pub const TSTATE_CURRENT_FRAME: usize = 184;
    pub const TSTATE_THREAD_ID: usize = 192;
    pub const TSTATE_NATIVE_THREAD_ID: usize = 200;
    pub const FRAME_PREVIOUS: usize = 232;
    pub const FRAME_EXECUTABLE: usize = 240;
    pub const FRAME_INSTR_PTR: usize = 248;
    pub const FRAME_OWNER: usize = 264;
    pub const CODE_FILENAME: usize = 280;
    pub const CODE_NAME: usize = 288;
    pub const CODE_QUALNAME: usize = 296;
    pub const CODE_LINETABLE: usize = 304;
    pub const CODE_FIRSTLINENO: usize = 312;
    pub const CODE_ADAPTIVE: usize = 344;
    pub const OBJECT_TYPE: usize = 360;
    pub const TYPE_NAME: usize = 376;
    pub const BYTES_SIZE: usize = 520;
    pub const BYTES_DATA: usize = 528;
    pub const UNICODE_STATE: usize = 544;
    pub const UNICODE_LENGTH: usize = 552;
    pub const UNICODE_ASCII_SIZE: usize = 560;
}

/// The offsets `raw` (the first [`SIZE`] bytes of `_PyRuntime`) describes.
pub fn parse(raw: &[u8]) -> Result<PyOffsets, PyError> {
    let bad = |reason: String| PyError::DebugOffsets { reason };
    if raw.len() < SIZE {
        return Err(bad(format!("{} bytes, 3.13's has {SIZE}", raw.len())));
    }
    if &raw[..8] != COOKIE {
        return Err(bad(format!(
            "no \"xdebugpy\" cookie at the start of _PyRuntime (found {:?})",
            String::from_utf8_lossy(&raw[..8])
        )));
    }
    let u = |i: usize| u64::from_le_bytes(raw[i..i + 8].try_into().expect("8 bytes"));
    let hex = u(at::VERSION);
    let (major, minor) = ((hex >> 24) & 0xff, (hex >> 16) & 0xff);
    if (major, minor) != (3, 13) {
        return Err(PyError::UnsupportedVersion {
            version: format!("{major}.{minor}"),
            reason: "its _Py_DebugOffsets are laid out differently from 3.13's, the one this \
                     build reads"
                .into(),
        });
    }
    if u(at::FREE_THREADED) != 0 {
        return Err(PyError::UnsupportedVersion {
            version: "3.13t".into(),
            reason: "a free-threaded build: its objects' headers differ".into(),
        });
    }
    let ascii = u(at::UNICODE_ASCII_SIZE);
    let o = PyOffsets {
        version: (major << 8) | minor,
        layout: Layout::Py313 as u64,
        runtime_interpreters_head: u(at::RUNTIME_INTERPRETERS_HEAD),
        runtime_tstate_current: super::offsets::NONE,
        interp_threads_head: u(at::INTERP_THREADS_HEAD),
        tstate_next: u(at::TSTATE_NEXT),
        tstate_frame: u(at::TSTATE_CURRENT_FRAME),
        cframe_current_frame: super::offsets::NONE,
        tstate_thread_id: u(at::TSTATE_THREAD_ID),
        tstate_native_thread_id: u(at::TSTATE_NATIVE_THREAD_ID),
        frame_previous: u(at::FRAME_PREVIOUS),
        frame_code: u(at::FRAME_EXECUTABLE),
        frame_instr: u(at::FRAME_INSTR_PTR),
        frame_owner: u(at::FRAME_OWNER),
        code_filename: u(at::CODE_FILENAME),
        code_name: u(at::CODE_NAME),
        code_qualname: u(at::CODE_QUALNAME),
        code_firstlineno: u(at::CODE_FIRSTLINENO),
        code_linetable: u(at::CODE_LINETABLE),
        code_adaptive: u(at::CODE_ADAPTIVE),
        object_type: u(at::OBJECT_TYPE),
        type_name: u(at::TYPE_NAME),
        bytes_size: u(at::BYTES_SIZE),
        bytes_data: u(at::BYTES_DATA),
        unicode_state: u(at::UNICODE_STATE),
        unicode_length: u(at::UNICODE_LENGTH),
        unicode_ascii_size: ascii,
        // `PyCompactUnicodeObject` adds `utf8_length` and `utf8` to it.
        unicode_compact_size: ascii + 16,
    };
    // A corrupt description must not send the walker anywhere: every
    // offset lies well inside its struct.
    let fields = [
        o.runtime_interpreters_head,
        o.interp_threads_head,
        o.tstate_next,
        o.tstate_frame,
        o.frame_previous,
        o.frame_code,
        o.frame_instr,
        o.code_filename,
        o.code_linetable,
        o.code_adaptive,
    ];
    if let Some(f) = fields.iter().find(|&&f| f > 1 << 16) {
        return Err(bad(format!("an offset of {f} bytes: not a 3.13 layout")));
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3.13.0's description as its interpreter holds it (pyenv's build;
    /// the values are those gdb reads from its DWARF).
    fn sample() -> Vec<u8> {
        let mut raw = vec![0u8; SIZE];
        raw[..8].copy_from_slice(COOKIE);
        let mut put = |i: usize, v: u64| raw[i..i + 8].copy_from_slice(&v.to_le_bytes());
        put(at::VERSION, 0x030d_00f0);
        put(at::RUNTIME_INTERPRETERS_HEAD, 632);
        put(at::INTERP_THREADS_HEAD, 7344);
        put(at::TSTATE_NEXT, 8);
        put(at::TSTATE_CURRENT_FRAME, 72);
        put(at::TSTATE_NATIVE_THREAD_ID, 160);
        put(at::FRAME_PREVIOUS, 8);
        put(at::FRAME_INSTR_PTR, 56);
        put(at::FRAME_OWNER, 70);
        put(at::CODE_ADAPTIVE, 200);
        put(at::UNICODE_ASCII_SIZE, 40);
        raw
    }

    #[test]
    fn reads_313s_description() {
        let o = parse(&sample()).unwrap();
        assert_eq!(o.version, 0x030d);
        assert_eq!(o.layout(), Layout::Py313);
        assert_eq!(o.runtime_interpreters_head, 632);
        assert_eq!(o.interp_threads_head, 7344);
        assert_eq!(o.tstate_frame, 72);
        assert_eq!(o.code_adaptive, 200);
        assert_eq!(o.unicode_compact_size, 56);
    }

    #[test]
    fn refuses_what_it_cannot_trust() {
        let mut raw = sample();
        raw[0] = b'X';
        let e = parse(&raw).unwrap_err().to_string();
        assert!(e.contains("cookie"), "{e}");

        let mut raw = sample();
        raw[at::VERSION..at::VERSION + 8].copy_from_slice(&0x030e_00f0u64.to_le_bytes());
        let e = parse(&raw).unwrap_err().to_string();
        assert!(e.contains("3.14"), "{e}");

        let mut raw = sample();
        raw[at::FREE_THREADED] = 1;
        assert!(
            parse(&raw)
                .unwrap_err()
                .to_string()
                .contains("free-threaded")
        );

        let mut raw = sample();
        raw[at::FRAME_PREVIOUS + 4] = 1;
        assert!(parse(&raw).unwrap_err().to_string().contains("offset"));

        assert!(parse(&raw[..100]).is_err());
    }
}
