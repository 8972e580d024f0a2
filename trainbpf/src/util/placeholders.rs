//! Output path placeholders: `{host}`, `{rank}`, `{run_id}`, `{pid}` and
//! `{time}`, so that one command line run on every node (`srun trainbpf
//! record -o /shared/run/{host}.rec --events-jsonl /shared/run/{host}.jsonl
//! -- ...`) writes one file per node.
//!
//! `record -o` and `--events-jsonl` take all five, expanded once when the
//! recorder starts. The job has not started then, so `{rank}` and
//! `{run_id}` come from the recorder's own environment, which a launcher
//! (srun, a torchrun wrapper) set for it. `report --html`, `--perfetto`
//! and `--pprof` take what the recording says of itself: `{host}` (the
//! recorder's host; a merged report's recordings must share one) and
//! `{time}` (when it started; a merged report's earliest start). A
//! placeholder an output cannot know is an error before anything is read
//! or written, never a literal name that every node would share.
//!
//! Every value is reduced to `[A-Za-z0-9._-]`, never `.` or `..`: an
//! environment variable or a hostname cannot add a directory, climb out of
//! one or put a control character in a path. The expanded path is then
//! created exactly as before (util/safe_file.rs).

use std::{
    ffi::{OsStr, OsString},
    os::unix::ffi::{OsStrExt as _, OsStringExt as _},
    path::PathBuf,
};

/// The path an output flag names: which flag (for its errors), and which
/// placeholders it may use. `record`'s paths take all five, from the
/// recorder; `report`'s take only what a recording tells of itself: its
/// host and when it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// `record -o`.
    Recording,
    /// `record --events-jsonl`.
    EventsJsonl,
    /// `report --html`.
    Html,
    /// `report --perfetto`.
    Perfetto,
    /// `report --pprof`.
    Pprof,
}

impl Output {
    pub fn flag(self) -> &'static str {
        match self {
            Output::Recording => "-o",
            Output::EventsJsonl => "--events-jsonl",
            Output::Html => "--html",
            Output::Perfetto => "--perfetto",
            Output::Pprof => "--pprof",
        }
    }

    fn at_record(self) -> bool {
        matches!(self, Output::Recording | Output::EventsJsonl)
    }

    /// The placeholders this output knows, as its errors list them.
    fn known(self) -> &'static str {
        if self.at_record() {
            "{host}, {rank}, {run_id}, {pid}, {time}"
        } else {
            "{host}, {time}: the recording's"
        }
    }
}

/// A placeholder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Name {
    Host,
    Rank,
    RunId,
    Pid,
    Time,
}

impl Name {
    fn parse(name: &[u8]) -> Option<Name> {
        Some(match name {
            b"host" => Name::Host,
            b"rank" => Name::Rank,
            b"run_id" => Name::RunId,
            b"pid" => Name::Pid,
            b"time" => Name::Time,
            _ => return None,
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            Name::Host => "host",
            Name::Rank => "rank",
            Name::RunId => "run_id",
            Name::Pid => "pid",
            Name::Time => "time",
        }
    }

    /// Known when `report` writes: what the recording says of itself.
    fn at_report(self) -> bool {
        matches!(self, Name::Host | Name::Time)
    }
}

/// What the placeholders expand to, each value or why there is none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Values {
    pub host: Result<String, String>,
    /// `RANK`, else `SLURM_PROCID`.
    pub rank: Result<String, String>,
    /// `TORCHELASTIC_RUN_ID`, else `SLURM_JOB_ID`.
    pub run_id: Result<String, String>,
    pub pid: Result<u32, String>,
    /// Wall-clock ns since the epoch.
    pub realtime_ns: Result<u64, String>,
}

