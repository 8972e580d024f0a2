//! `record -o` placeholders: `{host}`, `{rank}`, `{run_id}`, `{pid}` and
//! `{time}`, so that one command line run on every node (`srun trainbpf
//! record -o /shared/run/{host}.rec -- ...`) writes one file per node.
//!
//! The job has not started when the file is created, so `{rank}` and
//! `{run_id}` come from the recorder's own environment, which a launcher
//! (srun, a torchrun wrapper) set for it. Every value is reduced to
//! `[A-Za-z0-9._-]`, never `.` or `..`: an environment variable or a
//! hostname cannot add a directory, climb out of one or put a control
//! character in a path. The expanded path is then created exactly as
//! before (src/safe_file.rs).

use std::{
    ffi::{OsStr, OsString},
    os::unix::ffi::{OsStrExt as _, OsStringExt as _},
    path::PathBuf,
};

/// What the placeholders expand to on this run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Values {
    pub host: String,
    /// `RANK`, else `SLURM_PROCID`.
    pub rank: Option<String>,
    /// `TORCHELASTIC_RUN_ID`, else `SLURM_JOB_ID`.
    pub run_id: Option<String>,
    pub pid: u32,
    /// Wall-clock ns since the epoch.
    pub realtime_ns: u64,
}

/// A value longer than this is cut: a file name stays well under NAME_MAX.
const MAX_VALUE: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlaceholderError {
    #[error(
        "-o {path}: unknown placeholder {{{name}}} (known: {{host}}, {{rank}}, {{run_id}}, {{pid}}, {{time}}; write {{{{ and }}}} for literal braces)"
    )]
    Unknown { path: String, name: String },
    #[error("-o {path}: a '{{' without its '}}' (write {{{{ for a literal brace)")]
    Unclosed { path: String },
    #[error("-o {path}: a '}}' without its '{{' (write }}}} for a literal brace)")]
    Unopened { path: String },
    #[error("-o {path}: {{{name}}} needs {vars} in trainbpf's environment, and none is set")]
    Unset {
        path: String,
        name: &'static str,
        vars: &'static str,
    },
}

impl Values {
    /// This recorder's values: its host name, pid, clock and environment.
    pub fn detect() -> Values {
        let env = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
        };
        Values {
            host: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            rank: env(&["RANK", "SLURM_PROCID"]),
            run_id: env(&["TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"]),
            pid: std::process::id(),
            realtime_ns: crate::record::now(nix::time::ClockId::CLOCK_REALTIME),
        }
    }
}

