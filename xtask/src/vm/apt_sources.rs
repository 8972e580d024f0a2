//! The Debian archive this machine already uses, read from its own apt
//! sources, so that the project itself never names a mirror: the VM runner
//! fetches other suites' kernels from wherever the machine gets its
//! packages (a local mirror, a proxy, a corporate cache).
//!
//! apt reads `/etc/apt/sources.list` and `/etc/apt/sources.list.d/*.list`
//! (one-line format) and `/etc/apt/sources.list.d/*.sources` (deb822); other
//! names in that directory (`*.disabled`, `*.save`) are ignored, as by apt.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

/// One binary-package (`deb`) entry: its URIs and suites, and where it
/// came from, to name in messages.
#[derive(Debug, PartialEq, Eq)]
pub struct Source {
    pub uris: Vec<String>,
    pub suites: Vec<String>,
    pub origin: String,
}

/// Debian's code names and archive names: a source whose suite (less any
/// `-updates`, `-security` or `-backports`) is one of these is Debian's
/// archive, which also serves the other suites. A source of another
/// distribution or vendor (Ubuntu, a vendor's repository) is skipped.
const DEBIAN_SUITES: &[&str] = &[
    "buster",
    "bullseye",
    "bookworm",
    "trixie",
    "forky",
    "duke",
    "sid",
    "oldoldstable",
    "oldstable",
    "stable",
    "testing",
    "unstable",
];

/// The first Debian archive among the machine's sources, less security
/// archives (which hold only `*-security`), as (URI, where it was read).
pub fn debian_mirror(sources: &[Source]) -> Option<(String, String)> {
    sources
        .iter()
        .filter(|s| s.suites.iter().any(|suite| is_debian_suite(suite)))
        .flat_map(|s| s.uris.iter().map(move |u| (u, &s.origin)))
        .find(|(u, _)| !u.is_empty())
        .map(|(u, origin)| (u.trim_end_matches('/').to_string(), origin.clone()))
}

/// `bookworm`, `bookworm-updates`, `stable-backports`; not
/// `bookworm-security` (another archive) nor a vendor's `stable-vendor`.
fn is_debian_suite(suite: &str) -> bool {
    let base = [
        "-updates",
        "-backports-sloppy",
        "-backports",
        "-proposed-updates",
    ]
    .iter()
    .find_map(|s| suite.strip_suffix(s))
    .unwrap_or(suite);
    DEBIAN_SUITES.contains(&base)
}

/// Every `deb` entry in the machine's apt sources, in apt's order.
pub fn machine_sources() -> Result<Vec<Source>> {
    sources_in(Path::new("/etc/apt"))
}

fn sources_in(etc_apt: &Path) -> Result<Vec<Source>> {
    let mut files = vec![etc_apt.join("sources.list")];
    let parts = etc_apt.join("sources.list.d");
    let mut names: Vec<PathBuf> = match fs::read_dir(&parts) {
        Ok(dir) => dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "list" || e == "sources"))
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    files.extend(names);

    let mut sources = Vec::new();
    for file in files {
        let text = match fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
        };
        let origin = file.display().to_string();
        if file.extension().is_some_and(|e| e == "sources") {
            sources.extend(parse_deb822(&text, &origin)?);
        } else {
            sources.extend(parse_one_line(&text, &origin));
        }
    }
    Ok(sources)
}

/// The one-line format: `deb [opt=value …] URI suite [component …]`.
/// A `#` starts a comment; `deb-src` lines are not binary sources.
pub fn parse_one_line(text: &str, origin: &str) -> Vec<Source> {
    let mut sources = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        let Some(rest) = line.strip_prefix("deb") else {
            continue;
        };
        // `deb` followed by a blank, not `deb-src`.
        if !rest.starts_with([' ', '\t']) {
            continue;
        }
        let mut rest = rest.trim_start();
        if let Some(options) = rest.strip_prefix('[') {
            // Options may hold blanks (`[ arch=amd64 ]`); they end at `]`.
            let Some(end) = options.find(']') else {
                continue;
            };
            rest = &options[end + 1..];
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        sources.push(Source {
            uris: vec![uri.to_string()],
            suites: vec![suite.to_string()],
            origin: format!("{origin}:{}", n + 1),
        });
    }
    sources
}

/// deb822: stanzas separated by blank lines, `Field: value` with
/// continuation lines indented, `#` lines as comments; field names are
/// case-insensitive. A stanza with `Enabled: no` is skipped, as by apt.
pub fn parse_deb822(text: &str, origin: &str) -> Result<Vec<Source>> {
    let mut sources = Vec::new();
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut first_line = 1;
    let mut finish = |fields: &mut Vec<(String, String)>, line: usize| {
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let enabled = get("Enabled").first().is_none_or(|v| v != "no");
        if enabled && get("Types").iter().any(|t| t == "deb") {
            sources.push(Source {
                uris: get("URIs"),
                suites: get("Suites"),
                origin: format!("{origin}:{line}"),
            });
        }
        fields.clear();
    };
    for (n, line) in text.lines().enumerate() {
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            if !fields.is_empty() {
                finish(&mut fields, first_line);
            }
            continue;
        }
        if fields.is_empty() {
            first_line = n + 1;
        }
        if line.starts_with([' ', '\t']) {
            let Some((_, value)) = fields.last_mut() else {
                bail!("{origin}:{}: a continuation line starts a stanza", n + 1);
            };
            value.push(' ');
            value.push_str(line.trim());
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            bail!("{origin}:{}: not a `Field: value` line: {line:?}", n + 1);
        };
        fields.push((name.trim().to_string(), value.trim().to_string()));
    }
    if !fields.is_empty() {
        finish(&mut fields, first_line);
    }
    Ok(sources)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Fixtures name example.org and example.net only: the project names no
    // real mirror.
    const DEB822: &str = "\
Types: deb
# a snapshot we once used
URIs: http://mirror.example.org/debian/ http://other.example.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

