//! The few CPython objects a stack needs, read from another process:
//! `str` (compact forms only: every identifier and file name is one),
//! `bytes`, and a type's name.

use super::{PyError, mem::Mem, offsets::PyOffsets};

/// Longest name or file name read; CPython's are far shorter.
const MAX_STR: u64 = 4096;
/// Largest line table read: 1 MiB holds a 100,000-line function's.
const MAX_TABLE: u64 = 1 << 20;

/// A `str` object's text.
pub fn string(mem: &Mem, o: &PyOffsets, addr: u64, what: &'static str) -> Result<String, PyError> {
    let bad = |reason: String| PyError::BadObject { what, addr, reason };
    let state = mem.u32(addr.wrapping_add(o.unicode_state), what)?;
    let len = mem.u64(addr.wrapping_add(o.unicode_length), what)?;
    // `interned:2, kind:3, compact:1, ascii:1` from the lowest bit, the
    // same in every version read here.
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    if !compact {
        return Err(bad("not a compact str".into()));
    }
    if len > MAX_STR {
        return Err(bad(format!("{len} characters long")));
    }
    if ascii {
        let raw = mem.bytes(addr.wrapping_add(o.unicode_ascii_size), len as usize, what)?;
        if !raw.is_ascii() {
            return Err(bad("an ASCII str holding other bytes".into()));
        }
        return Ok(String::from_utf8_lossy(&raw).into_owned());
    }
    let width = match kind {
        1 | 2 | 4 => kind as usize,
        _ => return Err(bad(format!("character kind {kind}"))),
    };
    let raw = mem.bytes(
        addr.wrapping_add(o.unicode_compact_size),
        len as usize * width,
        what,
    )?;
    let chars = raw.chunks_exact(width).map(|c| {
        let mut v = [0u8; 4];
        v[..width].copy_from_slice(c);
        char::from_u32(u32::from_le_bytes(v)).unwrap_or(char::REPLACEMENT_CHARACTER)
    });
    Ok(chars.collect())
}

/// A `bytes` object's contents.
pub fn bytes(mem: &Mem, o: &PyOffsets, addr: u64, what: &'static str) -> Result<Vec<u8>, PyError> {
    let len = mem.u64(addr.wrapping_add(o.bytes_size), what)?;
    if len > MAX_TABLE {
        return Err(PyError::BadObject {
            what,
            addr,
            reason: format!("{len} bytes long"),
        });
    }
    mem.bytes(addr.wrapping_add(o.bytes_data), len as usize, what)
}

/// The address of an object's type.
pub fn type_of(mem: &Mem, o: &PyOffsets, addr: u64, what: &'static str) -> Result<u64, PyError> {
    mem.u64(addr.wrapping_add(o.object_type), what)
}

pub fn type_name(mem: &Mem, o: &PyOffsets, ty: u64) -> Result<String, PyError> {
    let name = mem.u64(ty.wrapping_add(o.type_name), "a type's tp_name")?;
    mem.c_string(name, 128, "a type's name")
}
