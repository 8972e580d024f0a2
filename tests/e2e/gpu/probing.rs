//! What the root recorder reads from a driver library a job maps, and what
//! it puts its breakpoints on: only a file the job's user could read,
//! parsed within fixed bounds, and no more libraries per run than a cap.
//! The job maps files named `libcuda.so.1` the way a hostile one may
//! (tests/gpu/map_job.c, or the stand-in driver through
//! tests/gpu/late_job.c); `record` runs as root, as `sudo` starts it.

use std::{
    os::unix::{
        fs::{OpenOptionsExt as _, PermissionsExt as _},
        process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use crate::support::*;
use serde_json::Value;

const NOBODY: u32 = 65534;
/// Another user, who owns a driver library nobody else may read.
const OWNER: u32 = 4243;
/// Libraries probed per run, at most (trainbpf/src/record/gpu.rs, `MAX_LIBRARIES`).
const MAX_LIBRARIES: usize = 16;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A stand-in driver that only `OWNER` may read (mode 0600), in a
/// directory everyone may traverse.
fn owners_library(dir: &TempDir) -> PathBuf {
    let d = dir.path("owner");
    std::fs::create_dir_all(&d).unwrap();
    let lib = d.join("libcuda.so.1");
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        s(&lib),
        s(&gpu_src("standin_cuda.c")),
        "-lpthread",
    ]);
    std::os::unix::fs::chown(&lib, Some(OWNER), Some(OWNER)).unwrap();
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o600)).unwrap();
    lib
}

/// A directory nobody owns: the job's, and the recording's.
fn nobodys_dir(dir: &TempDir) -> PathBuf {
    let d = dir.path("nobody");
    std::fs::create_dir_all(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(NOBODY), Some(NOBODY)).unwrap();
    d
}

fn map_job(dir: &TempDir) -> PathBuf {
    let job = dir.path("map_job");
    cc(&["-o", s(&job), s(&gpu_src("map_job.c"))]);
    job
}

/// The first byte of `cuMemAlloc_v2` as the owner's own process sees it,
/// through its own mapping of its library: 0xcc is a breakpoint, a uprobe
/// someone put on the owner's file.
fn owners_view(lib: &Path) -> u8 {
    let peek = "import ctypes, sys\n\
                f = ctypes.CDLL(sys.argv[1]).cuMemAlloc_v2\n\
                print(ctypes.c_ubyte.from_address(ctypes.cast(f, ctypes.c_void_p).value).value)";
    let out = Command::new(python())
        .args(["-I", "-c", peek, s(lib)])
        .uid(OWNER)
        .gid(OWNER)
        .env_clear()
        .output()
        .expect("running python as the library's owner");
    assert!(
        out.status.success(),
        "the owner's peek failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// The attach records of `lib` in the report.
fn attaches<'a>(r: &'a Value, lib: &Path) -> Vec<&'a Value> {
    r["gpu"]["attach"]
        .as_array()
        .expect("gpu.attach")
        .iter()
        .filter(|a| a["path"].as_str().is_some_and(|p| p.ends_with(s(lib))))
        .collect()
}

/// `record` as `sudo` starts it for nobody, in nobody's directory, until
/// `marker` appears; then the owner looks at their library while the job
/// still runs (and any probes are still on). Returns the record's output
/// and the owner's byte.
fn record_as_nobody_then_peek(
    home: &Path,
    rec: &Path,
    cmd: &[&str],
    marker: &Path,
    lib: &Path,
) -> (std::process::Output, u8) {
    let mut c = gpu_record_command(
        rec,
        &[
            ("SUDO_UID", &NOBODY.to_string()),
            ("SUDO_GID", &NOBODY.to_string()),
        ],
        cmd,
    );
    c.current_dir(home)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().expect("starting trainbpf record");
    let seen = poll(Duration::from_secs(60), || marker.exists().then_some(()));
    let byte = seen.map(|()| owners_view(lib));
    let out = child.wait_with_output().unwrap();
    print_output(&format!("record as nobody -- {cmd:?}"), &out);
    let byte = byte.expect("the job never mapped the library");
    (out, byte)
}