types: deb deb-src
uris: http://mirror.example.org/debian-security
suites: bookworm-security
components: main

Types: deb-src
URIs: http://src.example.org/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://off.example.org/debian
Suites: trixie
Components: main
Enabled: no

Types: deb
URIs:
 http://cont.example.net/debian
Suites: trixie
Components: main
";

    #[test]
    fn deb822_stanzas_with_comments_and_several_uris() {
        let s = parse_deb822(DEB822, "d.sources").unwrap();
        assert_eq!(s.len(), 3, "{s:#?}");
        assert_eq!(
            s[0],
            Source {
                uris: vec![
                    "http://mirror.example.org/debian/".into(),
                    "http://other.example.org/debian".into()
                ],
                suites: vec!["bookworm".into(), "bookworm-updates".into()],
                origin: "d.sources:1".into(),
            }
        );
        assert_eq!(s[1].uris, ["http://mirror.example.org/debian-security"]);
        assert_eq!(s[1].origin, "d.sources:8");
        // A value on a continuation line.
        assert_eq!(s[2].uris, ["http://cont.example.net/debian"]);
        assert_eq!(
            debian_mirror(&s),
            Some((
                "http://mirror.example.org/debian".into(),
                "d.sources:1".into()
            ))
        );
    }

    #[test]
    fn deb822_security_alone_is_no_mirror() {
        let s = parse_deb822(
            "Types: deb\nURIs: http://mirror.example.org/debian-security\n\
             Suites: bookworm-security\nComponents: main\n",
            "s.sources",
        )
        .unwrap();
        assert_eq!(debian_mirror(&s), None);
    }

    #[test]
    fn deb822_garbage_is_an_error_naming_the_line() {
        let err = parse_deb822("Types: deb\nthis is not a field\n", "x.sources").unwrap_err();
        assert!(err.to_string().contains("x.sources:2"), "{err}");
    }

    const ONE_LINE: &str = "\
# deb http://commented.example.org/debian bookworm main
deb-src http://src.example.org/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/vendor.gpg] https://vendor.example.net/apt stable-vendor main
deb [ arch=amd64 ] http://mirror.example.org/debian/ bookworm main contrib # the main one
deb\thttp://mirror.example.org/debian-security bookworm-security main
debian-is-not-a-type http://bad.example.org/debian bookworm main
deb http://second.example.org/debian bookworm-updates main
";

    #[test]
    fn one_line_entries_with_options_and_comments() {
        let s = parse_one_line(ONE_LINE, "sources.list");
        let uris: Vec<_> = s.iter().map(|s| s.uris[0].as_str()).collect();
        assert_eq!(
            uris,
            [
                "https://vendor.example.net/apt",
                "http://mirror.example.org/debian/",
                "http://mirror.example.org/debian-security",
                "http://second.example.org/debian",
            ]
        );
        assert_eq!(s[1].suites, ["bookworm"]);
        assert_eq!(s[1].origin, "sources.list:4");
        // The vendor comes first, but "stable-vendor" is no Debian suite.
        assert_eq!(
            debian_mirror(&s).map(|m| m.0),
            Some("http://mirror.example.org/debian".into())
        );
    }

    #[test]
    fn files_are_read_as_apt_does() {
        let dir = std::env::temp_dir().join(format!("xtask-apt-{}", std::process::id()));
        let d = dir.join("sources.list.d");
        fs::create_dir_all(&d).unwrap();
        fs::write(
            d.join("a.list.disabled"),
            "deb http://disabled.example.org/debian bookworm main\n",
        )
        .unwrap();
        fs::write(
            d.join("b.list"),
            "deb http://ubuntu.example.org/ubuntu noble main\n",
        )
        .unwrap();
        fs::write(
            d.join("c.sources"),
            "Types: deb\nURIs: http://mirror.example.org/debian\nSuites: trixie\n",
        )
        .unwrap();
        let s = sources_in(&dir).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        let uris: Vec<_> = s.iter().map(|s| s.uris[0].as_str()).collect();
        assert_eq!(
            uris,
            [
                "http://ubuntu.example.org/ubuntu",
                "http://mirror.example.org/debian"
            ]
        );
        let (mirror, origin) = debian_mirror(&s).unwrap();
        assert_eq!(mirror, "http://mirror.example.org/debian");
        assert!(origin.ends_with("sources.list.d/c.sources:1"), "{origin}");
    }
}
