//! Reads a job process's distributed identity from /proc: the few
//! environment variables that name its rank, run and Slurm step, and its
//! cgroup paths (a container's, a pod's). The process wrote these bytes:
//! every read is capped, only the names in `IDENTITY_VARS` are kept, and
//! their values are cut short; the renderers escape them.

use std::{collections::BTreeMap, fs::File, io::Read};

use trainbpf_report::decode::identity::{
    IDENTITY_VARS, MAX_CGROUP_BYTES, MAX_CGROUPS, MAX_VAR_BYTES, ProcIdentity,
};

/// The reads, on a thread of their own, for the collector.
mod reader;
pub use reader::{Done, Reader, Request};

/// The most of /proc/PID/environ read. The environment is fixed at exec
/// and launchers put their variables among the first; a job that sets
/// hundreds of kilobytes of others may lose its rank past this.
pub const MAX_ENVIRON_BYTES: u64 = 256 << 10;
/// /proc/PID/cgroup has one short line per hierarchy.
const MAX_CGROUP_FILE_BYTES: u64 = 16 << 10;

/// The identity of `tgid` now, or `None` when it is gone.
pub fn read(tgid: u32, start_ns: u64) -> Option<ProcIdentity> {
    read_with_error_file(tgid, start_ns).map(|(id, _)| id)
}

/// Its identity, and where torchelastic wants its error file written
/// (`record::torchelastic`), as the process's own user.
pub fn read_with_error_file(
    tgid: u32,
    start_ns: u64,
) -> Option<(ProcIdentity, Option<crate::record::torchelastic::Target>)> {
    use std::os::unix::fs::MetadataExt as _;
    let cgroups = read_capped(&format!("/proc/{tgid}/cgroup"), MAX_CGROUP_FILE_BYTES)?;
    // A kernel thread or a zombie has an empty environ: no variables.
    let env = read_capped(&format!("/proc/{tgid}/environ"), MAX_ENVIRON_BYTES).unwrap_or_default();
    // /proc/PID belongs to the process's effective ids.
    let error_file = std::fs::metadata(format!("/proc/{tgid}"))
        .ok()
        .and_then(|m| {
            let owner = crate::util::safe_file::Owner {
                uid: m.uid(),
                gid: m.gid(),
            };
            crate::record::torchelastic::target_of(&env, owner)
        });
    let id = ProcIdentity {
        tgid,
        start_ns,
        vars: environ_vars(&env),
        cgroups: cgroup_paths(&cgroups),
    };
    Some((id, error_file))
}

fn read_capped(path: &str, cap: u64) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    File::open(path)
        .ok()?
        .take(cap)
        .read_to_end(&mut buf)
        .ok()?;
    Some(buf)
}

/// The identity variables of a NUL-separated environment block; the first
/// of each name wins, as in `getenv`. A value that is not UTF-8 or is
/// longer than `MAX_VAR_BYTES` is dropped (no launcher writes such).
pub fn environ_vars(env: &[u8]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for kv in env.split(|&b| b == 0) {
        let Some(eq) = kv.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (name, value) = (&kv[..eq], &kv[eq + 1..]);
        let Some(&known) = IDENTITY_VARS.iter().find(|v| v.as_bytes() == name) else {
            continue;
        };
        if value.len() > MAX_VAR_BYTES || out.contains_key(known) {
            continue;
        }
        if let Ok(v) = std::str::from_utf8(value) {
            out.insert(known.to_string(), v.to_string());
        }
    }
    out
}

