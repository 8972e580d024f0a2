//! The user's own line in a stack: the innermost frame outside the
//! interpreter, the standard library, installed packages and the system's
//! libraries. What a report leads with, what a diagnosis cites, and what
//! stacks that differ only below it (numpy's `memset` and `sysmalloc`
//! leaves under one `featurize` line) are merged by. The full stacks stay
//! in `report --stacks`, `--explain`, JSON and pprof.

use super::GrowthStack;
use super::stacks::Frame;

/// Allocator and copy routines: where memory is touched, never why.
const PLUMBING: [&str; 9] = [
    "malloc",
    "calloc",
    "realloc",
    "memset",
    "memcpy",
    "memmove",
    "mmap",
    "sysmalloc",
    "_int_",
];

/// Whether a Python file is the standard library's or an installed
/// package's: a frozen module, or under `lib/python3.X/` (which holds
/// `site-packages` and `dist-packages` too).
fn library_py(file: &str) -> bool {
    file.starts_with("<frozen")
        || file.contains("/site-packages/")
        || file.contains("/dist-packages/")
        || file.split('/').any(|part| {
            part.strip_prefix("python3.")
                .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// Whether a native frame lies in the system's or an installed package's
/// code, or the interpreter's, or is an allocator routine.
fn library_native(f: &Frame) -> bool {
    let module = f.module.as_deref().unwrap_or("");
    let base = module.rsplit('/').next().unwrap_or("");
    let func = f.function.as_deref().unwrap_or("");
    (module.starts_with("/usr/") && !module.starts_with("/usr/local/"))
        || module.starts_with("/lib")
        || module.contains("/site-packages/")
        || module.contains("/dist-packages/")
        || base.starts_with("python")
        || base.starts_with("libpython")
        || base.starts_with("ld-linux")
        || func.starts_with("Py")
        || func.starts_with("_Py")
        || PLUMBING.iter().any(|p| func.contains(p))
}

/// Whether `f` is the user's own code.
pub(crate) fn own(f: &Frame) -> bool {
    if f.function.is_none() {
        return false;
    }
    match f.kind.as_str() {
        "python" => !f.file.as_deref().is_none_or(library_py),
        _ => !library_native(f),
    }
}

/// The index of the frame a stack leads with: the innermost of the user's
/// own code; else the innermost Python frame, else the innermost named
/// frame outside the allocator; `None` where nothing is named.
pub(crate) fn lead(frames: &[Frame]) -> Option<usize> {
    frames
        .iter()
        .position(own)
        .or_else(|| {
            frames
                .iter()
                .position(|f| f.kind == "python" && f.function.is_some())
        })
        .or_else(|| {
            frames.iter().position(|f| {
                f.function.is_some()
                    && !PLUMBING
                        .iter()
                        .any(|p| f.function.as_deref().unwrap_or("").contains(p))
            })
        })
        .or_else(|| frames.iter().position(|f| f.function.is_some()))
}

/// A frame as a diagnosis cites it: `function (file:line)`, the file by its
/// name alone (the full path is in the stacks), or `function (module)`.
pub(crate) fn cite(f: &Frame) -> String {
    let func = f.function.as_deref().unwrap_or("?");
    let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    match (&f.file, f.line, &f.module) {
        (Some(file), Some(line), _) => format!("{func} ({}:{line})", base(file)),
        (Some(file), None, _) => format!("{func} ({})", base(file)),
        (None, _, Some(m)) => format!("{func} ({})", base(m)),
        _ => func.to_string(),
    }
}

/// A stack led by the user's line: the stacks that differ only below it
/// merged, with their bytes and captures summed.
#[derive(Clone, Debug)]
pub(crate) struct Led {
    pub(crate) bytes: u64,
    pub(crate) count: u64,
    /// The heaviest merged stack's frames, whole.
    pub(crate) frames: Vec<Frame>,
    /// The frame it leads with, in `frames`; `None`: nothing named.
    pub(crate) lead: Option<usize>,
    /// How many recorded stacks it merges.
    pub(crate) merged: usize,
    pub(crate) error: Option<String>,
}

impl Led {
    /// The frames from the lead outward (all where there is none).
    pub(crate) fn outward(&self) -> &[Frame] {
        &self.frames[self.lead.unwrap_or(0).min(self.frames.len())..]
    }

    /// The frames below the lead, innermost first.
    pub(crate) fn below_lead(&self) -> &[Frame] {
        &self.frames[..self.lead.unwrap_or(0).min(self.frames.len())]
    }
}

/// What two frames share when they are the same line of the same code.
fn same(a: &Frame, b: &Frame) -> bool {
    a.kind == b.kind
        && a.function == b.function
        && a.file == b.file
        && a.line == b.line
        && a.module == b.module
}

/// `stacks` (heaviest first) led by their user's line, those that differ
/// only below it merged; heaviest first. A stack with nothing named is
/// never merged with another.
pub(crate) fn by_lead(stacks: &[GrowthStack]) -> Vec<Led> {
    let mut out: Vec<Led> = Vec::new();
    for s in stacks {
        let lead = lead(&s.frames);
        let mine = Led {
            bytes: s.bytes,
            count: s.count,
            frames: s.frames.clone(),
            lead,
            merged: 1,
            error: s.error.clone(),
        };
        let found = lead.and_then(|_| {
            out.iter_mut().find(|o| {
                o.lead.is_some() && {
                    let (a, b) = (o.outward(), mine.outward());
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
                }
            })
        });
        match found {
            Some(o) => {
                o.bytes += mine.bytes;
                o.count += mine.count;
                o.merged += 1;
                if mine.bytes > o.bytes - mine.bytes {
                    // The heavier member's frames and note stand for all.
                    o.frames = mine.frames;
                    o.lead = mine.lead;
                    o.error = mine.error;
                }
            }
            None => out.push(mine),
        }
    }
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(func: &str, file: &str, line: u32) -> Frame {
        Frame {
            kind: "python".into(),
            function: Some(func.into()),
            file: Some(file.into()),
            line: Some(line),
            ..Default::default()
        }
    }

    fn native(func: &str, module: &str) -> Frame {
        Frame {
            kind: "native".into(),
            function: Some(func.into()),
            module: Some(module.into()),
            ..Default::default()
        }
    }

    fn stack(bytes: u64, frames: Vec<Frame>) -> GrowthStack {
        GrowthStack {
            bytes,
            count: 1,
            frames,
            error: None,
        }
    }

    #[test]
    fn libraries_are_told_from_the_users_code() {
        for lib in [
            "/usr/lib/python3.11/copy.py",
            "/opt/venv/lib/python3.13/site-packages/torch/utils/data/_utils/fetch.py",
            "/usr/lib/python3/dist-packages/numpy/core/numeric.py",
            "<frozen importlib._bootstrap>",
        ] {
            assert!(library_py(lib), "{lib}");
        }
        for own in ["/home/ada/train/dataset.py", "leak.py", "/srv/python3/x.py"] {
            assert!(!library_py(own), "{own}");
        }
        assert!(library_native(&native("__memset_avx2", "/home/a/grow")));
        assert!(library_native(&native(
            "at::empty",
            "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"
        )));
        assert!(library_native(&native(
            "f",
            "/usr/lib/x86_64-linux-gnu/libc.so.6"
        )));
        assert!(!library_native(&native("grow_here", "/home/a/grow")));
    }

    /// A DataLoader worker's stack: the allocation inside the interpreter
    /// and torch's fetch loop, under the dataset's `__getitem__`.
    #[test]
    fn the_lead_is_the_innermost_own_frame() {
        let frames = vec![
            native("memcpy", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
            native("_PyList_Extend", "/usr/bin/python3.11"),
            py("__getitem__", "/home/ada/dataset.py", 17),
            py(
                "fetch",
                "/venv/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py",
                52,
            ),
            py("main", "/home/ada/train.py", 40),
        ];
        assert_eq!(lead(&frames), Some(2));
        assert_eq!(cite(&frames[2]), "__getitem__ (dataset.py:17)");
        // Nothing of the user's: the innermost Python frame.
        let lib = vec![
            native("malloc", "/usr/lib/libc.so.6"),
            py("deepcopy", "/usr/lib/python3.11/copy.py", 128),
        ];
        assert_eq!(lead(&lib), Some(1));
        let none: Vec<Frame> = vec![Frame::default()];
        assert_eq!(lead(&none), None);
    }

    /// numpy's `memset` and `sysmalloc` leaves under one `featurize` line
    /// are one stack; another line stays apart; the heavier's frames lead.
    #[test]
    fn stacks_that_differ_below_the_lead_merge() {
        let featurize = py("featurize", "/home/ada/feat.py", 9);
        let main = py("<module>", "/home/ada/feat.py", 30);
        let np = |leaf: &str| {
            native(
                leaf,
                "/venv/lib/python3.11/site-packages/numpy/core/_multiarray_umath.so",
            )
        };
        let stacks = vec![
            stack(300, vec![np("memset"), featurize.clone(), main.clone()]),
            stack(200, vec![np("sysmalloc"), featurize.clone(), main.clone()]),
            stack(
                250,
                vec![np("memset"), py("load", "/home/ada/feat.py", 3), main],
            ),
        ];
        let led = by_lead(&stacks);
        assert_eq!(led.len(), 2);
        assert_eq!((led[0].bytes, led[0].merged), (500, 2));
        assert_eq!(led[0].outward()[0].function.as_deref(), Some("featurize"));
        assert_eq!(led[0].below_lead()[0].function.as_deref(), Some("memset"));
        assert_eq!((led[1].bytes, led[1].merged), (250, 1));
    }
}
