//! The userspace CPython stack reader (trainbpf::python) on real
//! interpreters: every CPython on the machine runs a script blocked in
//! `outer()` -> `inner_sleep()`, and its stacks, read from outside through
//! the offsets the eBPF walker will use, must name those functions with
//! their file and lines. Interpreters it cannot read must say why.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::support::{TempDir, require_root, serial};
use trainbpf::record::stacks::python::{Interpreter, PyError, ThreadStack};

const SCRIPT: &str = r#"import sys, threading, time

class Side:
    def run(self):
        side_sleep()  # @side_run

def side_sleep():
    time.sleep(600)  # @side_sleep

def inner_sleep():
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    time.sleep(600)  # @inner_sleep

def outer():
    inner_sleep()  # @outer

def 睡眠():
    time.sleep(600)  # @wide

def schläft():
    睡眠()  # @latin

threading.Thread(target=Side().run, daemon=True).start()
threading.Thread(target=schläft, daemon=True).start()
outer()  # @module
"#;

/// The line of SCRIPT that carries `@tag`.
fn line_of(tag: &str) -> i32 {
    let marker = format!("# @{tag}");
    SCRIPT
        .lines()
        .position(|l| l.ends_with(&marker))
        .map(|i| i as i32 + 1)
        .unwrap_or_else(|| panic!("no {marker} in the script"))
}

/// Every CPython here from 3.9: the image's `python3` (Debian's, the
/// interpreter linked into the executable) and pyenv's builds (a
/// `libpython3.x.so` each).
fn pythons() -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from("/usr/bin/python3")];
    if let Ok(rd) = std::fs::read_dir("/root/.pyenv/versions") {
        let mut more: Vec<(u32, PathBuf)> = rd
            .flatten()
            .filter_map(|e| {
                let v = e.file_name().to_string_lossy().into_owned();
                let minor: u32 = v.strip_prefix("3.")?.split('.').next()?.parse().ok()?;
                let bin = e.path().join(format!("bin/python3.{minor}"));
                (minor >= 9 && bin.exists()).then_some((minor, bin))
            })
            .collect();
        more.sort();
        out.extend(more.into_iter().map(|(_, bin)| bin));
    }
    out
}

