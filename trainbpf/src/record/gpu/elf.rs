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

use std::fs::File;

use object::{Endianness, ReadRef, elf, read::elf::SectionHeader as _};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

pub(super) use crate::util::elf_image::ElfError;
use crate::util::elf_image::{Image, SectionHeader};

/// What is read of one library's tables, at most.
pub(super) const MAX_TABLE_BYTES: u64 = 64 << 20;

/// The file offset of each of `symbols` that `f` exports (`None` for one
/// it does not).
pub(super) fn symbol_offsets(f: &File, symbols: &[&str]) -> Result<Vec<Option<u64>>, ElfError> {
    let mut h = Image::headers(f)?;
    let needed = tables_needed(&h.sections, h.endian, h.shstrndx);
    h.image.load_sections(
        f,
        (&h.sections, h.endian),
        &needed,
        MAX_TABLE_BYTES,
        "its symbol tables and their strings",
    )?;
    elf_offsets(&h.image, symbols).map_err(ElfError::Bad)
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
}
