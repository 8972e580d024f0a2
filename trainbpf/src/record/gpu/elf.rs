//! A driver library's symbol offsets, read within fixed bounds.
//!
//!
//! The file is the job's to make, and a section header says how big its
//! table is: a sparse file of a few KiB can claim a `.dynsym` of
//! gigabytes, which a reader that trusts the header allocates and fills.
//! So the ELF header and the header tables are read first, then only what
//! the symbol look-up needs (the first `.dynsym` and `.symtab`, their
//! string tables and extended-index tables, the section names), each
//! checked to lie inside the file and all together under
//! [`MAX_TABLE_BYTES`], into memory ([`Image`]); the parser reads nothing
//! else. A file over the bound is refused before any of its tables is
//! read: what one costs the recorder is fixed.
//!
//! The bound: the CUDA driver exports a few thousand symbols, and a
//! stripped library has no `.symtab`, so its tables are well under a few
//! MiB. 64 MiB leaves room for an unstripped build's full `.symtab` (the
//! biggest shared libraries' run to tens of MiB) and keeps one file's cost
//! a small part of what a recorder in a container is given.

use std::{fs::File, ops::Range, os::unix::fs::FileExt as _};

use object::{
    Endianness, ReadRef, elf,
    read::elf::{FileHeader as _, SectionHeader as _},
};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

/// What is read of one library's tables, at most.
pub(super) const MAX_TABLE_BYTES: u64 = 64 << 20;
/// Each header table (65,535 section headers of 64 bytes are 4 MiB).
const MAX_HEADER_TABLE_BYTES: u64 = 4 << 20;

type Header = elf::FileHeader64<Endianness>;
type SectionHeader = elf::SectionHeader64<Endianness>;

#[derive(Debug, thiserror::Error)]
pub(super) enum ElfError {
    /// The tables are over the bound or outside the file: not read.
    #[error("{0}")]
    TooBig(String),
    /// Not a 64-bit ELF file this reads, or a read failed.
    #[error("{0}")]
    Bad(String),
}

/// The file offset of each of `symbols` that `f` exports (`None` for one
/// it does not).
pub(super) fn symbol_offsets(f: &File, symbols: &[&str]) -> Result<Vec<Option<u64>>, ElfError> {
    let image = Image::read(f)?;
    elf_offsets(&image, symbols).map_err(ElfError::Bad)
}

/// The parts of a file the look-up needs, read, and its length: a reader
/// for the parser that fails on everything else.
struct Image {
    len: u64,
    parts: Vec<(u64, Vec<u8>)>,
}

fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    }
}

impl Image {
    fn read(f: &File) -> Result<Image, ElfError> {
        let len = f
            .metadata()
            .map_err(|e| ElfError::Bad(e.to_string()))?
            .len();
        let mut img = Image {
            len,
            parts: Vec::new(),
        };
        let head_len = size_of::<Header>() as u64;
        if len < head_len {
            return Err(ElfError::Bad("not an ELF library: too short".into()));
        }
        img.load(f, 0, head_len, "ELF header")?;
        let head: Header = *(&img)
            .read_at::<Header>(0)
            .map_err(|()| ElfError::Bad("not an ELF library".into()))?;
        if !head.is_supported() || !head.is_class_64() {
            return Err(ElfError::Bad("not a 64-bit ELF library".into()));
        }
        let e = head
            .endian()
            .map_err(|e| ElfError::Bad(format!("not an ELF library: {e}")))?;
        let (shoff, phoff) = (head.e_shoff(e), head.e_phoff(e));
        let shentsize = head.e_shentsize(e);
        if shoff != 0 && usize::from(shentsize) == size_of::<SectionHeader>() {
            // Section 0 holds the counts that overflow the header's fields.
            img.load(f, shoff, u64::from(shentsize), "first section header")?;
        }
        let bad = |e: object::read::Error| ElfError::Bad(format!("not an ELF library: {e}"));
        let shnum = head.shnum(e, &img).map_err(bad)? as u64;
        let phnum = head.phnum(e, &img).map_err(bad)? as u64;
        for (at, n, size, what) in [
            (shoff, shnum, u64::from(shentsize), "section header table"),
            (
                phoff,
                phnum,
                u64::from(head.e_phentsize(e)),
                "program header table",
            ),
        ] {
            let bytes = n.saturating_mul(size);
            if at == 0 || bytes == 0 {
                continue;
            }
            if bytes > MAX_HEADER_TABLE_BYTES {
                return Err(ElfError::TooBig(format!(
                    "its {what} claims {}, over the {} the recorder reads",
                    mib(bytes),
                    mib(MAX_HEADER_TABLE_BYTES)
                )));
            }
            img.load(f, at, bytes, what)?;
        }
        let sections: Vec<SectionHeader> = head.section_headers(e, &img).map_err(bad)?.to_vec();
        let needed = tables_needed(&sections, e, head.shstrndx(e, &img).ok());
        let claimed = needed
            .iter()
            .fold(0u64, |sum, &i| sum.saturating_add(sections[i].sh_size(e)));
        if claimed > MAX_TABLE_BYTES {
            return Err(ElfError::TooBig(format!(
                "its symbol tables and their strings claim {}, over the {} the recorder reads from one library",
                mib(claimed),
                mib(MAX_TABLE_BYTES)
            )));
        }
        for i in needed {
            if let Some((at, size)) = sections[i].file_range(e) {
                img.load(f, at, size, "symbol table")?;
            }
        }
        Ok(img)
    }

