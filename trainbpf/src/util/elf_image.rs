//! An ELF file the job made, read within fixed bounds.
//!
//! The file is the job's to make, and a section header says how big its
//! table is: a sparse file of a few KiB can claim a section of gigabytes,
//! which a reader that trusts the header allocates and fills. So the ELF
//! header and the header tables are read first ([`Image::headers`]), then
//! only the sections a caller picks, each checked to lie inside the file
//! and all together under the caller's bound ([`Image::load_sections`]),
//! into memory; the parser reads nothing else. A file over the bound is
//! refused before any of its sections is read: what one costs the
//! recorder is fixed. Read through a descriptor, never mapped: a job that
//! truncates its file can make a mapping's reader fault, not a `read`.

use std::{fs::File, ops::Range, os::unix::fs::FileExt as _};

use object::{
    Endianness, ReadRef, elf,
    read::elf::{FileHeader as _, SectionHeader as _},
};

/// Each header table (65,535 section headers of 64 bytes are 4 MiB).
const MAX_HEADER_TABLE_BYTES: u64 = 4 << 20;

pub type Header = elf::FileHeader64<Endianness>;
pub type SectionHeader = elf::SectionHeader64<Endianness>;
pub type ProgramHeader = elf::ProgramHeader64<Endianness>;

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// The tables are over the bound or outside the file: not read.
    #[error("{0}")]
    TooBig(String),
    /// Not a 64-bit ELF file this reads, or a read failed.
    #[error("{0}")]
    Bad(String),
}

/// A file's header tables, read.
pub struct Headers {
    pub image: Image,
    pub endian: Endianness,
    pub sections: Vec<SectionHeader>,
    pub segments: Vec<ProgramHeader>,
    /// The section names' table's index.
    pub shstrndx: Option<u32>,
}

/// The parts of a file read so far, and its length: a reader for the
/// parser that fails on everything else.
pub struct Image {
    len: u64,
    parts: Vec<(u64, Vec<u8>)>,
}

pub fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    }
}

impl Image {
    /// The ELF header and both header tables.
    pub fn headers(f: &File) -> Result<Headers, ElfError> {
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
        let segments: Vec<ProgramHeader> = head.program_headers(e, &img).map_err(bad)?.to_vec();
        let shstrndx = head.shstrndx(e, &img).ok();
        Ok(Headers {
            image: img,
            endian: e,
            sections,
            segments,
            shstrndx,
        })
    }

    /// Reads the sections at `idx`, all together no more than `max`
    /// bytes (`what` names them in the refusal).
    pub fn load_sections(
        &mut self,
        f: &File,
        h: (&[SectionHeader], Endianness),
        idx: &[usize],
        max: u64,
        what: &str,
    ) -> Result<(), ElfError> {
        let (sections, e) = h;
        let claimed = idx.iter().fold(0u64, |sum, &i| {
            sum.saturating_add(sections.get(i).map_or(0, |s| s.sh_size(e)))
        });
        if claimed > max {
            return Err(ElfError::TooBig(format!(
                "{what} claim {}, over the {} the recorder reads from one file",
                mib(claimed),
                mib(max)
            )));
        }
        for &i in idx {
            if let Some((at, size)) = sections.get(i).and_then(|s| s.file_range(e)) {
                self.load(f, at, size, "section")?;
            }
        }
        Ok(())
    }

    /// A section's name, from the names' table (loaded first).
    pub fn section_name<'a>(&'a self, h: &Headers, s: &SectionHeader) -> Option<&'a [u8]> {
        let names = h.sections.get(h.shstrndx? as usize)?;
        let (at, size) = names.file_range(h.endian)?;
        let table = object::read::StringTable::new(self, at, at.checked_add(size)?);
        s.name(h.endian, table).ok()
    }

    /// Bytes of the file, where read.
    pub fn bytes(&self, at: u64, size: u64) -> Option<&[u8]> {
        self.read_bytes_at(at, size).ok()
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

#[cfg(test)]
mod tests {
    use super::*;

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