// Root probed a file the job could not read.
/// A job of nobody's opens another user's 0600 driver library with
/// `O_PATH` (no read permission needed) and maps that descriptor, which
/// fails. The recorder must not read that file nor put breakpoints in it:
/// the owner's own process sees its code as it is. Where the late probe
/// watches the `mmap` system call (kernels without the file fault
/// tracepoints) the recording says the file was refused and why; where it
/// watches faults, a mapping that failed never reaches it, and the
/// recording names no such file.
#[test]
fn a_library_mapped_through_an_o_path_descriptor_is_not_probed() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-opath");
    let lib = owners_library(&dir);
    let job = map_job(&dir);
    let home = nobodys_dir(&dir);
    let marker = home.join("mapped");
    let rec = home.join("opath.rec");
    let (out, byte) = record_as_nobody_then_peek(
        &home,
        &rec,
        &[s(&job), "opath", s(&lib), s(&marker), "3000"],
        &marker,
        &lib,
    );
    assert_eq!(out.status.code(), Some(0), "the job's own status");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Bad file descriptor"), "{stdout}");
    eprintln!("the owner reads 0x{byte:02x} at cuMemAlloc_v2");
    assert_ne!(
        byte, 0xcc,
        "a breakpoint in the owner's library: root probed a file its job could not read"
    );
    let r = report_json(&rec);
    let a = attaches(&r, &lib);
    eprintln!("{a:#?}\nlost: {:#}", r["gpu"]["lost"]);
    assert!(
        a.iter().all(|a| u(&a["attached"]) == 0),
        "symbols of a file the job could not read were probed: {a:#?}"
    );
    assert!(r["gpu"]["late"].as_array().unwrap().is_empty(), "not held");
    let by_syscall = r["gpu"]["sources"].as_array().unwrap().iter().any(|s| {
        s["source"] == "late-mmap" && s["detail"].as_str().unwrap().starts_with("syscalls:")
    });
    let t = report_text_wide(&rec);
    if by_syscall {
        assert_eq!(a.len(), 1, "the refusal is recorded once: {a:#?}");
        let why = a[0]["error"].as_str().unwrap_or_default();
        assert!(why.contains("not open for reading"), "{why}");
        assert_eq!(u(&r["gpu"]["lost"]["unreadable"]), 1);
        assert!(t.contains("not open for reading"), "{t}");
    } else {
        assert!(a.is_empty(), "a mapping that failed was seen: {a:#?}");
        assert_eq!(u(&r["gpu"]["lost"]["unreadable"]), 0);
    }
}

// Root read, as root, a file the job's user cannot
// read.
/// The owner's process hands nobody's job a readable descriptor of its
/// 0600 library (SCM_RIGHTS); the job maps it. The mapping succeeds, but
/// the recorder opens what it parses as the job's user, who may not read
/// the file: refused and said, no breakpoint, and the process's calls
/// from then on are an uncovered window.
#[test]
fn a_library_the_jobs_user_cannot_open_is_not_probed() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-handed");
    let lib = owners_library(&dir);
    let home = nobodys_dir(&dir);
    // Where the two users meet: anyone may make a socket there.
    let meet = dir.path("meet");
    std::fs::create_dir_all(&meet).unwrap();
    std::fs::set_permissions(&meet, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let sock = meet.join("sock");
    let marker = home.join("mapped");
    let rec = home.join("handed.rec");
    // The owner listens in nobody's directory and sends its descriptor.
    let serve = "import os, socket, sys\n\
                 s = socket.socket(socket.AF_UNIX)\n\
                 s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen(1)\n\
                 c, _ = s.accept()\n\
                 socket.send_fds(c, [b'x'], [os.open(sys.argv[2], os.O_RDONLY)])\n";
    let mut owner = Command::new(python())
        .args(["-I", "-c", serve, s(&sock), s(&lib)])
        .uid(OWNER)
        .gid(OWNER)
        .env_clear()
        .spawn()
        .unwrap();
    let served = poll(Duration::from_secs(10), || sock.exists().then_some(()));
    assert!(served.is_some(), "the owner's socket");
    let job = "import mmap, os, socket, sys, time\n\
               s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n\
               _, fds, _, _ = socket.recv_fds(s, 1, 1)\n\
               m = mmap.mmap(fds[0], 4096, prot=mmap.PROT_READ)\n\
               m[0]\n\
               print('mapped', flush=True)\n\
               os.close(os.open(sys.argv[2], os.O_CREAT | os.O_WRONLY, 0o644))\n\
               time.sleep(3)\n";
    let (out, byte) = record_as_nobody_then_peek(
        &home,
        &rec,
        &[python(), "-I", "-c", job, s(&sock), s(&marker)],
        &marker,
        &lib,
    );
    let _ = owner.wait();
    assert_eq!(out.status.code(), Some(0), "the job's own status");
    eprintln!("the owner reads 0x{byte:02x} at cuMemAlloc_v2");
    assert_ne!(
        byte, 0xcc,
        "a breakpoint in the owner's library: root read a file its job's user may not"
    );
    let r = report_json(&rec);
    let a = attaches(&r, &lib);
    eprintln!(
        "{a:#?}\nlost: {:#}\nlate: {:#}",
        r["gpu"]["lost"], r["gpu"]["late"]
    );
    assert_eq!(a.len(), 1, "{a:#?}");
    assert_eq!(u(&a[0]["attached"]), 0, "{a:#?}");
    let why = a[0]["error"].as_str().unwrap_or_default();
    assert!(why.contains("as uid 65534"), "{why}");
    assert_eq!(u(&r["gpu"]["lost"]["unreadable"]), 1);
    // Held for the look, then continued unprobed: a window to the end.
    let late = r["gpu"]["late"].as_array().unwrap();
    assert!(
        late.iter()
            .any(|l| l["held"] == false && l["probed"] == false),
        "{late:#?}"
    );
}

