//! A leak through a C extension, recorded without flags: the extension
//! (built here as pip wheels are, `-O2 -fomit-frame-pointer`) keeps a
//! block it `memset`s on each call from `featurize`. The heaviest growth
//! stack holds both halves: the extension's own function that called
//! `memset`, found by its unwind tables, and the Python line that called
//! into the extension.

use std::path::PathBuf;
use std::process::Command;

use crate::support::*;
use serde_json::Value;

const EXT_C: &str = r#"#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

static char *kept[1 << 16];
static size_t nkept;

__attribute__((noinline, noclone)) char *fill_block(size_t n) {
    char *p = malloc(n);
    if (p)
        memset(p, 7, n); /* FILL */
    return p;
}

static PyObject *grow(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n))
        return NULL;
    if (nkept < sizeof kept / sizeof kept[0])
        kept[nkept++] = fill_block((size_t)n);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"grow", grow, METH_VARARGS, "keep n more bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "leakext", NULL, -1, methods};

PyMODINIT_FUNC PyInit_leakext(void) { return PyModule_Create(&module); }
"#;

const JOB: &str = r#"
import sys, time
sys.path.insert(0, sys.argv[1])
import leakext
def featurize():
    leakext.grow(1 << 20)
while True:
    featurize()
    time.sleep(0.002)
"#;

/// The interpreter's headers: Debian's `libpython3-dev`, installed when
/// missing (CI runs as root on a fresh machine).
fn python_include() -> PathBuf {
    let ask = |what: &str| {
        let out = Command::new(python())
            .args(["-c", &format!("import sysconfig; print({what})")])
            .output()
            .expect("running python3");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let include = PathBuf::from(ask("sysconfig.get_paths()['include']"));
    if !include.join("Python.h").exists() {
        let apt = Command::new("apt-get")
            .args(["install", "-y", "-q", "libpython3-dev"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .expect("running apt-get");
        assert!(apt.success(), "installing libpython3-dev for Python.h");
    }
    assert!(include.join("Python.h").exists(), "{include:?}");
    include
}

fn frames_with(stack: &Value, kind: &str, function: &str) -> Vec<Value> {
    stack["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| {
            f["kind"] == kind
                && f["function"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(function))
        })
        .cloned()
        .collect()
}

#[test]
fn a_leak_through_a_c_extension_names_its_function_and_the_python_line() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("py-cext");
    let include = format!("-I{}", python_include().display());
    let built = build_c(
        &dir,
        "leakext",
        EXT_C,
        &["-O2", "-fomit-frame-pointer", "-shared", "-fPIC", &include],
    );
    std::fs::rename(&built, dir.path("leakext.so")).unwrap();
    let rec = dir.path("c.rec");
    let out = record(
        &rec,
        &["-q", "--memory-limit", "128M"],
        &[python(), "-c", JOB, dir.0.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(137), "the leak runs into the limit");
    let r = report_json(&rec);
    let k = job_kill(&r);
    let heavy = &k["growers"][0]["stacks"][0];
    eprintln!("heaviest stack: {heavy}");
    assert!(u(&heavy["kb"]) >= 64 << 10, "{heavy}");

    // The extension's function, by its file's unwind tables (no frame
    // pointer in it), at the memset's line.
    let fill = frames_with(heavy, "native", "fill_block");
    assert_eq!(fill.len(), 1, "fill_block in the stack: {heavy}");
    let line = EXT_C.lines().position(|l| l.contains("FILL")).unwrap() as u64 + 1;
    assert!(
        fill[0]["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("leakext.c")),
        "{}",
        fill[0]
    );
    assert_eq!(u(&fill[0]["line"]), line, "{}", fill[0]);
    // Its caller in the extension was found by the tables too.
    let grow = frames_with(heavy, "native", "grow");
    assert!(!grow.is_empty(), "grow in the stack: {heavy}");
    assert_eq!(grow[0]["found"], "unwind table", "{}", grow[0]);
    // And the Python line that called into it.
    let featurize = frames_with(heavy, "python", "featurize");
    assert_eq!(featurize.len(), 1, "featurize in the stack: {heavy}");
    let pos = |f: &Value| {
        heavy["frames"]
            .as_array()
            .unwrap()
            .iter()
            .position(|g| g == f)
            .unwrap()
    };
    assert!(
        pos(&fill[0]) < pos(&featurize[0]),
        "innermost first: {heavy}"
    );
    let py_line = JOB
        .lines()
        .position(|l| l.contains("leakext.grow"))
        .unwrap() as u64
        + 1;
    assert_eq!(u(&featurize[0]["line"]), py_line, "{}", featurize[0]);

    // The text's verdict cites the extension's line, which is the job's
    // own code (neither the interpreter nor site-packages).
    let text = Command::new(bin())
        .arg("report")
        .arg(&rec)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).replace("\n               ", " ");
    eprintln!("{text}");
    assert!(
        text.contains(&format!("in fill_block (leakext.c:{line})")),
        "the verdict cites fill_block:\n{text}"
    );
}
