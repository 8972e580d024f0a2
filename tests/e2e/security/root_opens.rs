//! What the root recorder and `sudo trainbpf report` open, read and
//! write: each test plays one attacker, a job or a local user
//! (nobody, 65534, or uid 54321), with root-owned files standing in for the
//! machine's.

use std::{
    ffi::CString,
    io::Read as _,
    os::unix::{
        ffi::OsStrExt as _,
        fs::{FileTypeExt as _, OpenOptionsExt as _, PermissionsExt as _, chown},
    },
    path::Path,
    process::{Command, Output, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use crate::support::*;

const NOBODY: u32 = 65534;
/// Another local user, with no passwd entry.
const BOB: u32 = 54321;

fn mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

fn give(p: &Path, uid: u32) {
    chown(p, Some(uid), Some(uid)).unwrap();
}

/// Builds a shared library from C source with the system's compiler.
fn cc_shared(dir: &Path, name: &str, c_source: &str) -> std::path::PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, c_source).unwrap();
    let out = dir.join(name);
    crate::support::cc_shared(&src, &out);
    out
}

fn logged(what: &str, out: Output) -> Output {
    eprintln!(
        "--- {what}: {}\n--- stdout:\n{}\n--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `trainbpf ARGS` as root, as if run by `sudo` from `uid` (None: root
/// itself), with none of the machine's GPU settings.
fn trainbpf(uid: Option<u32>, args: &[&std::ffi::OsStr]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .env_remove("TRAINBPF_LIBCUDA")
        .env_remove("TRAINBPF_LIBNVML")
        .env_remove("LD_LIBRARY_PATH")
        .stdin(Stdio::null());
    if let Some(uid) = uid {
        c.env("SUDO_UID", uid.to_string())
            .env("SUDO_GID", uid.to_string());
    }
    c
}

/// A small recording made by root of `/bin/true`.
fn small_recording(rec: &Path) {
    let out = logged(
        "record /bin/true",
        trainbpf(
            None,
            &[
                "record".as_ref(),
                "--quiet".as_ref(),
                "-o".as_ref(),
                rec.as_os_str(),
                "--".as_ref(),
                "/bin/true".as_ref(),
            ],
        )
        .output()
        .unwrap(),
    );
    assert_eq!(out.status.code(), Some(0));
}

/// The same CUDA driver entry points in a job's stand-in and in root's
/// library; `PAD` moves root's to another offset.
const FAKE_CUDA: &str = r#"
#ifdef PAD
__attribute__((used)) static volatile int pad[4096];
int cuPad(int i) { return pad[i & 4095]; }
#endif
int cuInit(unsigned flags) { return (int)flags; }
int cuMemAlloc_v2(void **p, unsigned long n) { if (p) *p = (void *)n; return 0; }
int cuMemFree_v2(void *p) { return p == 0; }
"#;

/// The job: maps its stand-in through `libcuda.so.1` and root's library,
/// then puts a link to root's library at the stand-in's name (the mapped
/// file is now unlinked: maps shows the name with " (deleted)"). It waits
/// for the recorder's scan to plant its breakpoint (an int3, 0xcc, at
/// cuMemAlloc_v2, seen by reading its own code), then two scans more, and
/// prints the first byte of cuMemAlloc_v2 in each library.
const STEER_JOB: &str = r#"
import ctypes, os, sys, time
J, V = sys.argv[1], sys.argv[2]
j, v = ctypes.CDLL(J), ctypes.CDLL(V)
os.symlink(V, J + ".link")
os.replace(J + ".link", J)
def first(lib):
    return ctypes.string_at(ctypes.cast(lib.cuMemAlloc_v2, ctypes.c_void_p).value, 1)[0]
end = time.time() + 20
while time.time() < end and 0xcc not in (first(j), first(v)):
    time.sleep(0.1)
time.sleep(2.5)
print(f"job={first(j):#x} root={first(v):#x}", flush=True)
"#;

/// The recorder built `/proc/PID/root<path>`
/// from the job's maps and attached its uprobes by that path (resolved
/// again by aya's ELF read and by `perf_event_open`), so a job that put a
/// link at its library's name made root plant breakpoints (int3), at
/// offsets read from whatever the link named, in every process mapping
/// that file.
///
/// Deterministic form: the job maps its stand-in libcuda, then replaces the
/// name by a link to a root-owned library exporting the same calls (at
/// other offsets) before the recorder's first scan. The oracle is the
/// kernel itself: a uprobe on an inode writes 0xcc into every mapping of
/// it, which the job reads back from its own memory. Root's library must
/// stay untouched; the job's own stand-in (the inode it maps) must be the
/// one probed, which also proves that a scan ran.
#[test]
fn a_job_cannot_steer_the_libcuda_probe_to_another_file() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("rev-a");
    let roots = dir.path("root");
    std::fs::create_dir(&roots).unwrap();
    let victim = cc_shared(
        &roots,
        "libvictim.so",
        &format!("#define PAD 1\n{FAKE_CUDA}"),
    );
    mode(&victim, 0o644);
    let job_dir = dir.path("job");
    std::fs::create_dir(&job_dir).unwrap();
    let standin = cc_shared(&job_dir, "libcuda.so.1", FAKE_CUDA);
    let script = job_dir.join("steer.py");
    std::fs::write(&script, STEER_JOB).unwrap();
    for p in [&standin, &script, &job_dir] {
        give(p, NOBODY);
    }

    let rec = job_dir.join("a.rec");
    let out = logged(
        "record the steering job as nobody",
        output_within(
            trainbpf(
                Some(NOBODY),
                &[
                    "record".as_ref(),
                    "--quiet".as_ref(),
                    "-o".as_ref(),
                    rec.as_os_str(),
                    "--".as_ref(),
                    python().as_ref(),
                    script.as_os_str(),
                    standin.as_os_str(),
                    victim.as_os_str(),
                ],
            )
            .current_dir(&job_dir),
            Duration::from_secs(90),
        )
        .expect("record finished"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("job="))
        .unwrap_or_else(|| panic!("the job printed no bytes: {stdout}"));
    assert!(
        !line.contains("root=0xcc"),
        "root's library got a breakpoint at the job's say: {line}"
    );
    assert!(
        line.contains("job=0xcc"),
        "the library the job maps is the one probed: {line}"
    );
    assert_eq!(out.status.code(), Some(0));
}

/// `sudo trainbpf report PATH` opened PATH as
/// root, so any user with sudo rights for trainbpf read another user's
/// 0600 recording (its argv, cwd, process tree).
///
/// Bob's 0600 recording; `report` run by nobody must be refused as
/// `cat` would be, and run by Bob must work.
#[test]
fn report_reads_the_recording_with_the_invokers_rights() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("rev-b");
    let rec = dir.path("bob.rec");
    small_recording(&rec);
    give(&rec, BOB);
    mode(&rec, 0o600);

    let report = |uid| {
        logged(
            &format!("report as uid {uid}"),
            trainbpf(
                Some(uid),
                &["report".as_ref(), rec.as_os_str(), "--format=json".as_ref()],
            )
            .output()
            .unwrap(),
        )
    };
    let nobody = report(NOBODY);
    assert!(
        !nobody.status.success() && nobody.stdout.is_empty(),
        "nobody read Bob's recording"
    );
    let err = String::from_utf8_lossy(&nobody.stderr);
    assert!(err.contains("ermission denied"), "{err}");
    let bob = report(BOB);
    assert!(bob.status.success(), "Bob reads his own recording");
    let r: serde_json::Value = serde_json::from_slice(&bob.stdout).unwrap();
    assert!(r["job"].is_object(), "{r}");
}

// `sudo trainbpf report DIR` told whether a hidden directory exists.
/// `report` looked at each path as root (is it a directory?) before it
/// opened it as the user, so under a 0700 root directory an existing
/// subdirectory and a missing one gave different errors. Both must give
/// the same error, with neither read.
#[test]
fn report_does_not_tell_whether_a_hidden_path_exists() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("rev-hidden");
    let vault = dir.path("vault");
    std::fs::create_dir(&vault).unwrap();
    mode(&vault, 0o700);
    // A directory of recordings that root could list, and a path that is
    // not there.
    let there = vault.join("aaaa");
    std::fs::create_dir(&there).unwrap();
    mode(&there, 0o755);
    small_recording(&there.join("n.rec"));
    mode(&there.join("n.rec"), 0o644);
    let missing = vault.join("bbbb");

    let report = |p: &Path| {
        let out = logged(
            &format!("report {} as nobody", p.display()),
            trainbpf(Some(NOBODY), &["report".as_ref(), p.as_os_str()])
                .current_dir(&dir.0)
                .output()
                .unwrap(),
        );
        assert!(
            !out.status.success() && out.stdout.is_empty(),
            "nobody read {} under root's 0700 directory",
            p.display()
        );
        // The path itself is named: compare what is said about it.
        String::from_utf8_lossy(&out.stderr).replace(p.to_str().unwrap(), "PATH")
    };
    let said_there = report(&there);
    let said_missing = report(&missing);
    assert_eq!(
        said_there, said_missing,
        "an existing and a missing directory under a 0700 parent are told apart"
    );
    assert!(said_there.contains("ermission denied"), "{said_there}");
}

