//! The `nvidia` check: the kernel driver's and nvidia-smi's versions, and
//! what they let trainbpf see of the GPU.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{Check, Status, check, read};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvidiaFacts {
    /// `/proc/driver/nvidia/version`: present only with the kernel driver.
    pub proc_version: Option<String>,
    /// `nvidia-smi` found in a system directory (never through PATH: doctor
    /// may run as root).
    pub smi: Option<PathBuf>,
    /// `nvidia-smi --query-gpu=driver_version --format=csv,noheader`.
    pub smi_driver: Option<Result<String, String>>,
    /// Plain `nvidia-smi`, whose header names the CUDA version.
    pub smi_header: Option<Result<String, String>>,
}

/// A driver version from `/proc/driver/nvidia/version`, e.g. `NVRM version:
/// NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 ...` (or `Open
/// Kernel Module for x86_64`): the first word shaped like a version.
pub fn nvidia_proc_version(text: &str) -> Option<&str> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace().find(|w| {
        w.contains('.')
            && w.split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
    })
}

/// `CUDA Version: 12.4` from nvidia-smi's header.
pub fn cuda_version(smi: &str) -> Option<&str> {
    let i = smi.find("CUDA Version:")? + "CUDA Version:".len();
    smi[i..].split_whitespace().next().filter(|v| *v != "N/A")
}

pub fn check_nvidia(n: &NvidiaFacts) -> Check {
    let id = "nvidia";
    let why = "GPU jobs die of host OOM as often as of GPU OOM (pinned memory, DataLoader copies); the driver version decides what trainbpf can see of the GPU (driver 575.51.02+ has the nvidia:nvidia_dev_xid tracepoint)";
    let kmod = n.proc_version.as_deref().and_then(nvidia_proc_version);
    let smi_driver = match &n.smi_driver {
        Some(Ok(s)) => s.lines().next().map(str::trim).filter(|s| !s.is_empty()),
        _ => None,
    };
    let gpus = match &n.smi_driver {
        Some(Ok(s)) => s.lines().filter(|l| !l.trim().is_empty()).count(),
        _ => 0,
    };
    let cuda = match &n.smi_header {
        Some(Ok(h)) => cuda_version(h),
        _ => None,
    };
    match (kmod, &n.smi) {
        (None, None) => check(
            id,
            Status::Info,
            "absent",
            "no NVIDIA driver (/proc/driver/nvidia/version missing, no nvidia-smi in the system directories)",
            why,
            "",
        ),
        (None, Some(smi)) => check(
            id,
            Status::Warn,
            "no_driver",
            format!(
                "{} is installed but the kernel driver is not loaded (/proc/driver/nvidia/version missing){}",
                smi.display(),
                match &n.smi_driver {
                    Some(Err(e)) => format!("; nvidia-smi: {e}"),
                    _ => String::new(),
                }
            ),
            why,
            "load the driver (modprobe nvidia) or, in a container, run with the GPU runtime (--gpus all)",
        ),
        (Some(k), None) => check(
            id,
            Status::Warn,
            "no_smi",
            format!("kernel driver {k} loaded; nvidia-smi not in the system directories"),
            why,
            "install the driver's utilities (nvidia-utils) to query GPUs and the supported CUDA version",
        ),
        (Some(k), Some(_)) => {
            let mismatch = smi_driver.is_some_and(|s| s != k);
            let mut finding = format!("kernel driver {k}");
            match (smi_driver, &n.smi_driver) {
                (Some(s), _) => {
                    finding.push_str(&format!("; nvidia-smi: driver {s}, {gpus} GPU(s)"))
                }
                (None, Some(Err(e))) => finding.push_str(&format!("; nvidia-smi failed: {e}")),
                _ => finding.push_str("; nvidia-smi gave no driver version"),
            }
            finding.push_str(&match cuda {
                Some(c) => format!("; supports CUDA up to {c}"),
                None => "; CUDA version unknown".into(),
            });
            let failed = smi_driver.is_none();
            check(
                id,
                if mismatch || failed {
                    Status::Warn
                } else {
                    Status::Ok
                },
                if mismatch { "mismatch" } else { "present" },
                finding,
                why,
                if mismatch {
                    "the loaded kernel module and the user-space driver differ (an upgrade without reboot): reboot or reload the module"
                } else if failed {
                    "nvidia-smi could not talk to the driver: check `nvidia-smi` by hand and dmesg for NVRM errors"
                } else {
                    ""
                },
            )
        }
    }
}