/// A started script, killed when dropped.
struct Script(Child);

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `python script`, returning once it has said "ready" and every
/// one of its threads sleeps.
fn start(python: &Path, script: &Path, envs: &[(&str, &Path)]) -> Script {
    let mut cmd = Command::new(python);
    cmd.arg(script).stdin(Stdio::null()).stdout(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = Script(cmd.spawn().expect("starting python"));
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n", "{}", python.display());
    let pid = child.0.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !all_asleep(pid) {
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn all_asleep(pid: u32) -> bool {
    let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .collect();
    tasks.len() >= 3
        && tasks.iter().all(|t| {
            std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('S')
            })
        })
}

fn show(stacks: &[ThreadStack]) -> String {
    let mut s = String::new();
    for t in stacks {
        s += &format!("  thread {:#x} tid {:?}:\n", t.thread_id, t.native_tid);
        match &t.frames {
            Ok(frames) => {
                for f in frames {
                    s += &format!("    {}:{:?} in {}\n", f.file, f.line, f.function);
                }
            }
            Err(e) => s += &format!("    unreadable: {e}\n"),
        }
    }
    s
}

/// The (function, line) of the innermost `n` frames of the thread whose
/// innermost frame is `top`.
fn frames_of(stacks: &[ThreadStack], top: &str, n: usize) -> Vec<(String, Option<i32>, String)> {
    let t = stacks
        .iter()
        .find(|t| {
            t.frames
                .as_ref()
                .is_ok_and(|f| f.first().is_some_and(|f| f.function == top))
        })
        .unwrap_or_else(|| panic!("no thread runs {top}:\n{}", show(stacks)));
    let f = t.frames.as_ref().unwrap();
    f.iter()
        .take(n)
        .map(|f| (f.function.clone(), f.line, f.file.clone()))
        .collect()
}

#[test]
fn every_cpython_here_gives_its_stacks() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("pystacks");
    let script = dir.path("blocked.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let file = script.to_string_lossy().into_owned();
    let mut passed = Vec::new();
    for python in pythons() {
        let child = start(&python, &script, &[]);
        let pid = child.0.id();
        let mut interp =
            Interpreter::find(pid).unwrap_or_else(|e| panic!("{}: {e}", python.display()));
        let (major, minor) = interp.version();
        let t = Instant::now();
        let stacks = interp.stacks().unwrap();
        let took = t.elapsed();
        eprintln!(
            "{} (CPython {major}.{minor}, {}, bias {:#x}, _PyRuntime {:#x}): {} threads in {took:?}\n{}",
            python.display(),
            interp.path(),
            interp.bias(),
            interp.runtime(),
            stacks.len(),
            show(&stacks)
        );
        assert_eq!(stacks.len(), 3, "{}", show(&stacks));
        let main = frames_of(&stacks, "inner_sleep", 3);
        let want = [
            ("inner_sleep", line_of("inner_sleep")),
            ("outer", line_of("outer")),
            ("<module>", line_of("module")),
        ];
        for (got, want) in main.iter().zip(want) {
            assert_eq!((got.0.as_str(), got.1), (want.0, Some(want.1)), "{main:?}");
            assert_eq!(got.2, file);
        }
        let side = frames_of(&stacks, "side_sleep", 2);
        // 3.11 added co_qualname: the method is named with its class.
        let run = if minor >= 11 { "Side.run" } else { "run" };
        assert_eq!(side[0].1, Some(line_of("side_sleep")), "{side:?}");
        assert_eq!(
            (side[1].0.as_str(), side[1].1),
            (run, Some(line_of("side_run")))
        );
        // Names beyond ASCII: one-byte (latin-1) and two-byte characters.
        let wide = frames_of(&stacks, "睡眠", 2);
        assert_eq!(wide[0].1, Some(line_of("wide")), "{wide:?}");
        assert_eq!(
            (wide[1].0.as_str(), wide[1].1),
            ("schläft", Some(line_of("latin")))
        );
        // Below them, threading's own frames, resolved too.
        let all = stacks.iter().flat_map(|t| t.frames.as_ref().unwrap());
        assert!(all.clone().any(|f| f.file.ends_with("threading.py")));
        if minor >= 11 {
            let tids: Vec<_> = stacks.iter().map(|t| t.native_tid.unwrap()).collect();
            assert!(
                tids.contains(&pid),
                "the main thread's tid is the pid: {tids:?}"
            );
        }
        // Resolving again hits the cache and agrees.
        let f = &stacks[0].frames.as_ref().unwrap()[0];
        assert_eq!(&interp.resolve(f.code, f.instr).unwrap(), f);
        passed.push(format!("{major}.{minor} ({})", python.display()));
    }
    eprintln!("read: {}", passed.join(", "));
    assert!(!passed.is_empty());
}

#[test]
fn an_interpreter_it_cannot_read_says_why() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("pyunread");
    let script = dir.path("blocked.py");
    std::fs::write(&script, SCRIPT).unwrap();

    // No Python at all.
    let mut sleep = Command::new("/bin/sleep").arg("600").spawn().unwrap();
    let e = Interpreter::find(sleep.id())
        .err()
        .expect("sleep is no python");
    let _ = sleep.kill();
    let _ = sleep.wait();
    eprintln!("sleep: {e}");
    assert!(matches!(e, PyError::NotPython { .. }), "{e}");

    // A 3.13 whose _Py_DebugOffsets cookie is not CPython's: an unknown
    // build, refused rather than read with guessed offsets.
    let lib = Path::new("/root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0");
    let bin = Path::new("/root/.pyenv/versions/3.13.0/bin/python3.13");
    if lib.exists() && bin.exists() {
        let bytes = std::fs::read(lib).unwrap();
        let patched = replace_all(&bytes, b"xdebugpy", b"xdebugpX");
        assert_ne!(patched, bytes);
        let libdir = dir.path("lib");
        std::fs::create_dir(&libdir).unwrap();
        std::fs::write(libdir.join("libpython3.13.so.1.0"), patched).unwrap();
        let child = start(bin, &script, &[("LD_LIBRARY_PATH", &libdir)]);
        let e = Interpreter::find(child.0.id())
            .err()
            .expect("a foreign cookie");
        eprintln!("3.13 with another cookie: {e}");
        assert!(matches!(e, PyError::DebugOffsets { .. }), "{e}");
        assert!(e.to_string().contains("xdebugpy"), "{e}");
    }

    // Versions without a table: refused with the version named.
    for (v, want) in [("3.8.18", "3.8"), ("3.7.16", "3.7"), ("3.6.15", "")] {
        let bin = PathBuf::from(format!("/root/.pyenv/versions/{v}/bin/python{want}"));
        let bin = if want.is_empty() {
            PathBuf::from(format!("/root/.pyenv/versions/{v}/bin/python3.6"))
        } else {
            bin
        };
        if !bin.exists() {
            continue;
        }
        let child = start(&bin, &script, &[]);
        let e = Interpreter::find(child.0.id())
            .err()
            .expect("an old python");
        eprintln!("{v}: {e}");
        match e {
            PyError::UnsupportedVersion { version, .. } => assert_eq!(version, want),
            // 3.6 has no _PyRuntime at all.
            PyError::NoRuntime { .. } => assert!(want.is_empty()),
            e => panic!("{v}: {e}"),
        }
    }
}