/// A report output that already existed as a
/// FIFO was written through whoever owned it, so in sticky /tmp user B's
/// FIFO named `trace.json` received user A's report
/// (`--perfetto /tmp/trace.json`): no `O_CREAT`, so `fs.protected_fifos`
/// does not apply.
///
/// Bob's 0666 FIFO in a sticky directory, with a reader on it (so that a
/// writer's open would not wait); nobody's `report --perfetto` at it must
/// be refused, and the reader must receive nothing.
#[test]
fn report_outputs_do_not_write_into_another_users_fifo() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("rev-c");
    let rec = dir.path("c.rec");
    small_recording(&rec);
    mode(&rec, 0o644);
    let sticky = dir.path("tmp");
    std::fs::create_dir(&sticky).unwrap();
    mode(&sticky, 0o1777);
    let fifo = sticky.join("trace.json");
    let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    mode(&fifo, 0o666);
    give(&fifo, BOB);

    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    // Drained while report runs: a trace bigger than the pipe would
    // otherwise stall the writer.
    let stop = Arc::new(AtomicBool::new(false));
    let drain = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = [0u8; 65536];
            loop {
                let last = stop.load(Ordering::SeqCst);
                while let Ok(n) = reader.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                if last {
                    return got;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let out = output_within(
        trainbpf(
            Some(NOBODY),
            &[
                "report".as_ref(),
                rec.as_os_str(),
                "--perfetto".as_ref(),
                fifo.as_os_str(),
            ],
        )
        .current_dir(&dir.0),
        Duration::from_secs(60),
    );
    stop.store(true, Ordering::SeqCst);
    let got = drain.join().unwrap();
    let out = logged(
        "report --perfetto into Bob's FIFO",
        out.expect("report ended"),
    );
    assert!(
        got.is_empty(),
        "Bob's FIFO received {} bytes of nobody's report: {:?}",
        got.len(),
        String::from_utf8_lossy(&got[..got.len().min(80)])
    );
    assert!(!out.status.success(), "the output is refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("belongs to uid 54321"), "{err}");
    let m = std::fs::symlink_metadata(&fifo).unwrap();
    assert!(m.file_type().is_fifo(), "Bob's FIFO stays");
}

/// `system.posix_acl_access` granting `uid` rwx: a mask of rwx, which the
/// mode's group bits then show (0775 with group root).
fn acl_user_rwx(uid: u32) -> Vec<u8> {
    const UNDEFINED: u32 = u32::MAX;
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 7u16, UNDEFINED), // owner
        (0x02, 7, uid),             // the named user
        (0x04, 5, UNDEFINED),       // owning group
        (0x10, 7, UNDEFINED),       // mask
        (0x20, 5, UNDEFINED),       // others
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// The trust check let through a directory or
/// file writable by group root, but on a file with a POSIX ACL the group
/// bits are the ACL's mask, and a named entry may grant another user
/// write: root loaded a library that user could replace.
///
/// Root's NVML stand-in (whose constructor writes a marker) in a root-owned
/// directory whose ACL lets nobody write: `record` with `TRAINBPF_LIBNVML`
/// naming it must not load it, and must say why.
#[test]
fn a_library_writable_through_an_acl_is_not_loaded_as_root() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("rev-d");
    let markers = dir.path("markers");
    std::fs::create_dir(&markers).unwrap();
    mode(&markers, 0o777);
    let lib_dir = dir.path("lib");
    std::fs::create_dir(&lib_dir).unwrap();
    let lib = cc_shared(
        &lib_dir,
        "libnvidia-ml.so.1",
        &format!(
            "#include <stdio.h>\n\
             __attribute__((constructor)) static void mark(void) {{\n\
             FILE *f = fopen(\"{}/nvml\", \"w\"); if (f) fclose(f); }}\n\
             int nvmlInit_v2(void) {{ return 0; }}\n",
            markers.display()
        ),
    );
    mode(&lib, 0o644);
    let acl = acl_user_rwx(NOBODY);
    let c = CString::new(lib_dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C strings and buffer.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            acl.as_ptr().cast(),
            acl.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setting the ACL: {}", std::io::Error::last_os_error());
    // The ACL is real: nobody may now create files there.
    let probe = Command::new("/usr/bin/setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/touch",
        ])
        .arg(lib_dir.join("by-nobody"))
        .status()
        .unwrap();
    assert!(probe.success(), "the ACL lets nobody write the directory");

    let rec = dir.path("d.rec");
    let out = logged(
        "record with TRAINBPF_LIBNVML",
        trainbpf(
            None,
            &[
                "record".as_ref(),
                "--quiet".as_ref(),
                "-o".as_ref(),
                rec.as_os_str(),
                "--".as_ref(),
                "/bin/true".as_ref(),
            ],
        )
        .env("TRAINBPF_LIBNVML", &lib)
        .output()
        .unwrap(),
    );
    let ran: Vec<String> = std::fs::read_dir(&markers)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(ran.is_empty(), "root loaded the library: {ran:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("which root will not load") && err.contains("ACL"),
        "{err}"
    );
    assert_eq!(out.status.code(), Some(0));
}