    /// Reads `size` bytes at `at`, which must lie inside the file.
    fn load(&mut self, f: &File, at: u64, size: u64, what: &str) -> Result<(), ElfError> {
        if size == 0 {
            return Ok(());
        }
        if at.checked_add(size).is_none_or(|end| end > self.len) {
            return Err(ElfError::TooBig(format!(
                "its {what} ({} at offset {at}) lies outside the file ({} bytes)",
                mib(size),
                self.len
            )));
        }
        let mut buf = vec![0; size as usize];
        f.read_exact_at(&mut buf, at)
            .map_err(|e| ElfError::Bad(format!("reading its {what}: {e}")))?;
        self.parts.push((at, buf));
        Ok(())
    }

    /// The part that holds `range` whole.
    fn part(&self, range: &Range<u64>) -> Option<(u64, &[u8])> {
        self.parts.iter().find_map(|(at, buf)| {
            let end = at + buf.len() as u64;
            (range.start >= *at && range.end <= end && range.start <= range.end)
                .then_some((*at, buf.as_slice()))
        })
    }
}

/// The sections the parser reads for the symbol look-up: the first symbol
/// table of each kind (as the parser picks them), their string tables,
/// their extended-index tables, and the section names.
fn tables_needed(sections: &[SectionHeader], e: Endianness, shstrndx: Option<u32>) -> Vec<usize> {
    let mut needed = Vec::new();
    let mut add = |i: usize| {
        if i != 0 && i < sections.len() && !needed.contains(&i) {
            needed.push(i);
        }
    };
    for kind in [elf::SHT_SYMTAB, elf::SHT_DYNSYM] {
        let Some(sym) = sections.iter().position(|s| s.sh_type(e) == kind) else {
            continue;
        };
        add(sym);
        add(sections[sym].sh_link(e) as usize);
        for (i, s) in sections.iter().enumerate() {
            if s.sh_type(e) == elf::SHT_SYMTAB_SHNDX && s.sh_link(e) as usize == sym {
                add(i);
            }
        }
    }
    if let Some(i) = shstrndx {
        add(i as usize);
    }
    needed
}

impl<'a> ReadRef<'a> for &'a Image {
    fn len(self) -> Result<u64, ()> {
        Ok(self.len)
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size == 0 {
            return Ok(&[]);
        }
        let range = offset..offset.checked_add(size).ok_or(())?;
        let (at, buf) = self.part(&range).ok_or(())?;
        Ok(&buf[(range.start - at) as usize..(range.end - at) as usize])
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        let (at, buf) = self.part(&(range.start..range.start)).ok_or(())?;
        let end = range.end.min(at + buf.len() as u64);
        let bytes = buf
            .get((range.start - at) as usize..(end - at) as usize)
            .ok_or(())?;
        let n = bytes.iter().position(|&b| b == delimiter).ok_or(())?;
        Ok(&bytes[..n])
    }
}