/// A process that runs, not one blocked: its frames change under the
/// reader. Each read gives the running function or an error with a reason,
/// never a panic or a stack of garbage names.
#[test]
fn a_running_process_reads_consistently() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("pybusy");
    let script = dir.path("busy.py");
    std::fs::write(
        &script,
        "import sys\n\ndef step(i):\n    return [j * j for j in range(i % 50)]\n\n\
         def spin():\n    sys.stdout.write('ready\\n')\n    sys.stdout.flush()\n\
         \x20   while True:\n        step(7)\n\nspin()\n",
    )
    .unwrap();
    for python in pythons() {
        let mut cmd = Command::new(&python);
        cmd.arg(&script).stdout(Stdio::piped());
        let mut child = Script(cmd.spawn().unwrap());
        let mut line = String::new();
        BufReader::new(child.0.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let mut interp = Interpreter::find(child.0.id()).unwrap();
        let (mut good, mut errors) = (0, Vec::new());
        let t = Instant::now();
        for _ in 0..200 {
            match interp
                .stacks()
                .map(|s| s.into_iter().next().map(|t| t.frames))
            {
                Ok(Some(Ok(frames))) => {
                    let names: Vec<_> = frames.iter().map(|f| f.function.as_str()).collect();
                    assert!(names.contains(&"spin"), "{names:?}");
                    assert_eq!(names.last(), Some(&"<module>"), "{names:?}");
                    good += 1;
                }
                Ok(Some(Err(e))) | Err(e) => errors.push(e.to_string()),
                Ok(None) => errors.push("no thread".into()),
            }
        }
        let each = t.elapsed() / 200;
        eprintln!(
            "{}: {good}/200 consistent reads of a running process, {each:?} each; errors: {:?}",
            python.display(),
            &errors[..errors.len().min(3)]
        );
        assert!(good >= 150, "{errors:?}");
    }
}

/// The resolver keeps code objects by address; a freed one's address
/// taken by a new code object must resolve to the new one's names.
#[test]
fn a_reused_code_address_resolves_to_the_new_code() {
    use std::io::Write as _;
    require_root();
    let _g = serial();
    let dir = TempDir::new("pyreuse");
    let script = dir.path("reuse.py");
    std::fs::write(
        &script,
        "import sys, gc\nwhile True:\n    n = sys.stdin.readline().strip()\n\
         \x20   if not n:\n        break\n\
         \x20   ns = {}\n\
         \x20   exec(compile('def f_%s():\\n    pass\\n' % n, 'gen_%s.py' % n, 'exec'), ns)\n\
         \x20   c = ns['f_%s' % n].__code__\n    print(id(c), flush=True)\n\
         \x20   sys.stdin.readline()\n    del ns, c\n    gc.collect()\n",
    )
    .unwrap();
    let mut reused = std::collections::BTreeMap::new();
    for python in pythons() {
        let mut cmd = Command::new(&python);
        cmd.arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = Script(cmd.spawn().unwrap());
        let mut stdin = child.0.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
        // Found once it runs: straight after exec, the loader may not have
        // mapped libpython yet.
        let mut interp = None;
        let mut seen = std::collections::HashMap::new();
        for i in 0..12 {
            let name = format!("n{i}");
            writeln!(stdin, "{name}").unwrap();
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            let addr: u64 = line.trim().parse().unwrap();
            let interp = interp.get_or_insert_with(|| Interpreter::find(child.0.id()).unwrap());
            // The instruction field of a frame at the code's first
            // instruction, as the walker would copy it.
            let o = interp.offsets();
            let instr = if interp.version() >= (3, 11) {
                addr + o.code_adaptive
            } else {
                0
            };
            let f = interp.resolve(addr, instr).unwrap();
            assert_eq!(f.function, format!("f_{name}"), "{}", python.display());
            assert_eq!(f.file, format!("gen_{name}.py"));
            // Resolved: now it may go.
            writeln!(stdin, "done").unwrap();
            if seen.insert(addr, name).is_some() {
                *reused.entry(python.display().to_string()).or_insert(0) += 1;
            }
        }
    }
    eprintln!("code addresses reused (of 11 chances): {reused:?}");
    assert!(
        !reused.is_empty(),
        "no interpreter reused a code object's address"
    );
}

/// A binary stripped of its symbol table is still read: `_PyRuntime` is
/// a dynamic symbol, which `strip` keeps.
#[test]
fn a_stripped_python_is_still_read() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("pystrip");
    let script = dir.path("blocked.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let stripped = dir.path("python3.11");
    let st = Command::new("/usr/bin/strip")
        .args(["--strip-all", "-o"])
        .arg(&stripped)
        .arg("/usr/bin/python3.11")
        .status()
        .unwrap();
    assert!(st.success());
    let child = start(&stripped, &script, &[]);
    let mut interp = Interpreter::find(child.0.id()).unwrap();
    let stacks = interp.stacks().unwrap();
    let main = frames_of(&stacks, "inner_sleep", 2);
    assert_eq!(main[1].0, "outer");
    assert_eq!(main[1].1, Some(line_of("outer")));
}

fn replace_all(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = hay.to_vec();
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            i += from.len();
        } else {
            i += 1;
        }
    }
    out
}