/// A value longer than this is cut: a file name stays well under NAME_MAX.
const MAX_VALUE: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlaceholderError {
    /// A name no output knows.
    #[error(
        "{flag} {path}: unknown placeholder {{{name}}} (known: {known}; write {{{{ and }}}} for literal braces)"
    )]
    Unknown {
        flag: &'static str,
        path: String,
        name: String,
        known: &'static str,
    },
    /// A name this output cannot know when it is written.
    #[error(
        "{flag} {path}: {{{name}}} is not known when `report` writes (it takes {known}); `record` expands it in -o and --events-jsonl"
    )]
    NotHere {
        flag: &'static str,
        path: String,
        name: &'static str,
        known: &'static str,
    },
    #[error("{flag} {path}: a '{{' without its '}}' (write {{{{ for a literal brace)")]
    Unclosed { flag: &'static str, path: String },
    #[error("{flag} {path}: a '}}' without its '{{' (write }}}} for a literal brace)")]
    Unopened { flag: &'static str, path: String },
    /// A name this output knows, with no value this time.
    #[error("{flag} {path}: {{{name}}} {why}")]
    Unset {
        flag: &'static str,
        path: String,
        name: &'static str,
        why: String,
    },
}

impl Values {
    /// This recorder's values: its host name, pid, clock and environment.
    pub fn detect() -> Values {
        let env = |names: &[&str]| from_env(names, &|n| std::env::var(n).ok());
        Values {
            host: Ok(nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default()),
            rank: env(&["RANK", "SLURM_PROCID"]),
            run_id: env(&["TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"]),
            pid: Ok(std::process::id()),
            realtime_ns: Ok(crate::util::clock::now(nix::time::ClockId::CLOCK_REALTIME)),
        }
    }

    /// A recording's values, for `report`'s outputs: its host, and the
    /// wall-clock time of its start (`None`: it holds no clock).
    pub fn of_recording(host: Result<String, String>, started_ns: Option<u64>) -> Values {
        let not_recorded = || "is the recorder's, not in the recording".to_string();
        Values {
            host,
            rank: Err(not_recorded()),
            run_id: Err(not_recorded()),
            pid: Err(not_recorded()),
            realtime_ns: started_ns.ok_or_else(|| "the recording holds no wall-clock time".into()),
        }
    }
}

/// The first of `names` set (and not empty) in an environment.
fn from_env(names: &[&str], get: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    names
        .iter()
        .find_map(|n| get(n).filter(|v| !v.is_empty()))
        .ok_or_else(|| {
            format!(
                "needs {} in trainbpf's environment, and none is set",
                names.join(" or ")
            )
        })
}

/// A path template, read.
enum Piece {
    Literal(u8),
    Placeholder(Name),
}

/// The pieces of `path` for `output`, checked before anything is read or
/// run: each placeholder known, and known to this output.
fn parse(output: Output, path: &OsStr) -> Result<Vec<Piece>, PlaceholderError> {
    let shown = || path.to_string_lossy().into_owned();
    let flag = output.flag();
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' if bytes.get(i + 1) == Some(&b'{') => {
                out.push(Piece::Literal(b'{'));
                i += 2;
            }
            b'}' if bytes.get(i + 1) == Some(&b'}') => {
                out.push(Piece::Literal(b'}'));
                i += 2;
            }
            b'}' => {
                return Err(PlaceholderError::Unopened {
                    flag,
                    path: shown(),
                });
            }
            b'{' => {
                let Some(len) = bytes[i + 1..].iter().position(|&b| b == b'}') else {
                    return Err(PlaceholderError::Unclosed {
                        flag,
                        path: shown(),
                    });
                };
                let raw = &bytes[i + 1..i + 1 + len];
                let Some(name) = Name::parse(raw) else {
                    return Err(PlaceholderError::Unknown {
                        flag,
                        path: shown(),
                        name: trainbpf_report::term::escape(&String::from_utf8_lossy(raw))
                            .into_owned(),
                        known: output.known(),
                    });
                };
                if !output.at_record() && !name.at_report() {
                    return Err(PlaceholderError::NotHere {
                        flag,
                        path: shown(),
                        name: name.as_str(),
                        known: output.known(),
                    });
                }
                out.push(Piece::Placeholder(name));
                i += len + 2;
            }
            b => {
                out.push(Piece::Literal(b));
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Checks `path`'s placeholders for `output` without expanding them: a
/// report's errors come before it reads its recordings.
pub fn check(output: Output, path: &OsStr) -> Result<(), PlaceholderError> {
    parse(output, path).map(|_| ())
}

/// `path` with its placeholders replaced; a path without any is returned
/// as it is.
pub fn expand(output: Output, path: &OsStr, v: &Values) -> Result<PathBuf, PlaceholderError> {
    let mut out = Vec::with_capacity(path.len());
    for p in parse(output, path)? {
        match p {
            Piece::Literal(b) => out.push(b),
            Piece::Placeholder(name) => {
                let value = value(name, v).map_err(|why| PlaceholderError::Unset {
                    flag: output.flag(),
                    path: path.to_string_lossy().into_owned(),
                    name: name.as_str(),
                    why,
                })?;
                out.extend_from_slice(sanitise(&value).as_bytes());
            }
        }
    }
    Ok(PathBuf::from(OsString::from_vec(out)))
}

fn value(name: Name, v: &Values) -> Result<String, String> {
    match name {
        Name::Host => v.host.clone(),
        Name::Rank => v.rank.clone(),
        Name::RunId => v.run_id.clone(),
        Name::Pid => v.pid.clone().map(|p| p.to_string()),
        Name::Time => v.realtime_ns.clone().map(time_stamp),
    }
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
    let t = trainbpf_report::render::rfc3339_ms(realtime_ns);
    let mut s: String = t[..19].chars().filter(|c| *c != '-' && *c != ':').collect();
    s.push('Z');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Values {
        Values {
            host: Ok("node2".into()),
            rank: Ok("3".into()),
            run_id: Ok("job-17".into()),
            pid: Ok(4242),
            // 2026-12-01T18:01:02.123Z
            realtime_ns: Ok(1_796_148_062_123_000_000),
        }
    }

    fn ex(p: &str, v: &Values) -> Result<String, PlaceholderError> {
        expand_for(Output::Recording, p, v)
    }

    fn expand_for(o: Output, p: &str, v: &Values) -> Result<String, PlaceholderError> {
        expand(o, OsStr::new(p), v).map(|p| p.to_string_lossy().into_owned())
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
            e.to_string()
                .starts_with("-o /tmp/{hostname}.rec: unknown placeholder {hostname}"),
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
        let none = |_: &str| None;
        let v = Values {
            rank: from_env(&["RANK", "SLURM_PROCID"], &none),
            run_id: from_env(&["TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"], &none),
            ..values()
        };
        let e = ex("{rank}.rec", &v).unwrap_err().to_string();
        assert!(e.contains("RANK or SLURM_PROCID"), "{e}");
        let e = ex("{run_id}.rec", &v).unwrap_err().to_string();
        assert!(e.contains("TORCHELASTIC_RUN_ID or SLURM_JOB_ID"), "{e}");
        // The first one set wins; an empty one counts as unset.
        let env = |n: &str| match n {
            "RANK" => Some(String::new()),
            "SLURM_PROCID" => Some("7".into()),
            _ => None,
        };
        assert_eq!(from_env(&["RANK", "SLURM_PROCID"], &env).unwrap(), "7");
    }

    #[test]
    fn each_error_names_its_flag() {
        let v = values();
        let e = expand_for(Output::EventsJsonl, "/d/{nope}.jsonl", &v).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--events-jsonl /d/{nope}.jsonl: unknown placeholder {nope}"),
            "{e}"
        );
        assert_eq!(
            expand_for(Output::EventsJsonl, "/d/{host}-{rank}.jsonl", &v).unwrap(),
            "/d/node2-3.jsonl"
        );
        let e = expand_for(Output::Pprof, "/d/{host.pb.gz", &v).unwrap_err();
        assert!(
            e.to_string().starts_with("--pprof /d/{host.pb.gz: a '{'"),
            "{e}"
        );
        assert!(
            check(Output::Html, OsStr::new("/d/}.html"))
                .unwrap_err()
                .to_string()
                .starts_with("--html /d/}.html: a '}'")
        );
    }

    #[test]
    fn report_outputs_take_the_recordings_host_and_time_only() {
        let v = Values::of_recording(Ok("node7".into()), Some(1_796_148_062_123_000_000));
        for o in [Output::Html, Output::Perfetto, Output::Pprof] {
            assert_eq!(
                expand_for(o, "/d/{host}-{time}.out", &v).unwrap(),
                "/d/node7-20261201T180102Z.out"
            );
            for name in ["rank", "run_id", "pid"] {
                let p = format!("/d/{{{name}}}.out");
                let e = check(o, OsStr::new(&p)).unwrap_err();
                assert_eq!(
                    e,
                    PlaceholderError::NotHere {
                        flag: o.flag(),
                        path: p.clone(),
                        name: Name::parse(name.as_bytes()).unwrap().as_str(),
                        known: "{host}, {time}: the recording's",
                    }
                );
                assert!(
                    e.to_string().contains("not known when `report` writes"),
                    "{e}"
                );
            }
        }
        // A merged report of two hosts has no one host; a recording
        // without a clock has no time.
        let v = Values::of_recording(Err("names 2 hosts (a, b)".into()), None);
        let e = expand_for(Output::Html, "{host}.html", &v).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--html {host}.html: {host} names 2 hosts (a, b)"
        );
        let e = expand_for(Output::Html, "{time}.html", &v).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("the recording holds no wall-clock time"),
            "{e}"
        );
        // No placeholder: the path as given.
        assert_eq!(
            expand_for(Output::Html, "/d/plain.html", &v).unwrap(),
            "/d/plain.html"
        );
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
                host: Ok(hostile.into()),
                rank: Ok(hostile.into()),
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
            host: Ok(long),
            ..values()
        };
        assert_eq!(ex("{host}", &v).unwrap().len(), MAX_VALUE);
    }

    #[test]
    fn a_non_utf8_template_keeps_its_bytes() {
        let p = OsStr::from_bytes(b"/d/\xff{pid}");
        let got = expand(Output::Recording, p, &values()).unwrap();
        assert_eq!(got.as_os_str().as_bytes(), b"/d/\xff4242");
    }
}