/// An ELF file named like the driver whose `.dynsym` section header claims
/// `claim` bytes: the file is that long, but sparse (a few KiB on disk).
fn sparse_elf(path: &Path, claim: u64) {
    let machine: u16 = if cfg!(target_arch = "aarch64") {
        183
    } else {
        62
    };
    let shstrtab = b"\0.dynsym\0.dynstr\0.shstrtab\0";
    let dynstr = b"\0cuMemAlloc_v2\0";
    let (shstr_at, dynstr_at, dynsym_at) = (320u64, 384u64, 4096u64);
    let mut h = Vec::new();
    h.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    h.extend_from_slice(&[0; 8]);
    h.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
    h.extend_from_slice(&machine.to_le_bytes());
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&0u64.to_le_bytes()); // entry
    h.extend_from_slice(&0u64.to_le_bytes()); // phoff
    h.extend_from_slice(&64u64.to_le_bytes()); // shoff
    h.extend_from_slice(&0u32.to_le_bytes());
    for v in [64u16, 56, 0, 64, 4, 3] {
        // ehsize, phentsize, phnum, shentsize, shnum, shstrndx
        h.extend_from_slice(&v.to_le_bytes());
    }
    let mut sh = |name: u32, ty: u32, off: u64, size: u64, link: u32, entsize: u64| {
        h.extend_from_slice(&name.to_le_bytes());
        h.extend_from_slice(&ty.to_le_bytes());
        h.extend_from_slice(&2u64.to_le_bytes()); // SHF_ALLOC
        h.extend_from_slice(&off.to_le_bytes()); // addr
        h.extend_from_slice(&off.to_le_bytes());
        h.extend_from_slice(&size.to_le_bytes());
        h.extend_from_slice(&link.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        h.extend_from_slice(&8u64.to_le_bytes());
        h.extend_from_slice(&entsize.to_le_bytes());
    };
    sh(0, 0, 0, 0, 0, 0);
    sh(1, 11, dynsym_at, claim, 2, 24); // SHT_DYNSYM
    sh(9, 3, dynstr_at, dynstr.len() as u64, 0, 0); // SHT_STRTAB
    sh(17, 3, shstr_at, shstrtab.len() as u64, 0, 0);
    assert_eq!(h.len() as u64, shstr_at);
    h.extend_from_slice(shstrtab);
    h.resize(dynstr_at as usize, 0);
    h.extend_from_slice(dynstr);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .open(path)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &h, 0).unwrap();
    f.set_len(dynsym_at + claim).unwrap();
}

