//! How the text names a job process that has a rank: "rank 1 (pid
//! 14450)". Its command name says little in a distributed job (rank 0
//! may show as `pt_gloo_runloop`, rank 1 as `python3`); its rank is what
//! the other ranks' logs and the launcher name it by.

use crate::model::Report;
use crate::term::escape as esc;

/// "rank 1 (pid 14450)", or "pt_data_worker of rank 1 (pid 14451)" for a
/// process under the rank's own; `None` without a rank, where each caller
/// keeps its own wording.
pub(crate) fn rank_label(r: &Report, pid: u32, start_ns: u64, comm: &str) -> Option<String> {
    let id = r.identity(pid, start_ns)?;
    let rank = id.rank?;
    Some(if id.inherited {
        format!("{} of rank {rank} (pid {pid})", esc(comm))
    } else {
        format!("rank {rank} (pid {pid})")
    })
}

/// A table's COMM cell: "rank 1" for a rank's own process, else its name.
pub(crate) fn name_cell(r: &Report, pid: u32, start_ns: u64, comm: &str) -> String {
    match r.identity(pid, start_ns) {
        Some(id) if !id.inherited && id.rank.is_some() => {
            format!("rank {}", id.rank.unwrap_or_default())
        }
        _ => esc(comm).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::ProcKey;
    use crate::model::identity::Identity;

    #[test]
    fn ranks_name_their_processes() {
        let mut r = Report::default();
        let id = |rank, inherited| Identity {
            rank: Some(rank),
            inherited,
            ..Identity::default()
        };
        r.identities.insert(
            ProcKey {
                tgid: 14450,
                start_ns: 5,
            },
            id(1, false),
        );
        r.identities.insert(
            ProcKey {
                tgid: 14451,
                start_ns: 6,
            },
            id(1, true),
        );
        assert_eq!(
            rank_label(&r, 14450, 5, "python3").as_deref(),
            Some("rank 1 (pid 14450)")
        );
        assert_eq!(
            rank_label(&r, 14451, 6, "pt_data\x1bworker").as_deref(),
            Some("pt_data\\x1bworker of rank 1 (pid 14451)"),
            "escaped"
        );
        assert_eq!(rank_label(&r, 14450, 7, "python3"), None, "another process");
        assert_eq!(name_cell(&r, 14450, 5, "python3"), "rank 1");
        assert_eq!(name_cell(&r, 14451, 6, "w"), "w");
    }
}
