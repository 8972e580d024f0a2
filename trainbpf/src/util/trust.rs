//! Which programs the recorder runs and which libraries it loads. It runs
//! as root, often under `sudo -E` with the user's environment, so nothing
//! it runs or loads may be chosen by the environment alone: helpers
//! (`ldconfig`, `nvidia-smi`) are looked up in a fixed list of system
//! directories, never through `PATH`, and a file the environment names
//! (`TRAINBPF_LIBNVML`, a `LD_LIBRARY_PATH` directory) is used only when
//! it, and every directory above it, is owned by root and writable by root
//! alone. Whatever is refused is said, so that the user learns why.

use std::{
    fmt, fs, io,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    process::Command,
};

use trainbpf_report::term::escape;

/// Where helper programs are looked for, in order.
pub const BIN_DIRS: [&str; 6] = [
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
    "/usr/local/sbin",
    "/usr/local/bin",
];

/// Where drivers put their libraries (Debian/Ubuntu, RHEL, WSL, and the
/// directory NVIDIA's container images mount the driver into).
pub const LIB_DIRS: [&str; 7] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/wsl/lib",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
];

/// The NVML library to load instead of the system's `libnvidia-ml.so.1`.
pub const ENV_LIBNVML: &str = "TRAINBPF_LIBNVML";
/// NVML's soname.
const NVML: &str = "libnvidia-ml.so.1";

/// Why a file may not be run or loaded by root.
#[derive(Debug, thiserror::Error)]
pub enum Untrusted {
    #[error("{}: {source}", escape(&path.to_string_lossy()))]
    Io { path: PathBuf, source: io::Error },
    #[error("{} is owned by uid {uid}, not root", escape(&path.to_string_lossy()))]
    Owner { path: PathBuf, uid: u32 },
    #[error("{} can be written by {who}", escape(&path.to_string_lossy()))]
    Writable { path: PathBuf, who: String },
    #[error("{} is not a regular file", escape(&path.to_string_lossy()))]
    NotFile { path: PathBuf },
}

/// Checks that `path` names a regular file that only root can change, and
/// returns it with every symbolic link resolved: the path to run or load.
///
/// Every directory from `/` down must be owned by root and writable by
/// root alone (group root may write, and a sticky directory such as `/tmp`
/// may be writable by all: others cannot rename or remove what root owns
/// in it). Checking the resolved path is enough: no one else can swap a
/// component of a path whose directories only root can write.
pub fn check(path: &Path) -> Result<PathBuf, Untrusted> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Untrusted::Io { path, source }
    };
    let real = fs::canonicalize(path).map_err(io(path))?;
    // The file itself through an fd opened without following a link, so
    // that what is checked is what the path names now.
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&real)
        .map_err(io(&real))?;
    let m = f.metadata().map_err(io(&real))?;
    if !m.is_file() {
        return Err(Untrusted::NotFile { path: real });
    }
    owned_by_root(&real, &m)?;
    for dir in real.ancestors().skip(1) {
        let m = fs::symlink_metadata(dir).map_err(io(dir))?;
        if !m.is_dir() {
            return Err(Untrusted::NotFile {
                path: dir.to_path_buf(),
            });
        }
        owned_by_root(dir, &m)?;
    }
    Ok(real)
}

fn owned_by_root(path: &Path, m: &fs::Metadata) -> Result<(), Untrusted> {
    if m.uid() != 0 {
        return Err(Untrusted::Owner {
            path: path.to_path_buf(),
            uid: m.uid(),
        });
    }
    let mode = m.mode();
    let sticky_dir = m.is_dir() && mode & libc::S_ISVTX != 0;
    let who = if mode & 0o002 != 0 && !sticky_dir {
        Some("every user".to_string())
    } else if mode & 0o020 != 0 && m.gid() != 0 && !sticky_dir {
        Some(format!("its group (gid {})", m.gid()))
    } else {
        None
    };
    // An ACL's named entries are not in the mode (whose group bits are
    // then the ACL's mask): group root's 0775 may also let Bob write.
    let who = who.or_else(|| (!sticky_dir).then(|| acl_writer(path)).flatten());
    match who {
        Some(who) => Err(Untrusted::Writable {
            path: path.to_path_buf(),
            who,
        }),
        None => Ok(()),
    }
}

/// Who other than root may write `path` through a named entry of its
/// POSIX ACL (`system.posix_acl_access`), taking the mask into account.
/// An ACL that cannot be read or parsed counts as a writer: root does not
/// guess.
fn acl_writer(path: &Path) -> Option<String> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let mut buf = [0u8; 4096];
    // SAFETY: valid C strings and buffer; lgetxattr follows no link.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error().raw_os_error();
        return match e {
            Some(libc::ENODATA) | Some(libc::EOPNOTSUPP) => None,
            _ => Some("users named in an ACL that could not be read".into()),
        };
    }
    acl_writer_in(&buf[..n as usize])
}

