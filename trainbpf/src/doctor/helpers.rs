//! The `helpers` check: what `record`, as root, would run and load, and
//! what the environment named that root refuses (see [`crate::util::trust`]).

use std::path::{Path, PathBuf};

use super::{Check, Status, check};
use crate::util::trust;

/// Helper programs and NVML as [`crate::util::trust`] finds them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HelperFacts {
    /// The `ldconfig` record runs to find `libcuda.so*`.
    pub ldconfig: Option<PathBuf>,
    /// The NVML library record would load, and how it was found.
    pub nvml: Option<(PathBuf, &'static str)>,
    /// Files the environment named that root will not use, said in full.
    pub refused: Vec<String>,
}

pub fn gather() -> HelperFacts {
    let lib = trust::nvml_library();
    HelperFacts {
        ldconfig: trust::program("ldconfig"),
        nvml: lib.path.map(|p| (p, lib.found_by)),
        refused: lib.refused.iter().map(ToString::to_string).collect(),
    }
}

/// `smi`: the nvidia-smi the `nvidia` check found.
pub fn check_helpers(h: &HelperFacts, smi: Option<&Path>) -> Check {
    let path = |p: Option<&Path>| p.map_or("none".to_string(), |p| p.display().to_string());
    let nvml = match &h.nvml {
        Some((p, how)) => format!("NVML {} (found by {how})", p.display()),
        None => "no NVML library".to_string(),
    };
    let why = "as root, `record` runs helpers from the system directories only, never \
               through PATH, and loads a library the environment names only when root alone \
               can change the file and every directory above it";
    if h.refused.is_empty() {
        return check(
            "helpers",
            Status::Ok,
            "trusted",
            format!(
                "by absolute path: ldconfig {}, nvidia-smi {}; {nvml}",
                path(h.ldconfig.as_deref()),
                path(smi)
            ),
            why,
            "",
        );
    }
    check(
        "helpers",
        Status::Warn,
        "refused",
        format!(
            "{}; record uses {}",
            h.refused.join("; "),
            match &h.nvml {
                Some(_) => nvml,
                None => "no NVML".into(),
            }
        ),
        why,
        "give the file and each directory above it to root, writable by root alone \
         (chown root:root, chmod go-w), or unset the variable",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_override_is_a_warning_that_names_it() {
        let h = HelperFacts {
            ldconfig: Some("/usr/sbin/ldconfig".into()),
            nvml: None,
            refused: vec![
                "TRAINBPF_LIBNVML names /tmp/u/libnvidia-ml.so.1, which root will not load: \
                 /tmp/u is owned by uid 1000, not root"
                    .into(),
            ],
        };
        let c = check_helpers(&h, None);
        assert_eq!((c.status, c.state.as_str()), (Status::Warn, "refused"));
        assert!(
            c.finding.starts_with("TRAINBPF_LIBNVML names /tmp/u/"),
            "{c:?}"
        );
        assert!(c.finding.ends_with("record uses no NVML"), "{c:?}");

        let fine = check_helpers(
            &HelperFacts {
                refused: vec![],
                ..h
            },
            Some(Path::new("/usr/bin/nvidia-smi")),
        );
        assert_eq!(fine.state, "trusted");
        assert_eq!(
            fine.finding,
            "by absolute path: ldconfig /usr/sbin/ldconfig, nvidia-smi /usr/bin/nvidia-smi; no NVML library"
        );
    }
}