pub(super) fn gather_nvidia() -> NvidiaFacts {
    // Not through PATH: as root that would run whatever the user's PATH
    // names first.
    let smi = crate::util::trust::program("nvidia-smi");
    // nvidia-smi can hang for a long time on a GPU in a bad state: bound it.
    let timeout = Duration::from_secs(10);
    let smi_driver = smi.as_ref().map(|p| {
        run_bounded(
            p,
            &["--query-gpu=driver_version", "--format=csv,noheader"],
            timeout,
        )
    });
    let smi_header = smi.as_ref().map(|p| run_bounded(p, &[], timeout));
    NvidiaFacts {
        proc_version: read("/proc/driver/nvidia/version"),
        smi,
        smi_driver,
        smi_header,
    }
}

/// Runs a command and returns its stdout, or why not (exit status with the
/// first stderr line, or a timeout, after which the child is killed).
fn run_bounded(prog: &Path, args: &[&str], timeout: Duration) -> Result<String, String> {
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    // Drain stdout on a thread so a full pipe can't stall the child.
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = stdout.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {}s", timeout.as_secs()));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let out = reader.join().unwrap_or_default();
    if status.success() {
        Ok(out)
    } else {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        // nvidia-smi prints its errors ("NVIDIA-SMI has failed ...") on stdout.
        let msg = [err.as_str(), out.as_str()]
            .iter()
            .find_map(|t| t.lines().map(str::trim).find(|l| !l.is_empty()))
            .unwrap_or("")
            .to_string();
        Err(format!("{status}: {msg}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_NVIDIA: &str = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
    const PROC_NVIDIA_OPEN: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Mar 20 09:59:12 UTC 2025\n";
    const SMI_HEADER: &str = "Mon Nov 30 06:00:00 2026\n+-----------------------------------------------------------------------------------------+\n| NVIDIA-SMI 550.54.14              Driver Version: 550.54.14      CUDA Version: 12.4     |\n";

    #[test]
    fn nvidia_versions() {
        assert_eq!(nvidia_proc_version(PROC_NVIDIA), Some("550.54.14"));
        assert_eq!(nvidia_proc_version(PROC_NVIDIA_OPEN), Some("570.133.20"));
        assert_eq!(
            nvidia_proc_version(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  555.58  Release Build  (portage@localhost)"
            ),
            Some("555.58")
        );
        assert_eq!(cuda_version(SMI_HEADER), Some("12.4"));
        assert_eq!(cuda_version("CUDA Version: N/A |"), None);
    }

    #[test]
    fn nvidia_checks() {
        let c = check_nvidia(&NvidiaFacts::default());
        assert_eq!((c.state.as_str(), c.status), ("absent", Status::Info));
        assert!(c.finding.starts_with("no NVIDIA driver"));
        let full = NvidiaFacts {
            proc_version: Some(PROC_NVIDIA.into()),
            smi: Some("/usr/bin/nvidia-smi".into()),
            smi_driver: Some(Ok("550.54.14\n550.54.14\n".into())),
            smi_header: Some(Ok(SMI_HEADER.into())),
        };
        let c = check_nvidia(&full);
        assert_eq!((c.state.as_str(), c.status), ("present", Status::Ok));
        assert_eq!(
            c.finding,
            "kernel driver 550.54.14; nvidia-smi: driver 550.54.14, 2 GPU(s); supports CUDA up to 12.4"
        );
        let upgraded = NvidiaFacts {
            smi_driver: Some(Ok("555.42.02\n".into())),
            ..full.clone()
        };
        assert_eq!(check_nvidia(&upgraded).state, "mismatch");
        let broken = NvidiaFacts {
            smi_driver: Some(Err("exit status: 9: NVIDIA-SMI has failed".into())),
            smi_header: None,
            ..full.clone()
        };
        let c = check_nvidia(&broken);
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.finding.contains("nvidia-smi failed: exit status: 9"),
            "{}",
            c.finding
        );
        let no_kmod = NvidiaFacts {
            proc_version: None,
            ..full
        };
        assert_eq!(check_nvidia(&no_kmod).state, "no_driver");
    }
}
