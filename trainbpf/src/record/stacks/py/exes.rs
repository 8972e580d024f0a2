//! Interpreters filed by the file a process exec'd (`PY_EXES`): once the
//! collector has located a CPython in a process's own executable, the
//! kernel describes the next exec of that file itself, at the exec
//! (`python::at_exec` in the eBPF crate), so that the new process's
//! first stack is walked rather than taken "before the interpreter was
//! located". Spawned workers, torchrun's ranks and `subprocess` children
//! exec the interpreter their parent runs.
//!
//! The file is named as the kernel names it (`EXE_OF`, written at each
//! exec), never as the maps or a path say: an overlay's file has two
//! names, and only the kernel's is the one it meets at the next exec.

use std::collections::HashSet;

use aya::maps::{HashMap as BpfHashMap, MapData};
use trainbpf_common::{ExeOf, FileKey, ProcId, PyProc};

use super::frames::describe_offsets;
use crate::record::{
    samplers::procfs::guard::STATS,
    stacks::python::{Desc, find::is_libpython},
};

/// The kernel's two maps.
pub struct Exes {
    pub exes: BpfHashMap<MapData, FileKey, PyProc>,
    pub exe_of: BpfHashMap<MapData, ProcId, ExeOf>,
    /// Files already filed: each once.
    filed: HashSet<FileKey>,
    full: bool,
}

impl Exes {
    pub fn new(
        exes: BpfHashMap<MapData, FileKey, PyProc>,
        exe_of: BpfHashMap<MapData, ProcId, ExeOf>,
    ) -> Exes {
        Exes {
            exes,
            exe_of,
            filed: HashSet::new(),
            full: false,
        }
    }

    /// The exec the kernel last saw of `p`.
    pub fn exe_of(&self, p: ProcId) -> Option<ExeOf> {
        self.exe_of.get(&p, 0).ok()
    }

    /// Files the interpreter `desc`, located in `p` between two looks at
    /// its exec (`before`, and now): only where no exec came between them,
    /// so that the file filed under is the one it was located in. An
    /// interpreter in the executable is filed with `_PyRuntime` relative
    /// to the code's load address; a `libpython` with its way back from
    /// the executable (`find::LibLink`), where it has one.
    pub fn file(&mut self, p: ProcId, before: Option<ExeOf>, desc: &Desc) {
        let Some(seen) = before else {
            return;
        };
        let lib = is_libpython(&desc.path);
        if (lib && desc.link.is_none())
            || self.exe_of(p) != Some(seen)
            || self.filed.contains(&seen.exe)
        {
            return;
        }
        let d = filed(desc, seen.start_code);
        match self.exes.insert(seen.exe, d, 0) {
            Ok(()) => {
                self.filed.insert(seen.exe);
            }
            Err(e) => {
                if !std::mem::replace(&mut self.full, true) {
                    STATS.note(|| {
                        format!(
                            "interpreters filed for their next exec: {e}; later ones are located \
                             after their exec"
                        )
                    });
                }
            }
        }
    }
}

/// A located interpreter as filed: `_PyRuntime` relative to the code's
/// load address, which the kernel adds back at each exec; for a
/// libpython, what finds it through the loader's list.
fn filed(desc: &Desc, start_code: u64) -> PyProc {
    let mut d = describe_offsets(&desc.offsets, desc.runtime);
    d.at_exec = 1;
    match desc.link.filter(|_| is_libpython(&desc.path)) {
        Some(l) => {
            d.runtime = 0;
            d.lib_dynamic = l.dynamic;
            d.lib_runtime = l.runtime;
            d.debug_slot = l.debug_slot;
        }
        None => d.runtime = desc.runtime.wrapping_sub(start_code),
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::stacks::python::find::LibLink;

    fn desc(path: &str, link: Option<LibLink>) -> Desc {
        Desc {
            path: path.into(),
            version: (3, 11),
            bias: 0x7f00_0000_0000,
            runtime: 0x5555_5600_1000,
            offsets: crate::record::stacks::python::offsets::table(3, 11).unwrap(),
            link,
        }
    }

    #[test]
    fn a_filed_runtime_moves_with_the_load_address() {
        let f = filed(&desc("/usr/bin/python3.11", None), 0x5555_5540_0000);
        assert_eq!(f.runtime, 0xc0_1000);
        assert_eq!((f.at_exec, f.lib_dynamic), (1, 0));
        // The kernel's side: another exec, loaded elsewhere.
        assert_eq!(f.runtime.wrapping_add(0x5600_0000_0000), 0x5600_00c0_1000);
    }

    #[test]
    fn a_libpython_is_filed_with_its_link() {
        let link = LibLink {
            dynamic: 0x4a_0000,
            debug_slot: 0x2_0e18,
            runtime: 0x55_1000,
        };
        let f = filed(&desc("/x/lib/libpython3.11.so.1.0", Some(link)), 0x40_1000);
        assert_eq!(
            (f.runtime, f.lib_dynamic, f.lib_runtime, f.debug_slot),
            (0, 0x4a_0000, 0x55_1000, 0x2_0e18)
        );
    }
}
