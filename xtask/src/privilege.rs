//! Root for the tasks that need it, the same way for everyone: as root
//! (CI, a training container that has no sudo) a task just runs; as a user
//! it is re-run under sudo, so that the README can say `cargo xtask demo`
//! for both.
//!
//! sudo resets the environment, and its secure_path drops `~/.cargo/bin`:
//! the re-run gets the toolchain's variables back explicitly through
//! env(1). Before that, the invoking user builds all that the task builds,
//! so that `target/` and the toolchain stay theirs: the root run then finds
//! everything fresh and writes no root-owned build output a later
//! unprivileged build would trip over.

use std::{
    env,
    ffi::{OsStr, OsString},
    os::unix::{ffi::OsStrExt, fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::util::is_root;

/// Set in the re-run: a sudo that did not make us root (a stub, a policy
/// that maps to another user) must not re-run us for ever.
const RERUN_MARK: &str = "XTASK_RERUN_UNDER_SUDO";

/// Variables the re-run keeps: where the toolchain is (rustup's and cargo's
/// homes default to `~`, which is root's home under sudo), which toolchain
/// and target directory this run uses, and PATH for the `cargo` and
/// `rustup` the tasks run.
const KEPT: &[&str] = &[
    "RUSTUP_HOME",
    "CARGO_HOME",
    "RUSTUP_TOOLCHAIN",
    "CARGO_TARGET_DIR",
    "RUST_BACKTRACE",
];

/// Where env(1) is, by absolute path: sudo's PATH is not ours to trust.
const ENV_PATHS: &[&str] = &["/usr/bin/env", "/bin/env"];

/// Returns when already root. Otherwise runs `prepare` as the user, then
/// replaces this process with itself under sudo; returns only an error.
pub fn become_root(task: &str, why: &str, prepare: impl FnOnce() -> Result<()>) -> Result<()> {
    if is_root() {
        return Ok(());
    }
    if env::var_os(RERUN_MARK).is_some() {
        bail!("`cargo xtask {task}` re-ran itself under sudo, and is still not root");
    }
    let path = env::var_os("PATH").unwrap_or_default();
    let Some(sudo) = find_in_path("sudo", &path) else {
        bail!(
            "`cargo xtask {task}` needs root ({why}); this user is not root and there is \
             no sudo on PATH: run it as root"
        );
    };
    let env_bin = ENV_PATHS
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .context("no env(1) at /usr/bin/env or /bin/env, to carry the toolchain's paths")?;
    let exe = env::current_exe().context("cannot find xtask's own binary")?;

    eprintln!("xtask: {task} needs root ({why}); building as this user first");
    prepare()?;
    let vars = kept_env(|k| env::var_os(k));
    let args: Vec<OsString> = env::args_os().skip(1).collect();
    let mut cmd = sudo_command(&sudo, env_bin, &exe, &args, &vars);
    eprintln!("xtask: re-running as root: {}", show(&cmd));
    let err = cmd.exec();
    Err(err).with_context(|| format!("cannot run {}", sudo.display()))
}

/// `program` run as root: as it is when we are root, else under sudo, for
/// the one step of an otherwise unprivileged task that needs root.
pub fn as_root(program: &str, why: &str) -> Result<Command> {
    if is_root() {
        return Ok(Command::new(program));
    }
    let sudo = find_in_path("sudo", &env::var_os("PATH").unwrap_or_default())
        .with_context(|| format!("{why} needs root, and there is no sudo on PATH: run as root"))?;
    let mut cmd = Command::new(sudo);
    cmd.arg("--").arg(program);
    Ok(cmd)
}

/// `sudo -- /usr/bin/env VAR=value … /abs/xtask ARGS`. sudo runs env(1) as
/// root; env sets the variables sudo would have dropped.
fn sudo_command(
    sudo: &Path,
    env_bin: &Path,
    exe: &Path,
    args: &[OsString],
    vars: &[(String, OsString)],
) -> Command {
    let mut cmd = Command::new(sudo);
    cmd.arg("--").arg(env_bin);
    for (key, value) in vars {
        let mut kv = OsString::from(format!("{key}="));
        kv.push(value);
        cmd.arg(kv);
    }
    cmd.arg(format!("{RERUN_MARK}=1")).arg(exe).args(args);
    cmd
}

/// The variables to carry, from `get` (the environment): those in KEPT that
/// are set; RUSTUP_HOME and CARGO_HOME from HOME where unset; and PATH,
/// with cargo's bin directory and the directory of the cargo that started
/// us (`$CARGO`) added where missing.
fn kept_env(get: impl Fn(&str) -> Option<OsString>) -> Vec<(String, OsString)> {
    let mut vars: Vec<(String, OsString)> = Vec::new();
    let home = get("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    for key in KEPT {
        let value = get(key).or_else(|| {
            let default = match *key {
                "RUSTUP_HOME" => ".rustup",
                "CARGO_HOME" => ".cargo",
                _ => return None,
            };
            home.as_ref().map(|h| h.join(default).into_os_string())
        });
        if let Some(v) = value {
            vars.push((key.to_string(), v));
        }
    }

    let mut dirs: Vec<PathBuf> = env::split_paths(&get("PATH").unwrap_or_default()).collect();
    let cargo_bin = vars
        .iter()
        .find(|(k, _)| k == "CARGO_HOME")
        .map(|(_, v)| Path::new(v).join("bin"));
    let cargo_dir = get("CARGO").and_then(|c| Path::new(&c).parent().map(Path::to_path_buf));
    for dir in [cargo_bin, cargo_dir].into_iter().flatten() {
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    if let Ok(path) = env::join_paths(dirs) {
        vars.insert(0, ("PATH".to_string(), path));
    }
    vars
}

/// The first executable `name` in `path`'s directories (relative ones
/// skipped: they would mean something else in another directory).
fn find_in_path(name: &str, path: &OsStr) -> Option<PathBuf> {
    env::split_paths(path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

fn show(cmd: &Command) -> String {
    let mut words = vec![cmd.get_program().to_string_lossy().into_owned()];
    words.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    words.join(" ")
}

/// Of `cargo xtask test -- ARGS`, those cargo takes (up to the test
/// binaries' own `--`), so that the pre-build builds what the run will.
pub fn cargo_args_before_dashdash(args: &[OsString]) -> &[OsString] {
    let end = args
        .iter()
        .position(|a| a.as_bytes() == b"--")
        .unwrap_or(args.len());
    &args[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| OsString::from(v))
        }
    }

    fn words(cmd: &Command) -> Vec<String> {
        std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn homes_default_to_home_and_cargo_joins_path() {
        let vars = kept_env(env_of(&[
            ("HOME", "/home/ada"),
            ("PATH", "/usr/bin:/bin"),
            (
                "CARGO",
                "/home/ada/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/bin/cargo",
            ),
            ("RUSTUP_TOOLCHAIN", "stable-x86_64-unknown-linux-gnu"),
            ("SECRET", "not carried"),
        ]));
        let get = |k: &str| {
            vars.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
        };
        assert_eq!(get("RUSTUP_HOME").as_deref(), Some("/home/ada/.rustup"));
        assert_eq!(get("CARGO_HOME").as_deref(), Some("/home/ada/.cargo"));
        assert_eq!(
            get("RUSTUP_TOOLCHAIN").as_deref(),
            Some("stable-x86_64-unknown-linux-gnu")
        );
        assert_eq!(
            get("PATH").as_deref(),
            Some(
                "/usr/bin:/bin:/home/ada/.cargo/bin:\
                 /home/ada/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/bin"
            )
        );
        assert_eq!(get("SECRET"), None);
        assert_eq!(get("CARGO_TARGET_DIR"), None, "unset stays unset");
    }

    #[test]
    fn set_homes_are_kept_and_path_not_doubled() {
        let vars = kept_env(env_of(&[
            ("HOME", "/home/ada"),
            ("RUSTUP_HOME", "/opt/rustup"),
            ("CARGO_HOME", "/opt/cargo"),
            ("PATH", "/opt/cargo/bin:/usr/bin"),
            ("CARGO_TARGET_DIR", "/scratch/t"),
        ]));
        let all: Vec<String> = vars
            .iter()
            .map(|(k, v)| format!("{k}={}", v.to_string_lossy()))
            .collect();
        assert_eq!(
            all,
            [
                "PATH=/opt/cargo/bin:/usr/bin",
                "RUSTUP_HOME=/opt/rustup",
                "CARGO_HOME=/opt/cargo",
                "CARGO_TARGET_DIR=/scratch/t",
            ]
        );
    }

    #[test]
    fn the_rerun_is_sudo_env_vars_then_xtask_by_absolute_path() {
        let cmd = sudo_command(
            Path::new("/usr/bin/sudo"),
            Path::new("/usr/bin/env"),
            Path::new("/src/target/debug/xtask"),
            &["test".into(), "--no-lint".into(), "--".into(), "job".into()],
            &[
                ("PATH".into(), "/usr/bin:/home/ada/.cargo/bin".into()),
                ("RUSTUP_HOME".into(), "/home/ada/.rustup".into()),
            ],
        );
        assert_eq!(
            words(&cmd),
            [
                "/usr/bin/sudo",
                "--",
                "/usr/bin/env",
                "PATH=/usr/bin:/home/ada/.cargo/bin",
                "RUSTUP_HOME=/home/ada/.rustup",
                "XTASK_RERUN_UNDER_SUDO=1",
                "/src/target/debug/xtask",
                "test",
                "--no-lint",
                "--",
                "job",
            ]
        );
    }

    #[test]
    fn sudo_is_found_by_absolute_path_only() {
        let dir = std::env::temp_dir().join(format!("xtask-path-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("sudo");
        std::fs::write(&fake, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut path = OsString::from("relative/dir:");
        path.push(dir.as_os_str());
        assert_eq!(find_in_path("sudo", &path), Some(fake.clone()));
        // Not executable: not a candidate.
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(find_in_path("sudo", &path), None);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(find_in_path("sudo", OsStr::new("")), None);
    }

    #[test]
    fn test_args_up_to_the_test_binaries_own() {
        let args: Vec<OsString> = ["--test", "job", "--", "--nocapture"]
            .map(OsString::from)
            .to_vec();
        assert_eq!(
            cargo_args_before_dashdash(&args),
            &[OsString::from("--test"), OsString::from("job")]
        );
    }
}
