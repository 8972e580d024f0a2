//! A code object's line for an instruction, from its line table: the
//! three formats CPython has used since 3.9, decoded as CPython's own
//! `PyCode_Addr2Line` does (Objects/codeobject.c of each version;
//! Objects/lnotab_notes.txt describes them).
//!
//! `addr` is a byte offset into the code's instructions (CPython's
//! `addrq`). `None` is an instruction CPython gives no line.

use super::offsets::Layout;

/// The line of the instruction at byte offset `addr`.
pub fn line_at(layout: Layout, table: &[u8], first_line: i32, addr: u64) -> Option<i32> {
    match layout {
        Layout::Py39 => lnotab(table, first_line, addr),
        Layout::Py310 => linetable_310(table, first_line, addr),
        Layout::Py311 | Layout::Py313 => locations(table, first_line, addr),
    }
}

/// 3.9's `co_lnotab`: (byte increment, signed line increment) pairs; a
/// line's increment applies from the address its pair reaches.
fn lnotab(table: &[u8], first_line: i32, addr: u64) -> Option<i32> {
    let (mut line, mut at) = (first_line, 0u64);
    for pair in table.chunks_exact(2) {
        at += u64::from(pair[0]);
        if at > addr {
            break;
        }
        line += i32::from(pair[1] as i8);
    }
    Some(line)
}

/// 3.10's `co_linetable`: (byte length, signed line delta) pairs, each
/// one range; a delta of -128 is a range without a line.
fn linetable_310(table: &[u8], first_line: i32, addr: u64) -> Option<i32> {
    let (mut line, mut end) = (first_line, 0u64);
    for pair in table.chunks_exact(2) {
        let start = end;
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        let this = if delta == -128 {
            None
        } else {
            line += i32::from(delta);
            Some(line)
        };
        if (start..end).contains(&addr) {
            return this;
        }
    }
    None
}

/// 3.11's location table: entries whose first byte has bit 7 set, a
/// 4-bit code and a length of 1 to 8 code units; the code says how the
/// line moves and how many bytes of columns follow.
fn locations(table: &[u8], first_line: i32, addr: u64) -> Option<i32> {
    let mut r = Reader { b: table, i: 0 };
    let (mut line, mut end) = (first_line, 0u64);
    while let Some(head) = r.byte() {
        if head & 0x80 == 0 {
            return None; // out of step: not a location table
        }
        let code = (head >> 3) & 0xf;
        let start = end;
        end += 2 * (u64::from(head & 7) + 1);
        let this = match code {
            15 => None,
            14 => {
                line += r.svarint()?;
                r.varint()?; // end line
                r.varint()?; // column
                r.varint()?; // end column
                Some(line)
            }
            13 => {
                line += r.svarint()?;
                Some(line)
            }
            10..=12 => {
                line += i32::from(code) - 10;
                r.byte()?;
                r.byte()?;
                Some(line)
            }
            _ => {
                r.byte()?;
                Some(line)
            }
        };
        if (start..end).contains(&addr) {
            return this;
        }
    }
    None
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let v = *self.b.get(self.i)?;
        self.i += 1;
        Some(v)
    }

    /// Six bits a byte, least significant first; bit 6 says more follow.
    fn varint(&mut self) -> Option<u32> {
        let mut b = self.byte()?;
        let mut v = u32::from(b & 63);
        let mut shift = 0;
        while b & 64 != 0 {
            b = self.byte()?;
            shift += 6;
            if shift > 30 {
                return None;
            }
            v |= u32::from(b & 63) << shift;
        }
        Some(v)
    }

    /// The sign in the lowest bit.
    fn svarint(&mut self) -> Option<i32> {
        let u = self.varint()?;
        let mag = (u >> 1) as i32;
        Some(if u & 1 != 0 { -mag } else { mag })
    }
}

#[cfg(test)]
mod tests {
    use super::{super::testdata::FIXTURES, *};

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn every_instruction_gets_cpythons_line() {
        for f in FIXTURES {
            let layout = match f.minor {
                9 => Layout::Py39,
                10 => Layout::Py310,
                11 | 12 => Layout::Py311,
                _ => Layout::Py313,
            };
            let table = unhex(f.table);
            let mut checked = 0;
            for pair in f.lines.split(' ') {
                let (addr, want) = pair.split_once(':').unwrap();
                let want = (want != "-").then(|| want.parse::<i32>().unwrap());
                let addr: u64 = addr.parse().unwrap();
                let got = line_at(layout, &table, f.first_line, addr);
                assert_eq!(got, want, "3.{} at byte {addr}", f.minor);
                checked += 1;
            }
            assert!(checked > 20, "3.{}: {checked}", f.minor);
            // The 150-line gap is crossed: the return's line is reached.
            assert!(f.lines.contains(":158"), "3.{}", f.minor);
        }
    }

    #[test]
    fn a_damaged_table_gives_no_line_rather_than_a_wrong_one() {
        assert_eq!(locations(&[0x00, 0x01], 5, 0), None);
        // A long-form entry cut short.
        assert_eq!(locations(&[0xf0, 0x40], 5, 0), None);
        assert_eq!(linetable_310(&[2, 0x80], 5, 0), None);
        assert_eq!(linetable_310(&[2, 1], 5, 4), None, "past the end");
    }
}
