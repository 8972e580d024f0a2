//! Who ran trainbpf: the user behind `sudo`, as whom the job runs and every
//! file is created and opened.

use std::ffi::OsStr;

use nix::unistd::{Gid, Uid};

/// `SUDO_UID`/`SUDO_GID` are not a pair of numbers: falling back to our
/// own ids would run the job as root.
#[derive(Debug, thiserror::Error)]
#[error(
    "{0}; sudo sets both SUDO_UID and SUDO_GID: unset both to run the job as yourself, or set both to run it as that user"
)]
pub struct SudoError(String);

/// Who the job runs as: the user who ran `sudo`, or whoever we are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invoker {
    pub uid: u32,
    pub gid: u32,
}

impl Invoker {
    /// `SUDO_UID`/`SUDO_GID` when set by sudo, else our own real ids. One
    /// without the other, or one that is not a number, is an error: falling
    /// back to our own ids would run the job as root.
    pub fn detect() -> Result<Invoker, SudoError> {
        Self::from_env(
            std::env::var_os("SUDO_UID").as_deref(),
            std::env::var_os("SUDO_GID").as_deref(),
        )
    }

    fn from_env(uid: Option<&OsStr>, gid: Option<&OsStr>) -> Result<Invoker, SudoError> {
        let id = |k: &str, v: &OsStr| {
            v.to_str()
                .and_then(|s| s.parse::<u32>().ok())
                .ok_or_else(|| SudoError(format!("{k}={v:?} is not a numeric id")))
        };
        match (uid, gid) {
            (None, None) => Ok(Invoker {
                uid: Uid::current().as_raw(),
                gid: Gid::current().as_raw(),
            }),
            (Some(u), Some(g)) => Ok(Invoker {
                uid: id("SUDO_UID", u)?,
                gid: id("SUDO_GID", g)?,
            }),
            (Some(_), None) => Err(SudoError("SUDO_UID is set without SUDO_GID".into())),
            (None, Some(_)) => Err(SudoError("SUDO_GID is set without SUDO_UID".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    #[test]
    fn sudo_ids_come_in_pairs() {
        let s = |v: &str| Some(OsStr::new(v).to_owned());
        let inv = |u: Option<OsString>, g: Option<OsString>| {
            Invoker::from_env(u.as_deref(), g.as_deref())
        };
        assert_eq!(
            inv(s("1000"), s("100")).unwrap(),
            Invoker {
                uid: 1000,
                gid: 100
            }
        );
        let e = inv(s("1000"), None).unwrap_err().to_string();
        assert!(e.contains("SUDO_UID is set without SUDO_GID"), "{e}");
        assert!(inv(None, s("100")).is_err());
        let e = inv(s("alice"), s("100")).unwrap_err().to_string();
        assert!(e.contains("not a numeric id"), "{e}");
        assert!(inv(s("1000"), s("")).is_err());
        assert_eq!(inv(None, None).unwrap().uid, Uid::current().as_raw());
    }
}