/// The paths of /proc/PID/cgroup (`ID:CONTROLLERS:PATH` lines), each once,
/// at most `MAX_CGROUPS` of at most `MAX_CGROUP_BYTES`.
pub fn cgroup_paths(text: &[u8]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        let mut f = line.splitn(3, |&b| b == b':');
        let (Some(_), Some(_), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if path.is_empty() || path.len() > MAX_CGROUP_BYTES {
            continue;
        }
        let Ok(path) = std::str::from_utf8(path) else {
            continue;
        };
        if out.len() >= MAX_CGROUPS {
            break;
        }
        if !out.iter().any(|p| p == path) {
            out.push(path.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_the_identity_variables() {
        let env = b"PATH=/usr/bin\0RANK=1\0LOCAL_RANK=1\0WORLD_SIZE=2\0\
                    AWS_SECRET_ACCESS_KEY=hunter2\0TORCHELASTIC_RUN_ID=run-7\0\
                    RANK=9\0SLURM_JOB_ID=123\0";
        let v = environ_vars(env);
        assert_eq!(v.get("RANK").map(String::as_str), Some("1"), "first wins");
        assert_eq!(
            v.get("TORCHELASTIC_RUN_ID").map(String::as_str),
            Some("run-7")
        );
        assert_eq!(v.get("SLURM_JOB_ID").map(String::as_str), Some("123"));
        assert_eq!(v.len(), 5, "{v:?}");
        assert!(!v.contains_key("AWS_SECRET_ACCESS_KEY") && !v.contains_key("PATH"));
    }

    #[test]
    fn hostile_environments_are_bounded() {
        let long = format!("RANK={}\0", "1".repeat(MAX_VAR_BYTES + 1));
        assert!(environ_vars(long.as_bytes()).is_empty(), "over-long value");
        // Not UTF-8, no '=', a name that only starts like one, control
        // characters (kept: the renderers escape them), empty.
        let env = b"RANK=\xff\xfe\0LOCAL_RANK\0RANKX=3\0=RANK\0\0\
                    TORCHELASTIC_RUN_ID=\x1b[2Jrun\0WORLD_SIZE=\0";
        let v = environ_vars(env);
        assert_eq!(
            v.into_iter().collect::<Vec<_>>(),
            vec![
                ("TORCHELASTIC_RUN_ID".into(), "\x1b[2Jrun".into()),
                ("WORLD_SIZE".into(), String::new()),
            ]
        );
        // A megabyte of names: still only what is listed.
        let mut big = Vec::new();
        for i in 0..50_000 {
            big.extend_from_slice(format!("V{i}=x\0").as_bytes());
        }
        big.extend_from_slice(b"RANK=4\0");
        assert_eq!(environ_vars(&big).len(), 1);
        // The read itself stops at its cap, whatever the file holds.
        let f = std::env::temp_dir().join(format!("trainbpf-environ-{}", std::process::id()));
        std::fs::write(&f, &big).unwrap();
        let got = read_capped(f.to_str().unwrap(), 4096).unwrap();
        let _ = std::fs::remove_file(&f);
        assert_eq!(got.len(), 4096);
    }

    #[test]
    fn cgroup_lines_v1_and_v2() {
        let id = "3f2a1b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708";
        let text = format!(
            "12:memory:/kubepods/burstable/pod8d3c2b1a-0f9e-4d8c-b7a6-954433221100/{id}\n\
             11:cpu,cpuacct:/kubepods/burstable/pod8d3c2b1a-0f9e-4d8c-b7a6-954433221100/{id}\n\
             1:name=systemd:/user.slice\n0::/system.slice/docker-{id}.scope\n\
             junk\n5:x:\n"
        );
        let p = cgroup_paths(text.as_bytes());
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].starts_with("/kubepods/burstable/pod"));
        assert_eq!(p[2], format!("/system.slice/docker-{id}.scope"));
        let many: String = (0..100).map(|i| format!("{i}:c{i}:/p{i}\n")).collect();
        assert_eq!(cgroup_paths(many.as_bytes()).len(), MAX_CGROUPS);
        let long = format!("0::/{}\n", "a".repeat(MAX_CGROUP_BYTES));
        assert!(cgroup_paths(long.as_bytes()).is_empty());
    }

    #[test]
    fn reads_its_own_process() {
        let me = read(std::process::id(), 0).expect("own /proc");
        assert!(!me.cgroups.is_empty());
        assert!(read(u32::MAX, 0).is_none(), "a pid that cannot exist");
    }
}