fn acl_writer_in(acl: &[u8]) -> Option<String> {
    const ACL_USER: u16 = 0x02;
    const ACL_GROUP: u16 = 0x08;
    const ACL_MASK: u16 = 0x10;
    const WRITE: u16 = 0x02;
    // Version 2 header, then (tag u16, perm u16, id u32) entries.
    if acl.len() < 4 || !(acl.len() - 4).is_multiple_of(8) || acl[..4] != 2u32.to_le_bytes() {
        return Some("users named in an ACL of an unknown format".into());
    }
    let entries: Vec<(u16, u16, u32)> = acl[4..]
        .chunks_exact(8)
        .map(|e| {
            (
                u16::from_le_bytes([e[0], e[1]]),
                u16::from_le_bytes([e[2], e[3]]),
                u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            )
        })
        .collect();
    let mask = entries
        .iter()
        .find(|e| e.0 == ACL_MASK)
        .map_or(0xffff, |e| e.1);
    entries.iter().find_map(|&(tag, perm, id)| {
        if perm & mask & WRITE == 0 || id == 0 {
            return None;
        }
        match tag {
            ACL_USER => Some(format!("uid {id} (through its ACL)")),
            ACL_GROUP => Some(format!("gid {id} (through its ACL)")),
            _ => None,
        }
    })
}

/// A helper program by name, from [`BIN_DIRS`] only: the first there that
/// passes [`check`].
pub fn program(name: &str) -> Option<PathBuf> {
    BIN_DIRS
        .iter()
        .map(|d| Path::new(d).join(name))
        .filter(|p| p.symlink_metadata().is_ok())
        .find_map(|p| check(&p).ok())
}

/// `ldconfig -p`, run from a system directory: (soname, path) of every
/// library in the loader's cache. Empty when there is no trusted ldconfig.
pub fn ld_cache() -> Vec<(String, PathBuf)> {
    let Some(ldconfig) = program("ldconfig") else {
        return Vec::new();
    };
    let Ok(o) = Command::new(ldconfig).arg("-p").output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|line| {
            // `	libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1`
            let (name, path) = line.trim().split_once(" => ")?;
            let soname = name.split_whitespace().next()?;
            Some((soname.to_string(), PathBuf::from(path.trim())))
        })
        .collect()
}

/// A file the environment named that root will not use.
#[derive(Debug)]
pub struct Refusal {
    /// The variable that named it.
    pub var: &'static str,
    /// What it named.
    pub path: PathBuf,
    pub why: Untrusted,
}