// A library's section header decided how much memory
// root allocated.
/// A job maps a sparse `libcuda.so.1` whose `.dynsym` claims 2 GiB, with
/// the recorder itself in a 256 MiB memory cgroup (its job below it). The
/// recorder refuses the file for its table's size before reading it, and
/// lives: the job's own exit status, a complete recording, no OOM kill.
#[test]
fn a_library_whose_symbol_table_claims_gigabytes_is_refused_unread() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-sparse");
    let lib_dir = dir.path("env/lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    let lib = lib_dir.join("libcuda.so.1");
    sparse_elf(&lib, 2 << 30);
    let job = map_job(&dir);
    let marker = dir.path("mapped");
    let rec = dir.path("sparse.rec");
    let cg = MemCg::new("sparse", "256M");
    let rec_cmd = gpu_record_command(&rec, &[], &[s(&job), "read", s(&lib), s(&marker), "0"]);
    // The recorder moves itself into the cgroup before it starts: its job
    // starts there too.
    let mut c = Command::new("/bin/sh");
    c.args(["-c", r#"echo $$ > "$0" && exec "$@""#])
        .arg(cg.dir.join("cgroup.procs"))
        .arg(rec_cmd.get_program())
        .args(rec_cmd.get_args());
    for (k, v) in rec_cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let said = dir.path("record.err");
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&said).unwrap());
    let mut recorder = c.spawn().expect("starting trainbpf record");
    // Every process below the recorder, kept as seen: one it leaves behind
    // (held, if it dies) is killed at the end.
    let mut tree: Vec<Started> = Vec::new();
    let status = poll(Duration::from_secs(60), || {
        for p in descendants(recorder.id()) {
            if !tree.contains(&p) {
                tree.push(p);
            }
        }
        recorder.try_wait().unwrap()
    });
    if status.is_none() {
        let _ = recorder.kill();
        let _ = recorder.wait();
    }
    kill_started(&tree);
    let (peak, kills) = (cg.peak(), cg.oom_kills());
    eprintln!(
        "--- record in a 256 MiB cgroup: {status:?}\n{}",
        std::fs::read_to_string(&said).unwrap_or_default()
    );
    eprintln!(
        "the recorder's cgroup: peak {} MiB of 256, {kills} OOM kill(s)",
        peak >> 20
    );
    let status = status.expect("record did not end within 60 s");
    assert_eq!(kills, 0, "nothing was OOM-killed");
    assert_eq!(status.code(), Some(0), "the job's own exit status");
    let r = report_json(&rec);
    let a = attaches(&r, &lib);
    eprintln!("{a:#?}\nlost: {:#}", r["gpu"]["lost"]);
    assert_eq!(a.len(), 1, "{a:#?}");
    let why = a[0]["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("symbol tables") && why.contains("64 MiB"),
        "{why}"
    );
    assert_eq!(u(&r["gpu"]["lost"]["tables_too_big"]), 1);
    let t = report_text_wide(&rec);
    assert!(t.contains("symbol tables"), "{t}");
}

// Nothing capped how many libraries a job could make
// root probe.
/// One driver library more than the cap, each loaded by its own process:
/// the first `MAX_LIBRARIES` are held and probed, the last is not probed,
/// and that is counted and said, its calls an uncovered window.
#[test]
fn libraries_past_the_cap_are_counted_and_said() {
    require_root();
    let _g = serial();
    let dir = TempDir::new("gpu-cap");
    let (libs, job) = late_standins(&dir, MAX_LIBRARIES + 1);
    let nvctl = dir.path("nvidiactl");
    std::fs::write(&nvctl, b"").unwrap();
    let script: String = libs
        .iter()
        .map(|l| format!("{} {} || exit 9\n", job.display(), l.display()))
        .collect();
    let rec = dir.path("cap.rec");
    let out = gpu_record(
        &rec,
        &[("STANDIN_NVIDIACTL", s(&nvctl))],
        &["/bin/sh", "-c", &script],
    );
    assert_eq!(out.status.code(), Some(0));
    let r = report_json(&rec);
    let g = &r["gpu"];
    let attach = g["attach"].as_array().unwrap();
    let probed = attach.iter().filter(|a| u(&a["attached"]) > 0).count();
    eprintln!(
        "{probed} of {} files probed; lost: {:#}",
        libs.len(),
        g["lost"]
    );
    assert_eq!(probed, MAX_LIBRARIES, "{attach:#?}");
    let last = attaches(&r, libs.last().unwrap());
    assert_eq!(last.len(), 1, "{attach:#?}");
    assert_eq!(u(&last[0]["attached"]), 0);
    let why = last[0]["error"].as_str().unwrap_or_default();
    assert!(
        why.contains(&format!("{MAX_LIBRARIES} driver libraries")),
        "{why}"
    );
    assert_eq!(u(&g["lost"]["over_cap"]), 1, "{:#}", g["lost"]);
    // Its four calls: not in the ledger; its window is said, and a
    // recording that holds counts no driver calls in it (no system call
    // tracepoint).
    let late = g["late"].as_array().unwrap();
    let w: Vec<_> = late.iter().filter(|l| l["probed"] == false).collect();
    assert_eq!(w.len(), 1, "{late:#?}");
    assert_eq!(u(&w[0]["calls"]), 0, "{late:#?}");
    assert!(
        w[0]["note"]
            .as_str()
            .is_some_and(|n| n.contains("were not counted")),
        "{late:#?}"
    );
    let t = report_text_wide(&rec);
    assert!(
        t.contains(&format!("{MAX_LIBRARIES} driver libraries")),
        "{t}"
    );
}