/// `path` with its placeholders replaced; a path without any is returned
/// as it is.
pub fn expand(path: &OsStr, v: &Values) -> Result<PathBuf, PlaceholderError> {
    let shown = || path.to_string_lossy().into_owned();
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' if bytes.get(i + 1) == Some(&b'{') => {
                out.push(b'{');
                i += 2;
            }
            b'}' if bytes.get(i + 1) == Some(&b'}') => {
                out.push(b'}');
                i += 2;
            }
            b'}' => return Err(PlaceholderError::Unopened { path: shown() }),
            b'{' => {
                let Some(len) = bytes[i + 1..].iter().position(|&b| b == b'}') else {
                    return Err(PlaceholderError::Unclosed { path: shown() });
                };
                let name = &bytes[i + 1..i + 1 + len];
                out.extend_from_slice(sanitise(&value(name, v, &shown)?).as_bytes());
                i += len + 2;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(PathBuf::from(OsString::from_vec(out)))
}

fn value(name: &[u8], v: &Values, shown: &dyn Fn() -> String) -> Result<String, PlaceholderError> {
    let unset = |name, vars| PlaceholderError::Unset {
        path: shown(),
        name,
        vars,
    };
    Ok(match name {
        b"host" => v.host.clone(),
        b"pid" => v.pid.to_string(),
        b"time" => time_stamp(v.realtime_ns),
        b"rank" => v
            .rank
            .clone()
            .ok_or_else(|| unset("rank", "RANK or SLURM_PROCID"))?,
        b"run_id" => v
            .run_id
            .clone()
            .ok_or_else(|| unset("run_id", "TORCHELASTIC_RUN_ID or SLURM_JOB_ID"))?,
        other => {
            return Err(PlaceholderError::Unknown {
                path: shown(),
                name: crate::term::escape(&String::from_utf8_lossy(other)).into_owned(),
            });
        }
    })
}

/// One path component's worth of a value: `[A-Za-z0-9._-]` only, other
/// characters (`/`, control characters, spaces, non-ASCII) as `_`, no
/// leading dot (so never `.`, `..` or a hidden file), never empty.
pub fn sanitise(value: &str) -> String {
    let mut s: String = value
        .chars()
        .take(MAX_VALUE)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.starts_with('.') {
        s.replace_range(0..1, "_");
    }
    if s.is_empty() {
        s.push('_');
    }
    s
}

/// `20261201T180102Z`: UTC to the second, no `:` (awkward in paths, on
/// some filesystems refused).
fn time_stamp(realtime_ns: u64) -> String {
    // "2026-12-01T18:01:02.123Z" → "20261201T180102Z"
    let t = crate::render::rfc3339_ms(realtime_ns);
    let mut s: String = t[..19].chars().filter(|c| *c != '-' && *c != ':').collect();
    s.push('Z');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Values {
        Values {
            host: "node2".into(),
            rank: Some("3".into()),
            run_id: Some("job-17".into()),
            pid: 4242,
            // 2026-12-01T18:01:02.123Z
            realtime_ns: 1_796_148_062_123_000_000,
        }
    }

    fn ex(p: &str, v: &Values) -> Result<String, PlaceholderError> {
        expand(OsStr::new(p), v).map(|p| p.to_string_lossy().into_owned())
    }

    #[test]
    fn each_placeholder_expands() {
        let v = values();
        assert_eq!(
            ex("/shared/run/{host}.rec", &v).unwrap(),
            "/shared/run/node2.rec"
        );
        assert_eq!(
            ex("r{rank}-{run_id}-{pid}-{time}.rec", &v).unwrap(),
            "r3-job-17-4242-20261201T180102Z.rec"
        );
        assert_eq!(ex("plain.rec", &v).unwrap(), "plain.rec");
        assert_eq!(ex("{{host}}.rec", &v).unwrap(), "{host}.rec");
    }

    #[test]
    fn unknown_and_malformed_placeholders_are_errors() {
        let v = values();
        let e = ex("/tmp/{hostname}.rec", &v).unwrap_err();
        assert!(matches!(&e, PlaceholderError::Unknown { name, .. } if name == "hostname"));
        assert!(
            e.to_string().contains("unknown placeholder {hostname}"),
            "{e}"
        );
        assert!(matches!(
            ex("/tmp/{host.rec", &v),
            Err(PlaceholderError::Unclosed { .. })
        ));
        assert!(matches!(
            ex("/tmp/host}.rec", &v),
            Err(PlaceholderError::Unopened { .. })
        ));
    }

    #[test]
    fn an_unset_rank_is_an_error_naming_the_variables() {
        let v = Values {
            rank: None,
            run_id: None,
            ..values()
        };
        let e = ex("{rank}.rec", &v).unwrap_err().to_string();
        assert!(e.contains("RANK or SLURM_PROCID"), "{e}");
        let e = ex("{run_id}.rec", &v).unwrap_err().to_string();
        assert!(e.contains("TORCHELASTIC_RUN_ID or SLURM_JOB_ID"), "{e}");
    }

    #[test]
    fn hostile_values_stay_one_plain_component() {
        for (hostile, want) in [
            ("..", "_."),
            (".", "_"),
            ("", "_"),
            ("../../etc/passwd", "_._.._etc_passwd"),
            ("a/b", "a_b"),
            ("x\u{1b}[31my\n", "x__31my_"),
            (".hidden", "_hidden"),
            ("nöde 1", "n_de_1"),
        ] {
            let v = Values {
                host: hostile.into(),
                rank: Some(hostile.into()),
                ..values()
            };
            let got = ex("/d/{host}", &v).unwrap();
            assert_eq!(got, format!("/d/{want}"), "{hostile:?}");
            let p = PathBuf::from(ex("/d/{rank}.rec", &v).unwrap());
            assert_eq!(p.parent(), Some(std::path::Path::new("/d")), "{hostile:?}");
            assert!(
                !p.components()
                    .any(|c| matches!(c, std::path::Component::ParentDir)),
                "{hostile:?}"
            );
        }
        let long = "a".repeat(1000);
        let v = Values {
            host: long,
            ..values()
        };
        assert_eq!(ex("{host}", &v).unwrap().len(), MAX_VALUE);
    }

    #[test]
    fn a_non_utf8_template_keeps_its_bytes() {
        let p = OsStr::from_bytes(b"/d/\xff{pid}");
        let got = expand(p, &values()).unwrap();
        assert_eq!(got.as_os_str().as_bytes(), b"/d/\xff4242");
    }
}