impl Untrusted {
    fn path(&self) -> &Path {
        match self {
            Untrusted::Io { path, .. }
            | Untrusted::Owner { path, .. }
            | Untrusted::Writable { path, .. }
            | Untrusted::NotFile { path } => path,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let named = escape(&self.path.to_string_lossy()).into_owned();
        let why = self.why.to_string();
        // "it is owned by uid 1000" when the fault is the file itself, the
        // directory's name when it is one above it.
        let why = match fs::canonicalize(&self.path) {
            Ok(real) if real == self.why.path() => {
                let at = escape(&real.to_string_lossy()).into_owned();
                match why.strip_prefix(&at) {
                    Some(rest) if real == self.path => format!("it{rest}"),
                    Some(rest) => format!("it ({at}){rest}"),
                    None => why,
                }
            }
            _ => why,
        };
        write!(
            f,
            "{} names {named}, which root will not load: {why}",
            self.var
        )
    }
}

/// The NVML library the recorder would load, and how it was found.
#[derive(Debug, Default)]
pub struct Library {
    /// `None`: no trusted copy anywhere.
    pub path: Option<PathBuf>,
    /// `TRAINBPF_LIBNVML`, `LD_LIBRARY_PATH`, `ld.so cache` or `dir`.
    pub found_by: &'static str,
    /// Files the environment named and root refused, in the order tried.
    pub refused: Vec<Refusal>,
}

impl Library {
    /// "libnvidia-ml.so.1 not found in LD_LIBRARY_PATH, the ld.so cache or
    /// /usr/lib64, …", with each refusal.
    pub fn not_found(&self) -> String {
        let mut s = format!(
            "no trusted {NVML} in {ENV_LIBNVML}, LD_LIBRARY_PATH, the ld.so cache or {}",
            LIB_DIRS.join(", ")
        );
        for r in &self.refused {
            s.push_str("; ");
            s.push_str(&r.to_string());
        }
        s
    }
}

/// Finds NVML: `TRAINBPF_LIBNVML`, then `LD_LIBRARY_PATH`, the loader's
/// cache and [`LIB_DIRS`], the first file that passes [`check`]. The
/// loader would search `LD_LIBRARY_PATH` for a bare soname; here its
/// directories count only where root alone can write them.
pub fn nvml_library() -> Library {
    let mut lib = Library::default();
    let try_path = |lib: &mut Library, var: Option<&'static str>, p: PathBuf, how| match check(&p) {
        Ok(real) => {
            lib.path = Some(real);
            lib.found_by = how;
            true
        }
        Err(why) => {
            if let Some(var) = var {
                lib.refused.push(Refusal { var, path: p, why });
            }
            false
        }
    };
    if let Some(v) = std::env::var_os(ENV_LIBNVML).filter(|v| !v.is_empty())
        && try_path(&mut lib, Some(ENV_LIBNVML), v.into(), ENV_LIBNVML)
    {
        return lib;
    }
    if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
        for d in std::env::split_paths(&v).filter(|d| d.is_absolute()) {
            let p = d.join(NVML);
            if p.symlink_metadata().is_ok()
                && try_path(&mut lib, Some("LD_LIBRARY_PATH"), p, "LD_LIBRARY_PATH")
            {
                return lib;
            }
        }
    }
    let cached = ld_cache()
        .into_iter()
        .filter(|(name, _)| name == NVML)
        .map(|(_, p)| (p, "ld.so cache"));
    let dirs = LIB_DIRS.iter().map(|d| (Path::new(d).join(NVML), "dir"));
    for (p, how) in cached.chain(dirs) {
        if p.symlink_metadata().is_ok() && try_path(&mut lib, None, p, how) {
            return lib;
        }
    }
    lib
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_files_pass_and_others_do_not() {
        // /bin/sh and its directories are root's on any machine that runs
        // these tests; the link (/bin → usr/bin on merged /usr) resolves.
        let sh = check(Path::new("/bin/sh")).expect("/bin/sh is trusted");
        assert!(sh.is_absolute());
        assert!(matches!(
            check(Path::new("/nonexistent/libnvidia-ml.so.1")),
            Err(Untrusted::Io { .. })
        ));
        assert!(matches!(
            check(Path::new("/usr/bin")),
            Err(Untrusted::NotFile { .. })
        ));
        assert!(program("sh").is_some());
        assert!(program("no-such-helper-anywhere").is_none());
    }

    #[test]
    fn acl_entries_that_grant_write() {
        const U: u32 = u32::MAX;
        let acl = |entries: &[(u16, u16, u32)]| {
            let mut v = 2u32.to_le_bytes().to_vec();
            for &(t, p, id) in entries {
                v.extend(t.to_le_bytes());
                v.extend(p.to_le_bytes());
                v.extend(id.to_le_bytes());
            }
            v
        };
        let base = [(0x01, 7, U), (0x04, 5, U), (0x20, 5, U)];
        assert_eq!(acl_writer_in(&acl(&base)), None);
        let bob = [
            (0x01, 7, U),
            (0x02, 7, 1000),
            (0x04, 5, U),
            (0x10, 7, U),
            (0x20, 5, U),
        ];
        assert_eq!(
            acl_writer_in(&acl(&bob)).as_deref(),
            Some("uid 1000 (through its ACL)")
        );
        // The mask takes write away; a root entry is root.
        let masked = [
            (0x01, 7, U),
            (0x02, 7, 1000),
            (0x04, 5, U),
            (0x10, 5, U),
            (0x20, 5, U),
        ];
        assert_eq!(acl_writer_in(&acl(&masked)), None);
        let group = [
            (0x01, 7, U),
            (0x04, 5, U),
            (0x08, 6, 0),
            (0x08, 2, 50),
            (0x10, 7, U),
        ];
        assert_eq!(
            acl_writer_in(&acl(&group)).as_deref(),
            Some("gid 50 (through its ACL)")
        );
        assert!(
            acl_writer_in(b"\x01\x00\x00\x00").is_some(),
            "unknown format"
        );
    }

    #[test]
    fn refusals_name_the_variable_and_escape_the_path() {
        let r = Refusal {
            var: ENV_LIBNVML,
            path: "/tmp/x\x1b]0;t\x07/libnvidia-ml.so.1".into(),
            why: Untrusted::Owner {
                path: "/tmp/x\x1b]0;t\x07".into(),
                uid: 1000,
            },
        };
        let s = r.to_string();
        assert!(!s.contains('\x1b'), "{s}");
        assert!(
            s.starts_with("TRAINBPF_LIBNVML names /tmp/x\\x1b]0;t\\x07/libnvidia-ml.so.1"),
            "{s}"
        );
        assert!(s.ends_with("is owned by uid 1000, not root"), "{s}");
    }
}