/// Symbols' file offsets in an ELF image, as aya computes them: the
/// dynamic symbols first, then the others; defined ones only. One pass
/// over the tables, whatever their length.
pub(super) fn elf_offsets<'a, R: ReadRef<'a>>(
    data: R,
    symbols: &[&str],
) -> Result<Vec<Option<u64>>, String> {
    let obj = object::File::parse(data).map_err(|e| format!("not an ELF library: {e}"))?;
    let translate = matches!(
        obj.kind(),
        object::ObjectKind::Dynamic | object::ObjectKind::Executable
    );
    // The first definition of each name decides, as a search would.
    let mut found: Vec<Option<Option<u64>>> = vec![None; symbols.len()];
    for sym in obj.dynamic_symbols().chain(obj.symbols()) {
        if !sym.is_definition() {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        let Some(i) = symbols.iter().position(|s| *s == name) else {
            continue;
        };
        if found[i].is_some() {
            continue;
        }
        found[i] = Some(if translate {
            file_offset(&obj, &sym)
        } else {
            Some(sym.address())
        });
    }
    Ok(found.into_iter().map(Option::flatten).collect())
}

/// A symbol's address as an offset in its file, through its section.
fn file_offset<'data, R: ReadRef<'data>>(
    obj: &object::File<'data, R>,
    sym: &object::Symbol<'data, '_, R>,
) -> Option<u64> {
    let section = obj.section_by_index(sym.section_index()?).ok()?;
    let (offset, _) = section.file_range()?;
    sym.address()
        .checked_sub(section.address())?
        .checked_add(offset)
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::FileExt as _, path::PathBuf};

    use super::*;

    /// A file in the temporary directory, removed on drop.
    struct Tmp(PathBuf, File);

    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// A 64-bit little-endian ELF header and section table of a file
    /// `len` bytes long (sparse): the null section, then `(type, offset,
    /// size, link)` for each.
    fn elf(name: &str, sections: &[(u32, u64, u64, u32)], len: u64) -> Tmp {
        let mut h = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
        h.resize(16, 0);
        h.extend_from_slice(&3u16.to_le_bytes());
        h.extend_from_slice(&62u16.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        h.extend_from_slice(&0u64.to_le_bytes());
        h.extend_from_slice(&0u64.to_le_bytes());
        h.extend_from_slice(&64u64.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        let n = sections.len() as u16 + 1;
        for v in [64u16, 56, 0, 64, n, 0] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        h.resize(64 + 64, 0);
        for &(ty, off, size, link) in sections {
            h.extend_from_slice(&0u32.to_le_bytes());
            h.extend_from_slice(&ty.to_le_bytes());
            h.extend_from_slice(&0u64.to_le_bytes());
            h.extend_from_slice(&0u64.to_le_bytes());
            h.extend_from_slice(&off.to_le_bytes());
            h.extend_from_slice(&size.to_le_bytes());
            h.extend_from_slice(&link.to_le_bytes());
            h.extend_from_slice(&0u32.to_le_bytes());
            h.extend_from_slice(&8u64.to_le_bytes());
            h.extend_from_slice(&24u64.to_le_bytes());
        }
        let p = std::env::temp_dir().join(format!("trainbpf-elf-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let f = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
            .unwrap();
        f.write_all_at(&h, 0).unwrap();
        f.set_len(len.max(h.len() as u64)).unwrap();
        Tmp(p, f)
    }

    #[test]
    fn a_table_that_claims_more_than_the_bound_is_refused_unread() {
        // .dynsym claims 2 GiB of a sparse file that long.
        let t = elf(
            "big",
            &[
                (elf::SHT_DYNSYM, 4096, 2 << 30, 2),
                (elf::SHT_STRTAB, 256, 16, 0),
            ],
            4096 + (2 << 30),
        );
        let e = symbol_offsets(&t.1, &["cuInit"]).unwrap_err();
        assert!(matches!(e, ElfError::TooBig(_)), "{e}");
        assert!(
            e.to_string().contains("claim 2048.0 MiB, over the 64 MiB"),
            "{e}"
        );
        // The string table alone past the bound: the same.
        let t = elf(
            "strings",
            &[
                (elf::SHT_DYNSYM, 4096, 24, 2),
                (elf::SHT_STRTAB, 8192, MAX_TABLE_BYTES, 0),
            ],
            8192 + MAX_TABLE_BYTES,
        );
        assert!(matches!(
            symbol_offsets(&t.1, &["cuInit"]),
            Err(ElfError::TooBig(_))
        ));
    }

    #[test]
    fn a_table_outside_the_file_is_refused() {
        let t = elf(
            "outside",
            &[
                (elf::SHT_DYNSYM, 4096, 4096, 2),
                (elf::SHT_STRTAB, 256, 16, 0),
            ],
            4096,
        );
        let e = symbol_offsets(&t.1, &["cuInit"]).unwrap_err();
        assert!(e.to_string().contains("lies outside the file"), "{e}");
    }

    #[test]
    fn a_section_table_past_its_bound_is_refused() {
        // e_shnum 0, and section 0's sh_size names a million sections.
        let t = elf("many", &[], 1 << 20);
        t.1.write_all_at(&1_000_000u64.to_le_bytes(), 64 + 32)
            .unwrap();
        t.1.write_all_at(&0u16.to_le_bytes(), 60).unwrap();
        let e = symbol_offsets(&t.1, &["x"]).unwrap_err();
        assert!(e.to_string().contains("section header table"), "{e}");
    }

    #[test]
    fn strings_are_read_inside_their_part_only() {
        let img = Image {
            len: 100,
            parts: vec![(10, b"ab\0cd".to_vec())],
        };
        assert_eq!((&img).read_bytes_at_until(10..100, 0), Ok(&b"ab"[..]));
        // No NUL before the part ends: an error, not a read beyond it.
        assert_eq!((&img).read_bytes_at_until(13..100, 0), Err(()));
        assert_eq!((&img).read_bytes_at(12, 3), Ok(&b"\0cd"[..]));
        assert_eq!((&img).read_bytes_at(12, 4), Err(()));
        assert_eq!((&img).read_bytes_at(0, 1), Err(()));
    }
}
