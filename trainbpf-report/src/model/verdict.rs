//! A kill in one line that stands alone: who was killed, by what, and the
//! top grower with what it added and where. The one text for every place a
//! kill is told in a line (the report's `kills[].verdict`; the recorder's
//! stderr, `--events-jsonl` and torchelastic's error file build the same
//! [`Facts`] live and call the same [`line`]).

use super::{Constraint, Kill, Report, diagnosis};
use crate::units::{human_kb, human_secs, signed_kb};

/// The longest line: a log field, a Root Cause block's message.
pub const MAX_CHARS: usize = 200;

/// What the line says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// The victim as the report names it: `rank 1 (pid 812)`.
    pub victim: String,
    pub constraint: Constraint,
    /// The memory cgroup's limit, for a memcg OOM.
    pub limit_kb: Option<u64>,
    pub top: Option<Top>,
    /// An OOM kill of the job this shortly before ([`AFTER_NS`]): its
    /// victim, and how long before. The kernel picks a second victim while
    /// the first one's memory is still being freed; the line names the
    /// first, which torchelastic's Root Cause may not (it orders failures
    /// by the second).
    pub after: Option<(String, u64)>,
}

/// A kill this soon after another of the job's follows from it.
pub const AFTER_NS: u64 = 1_000_000_000;

/// The kill's top grower.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Top {
    /// As the report names it; `None` when it is the victim.
    pub who: Option<String>,
    /// Allocated minus freed in its own context over the window (ADDED),
    /// where recorded.
    pub added_kb: Option<i64>,
    /// Its resident memory's growth over the window.
    pub rss_kb: u64,
    pub window_ns: u64,
    /// Where it grew: `function (file:line)` of its own code.
    pub at: Option<String>,
}

/// The line, at most [`MAX_CHARS`] characters: the place is shortened
/// first, then the whole cut.
pub fn line(f: &Facts) -> String {
    let cause = match (f.constraint, f.limit_kb) {
        (Constraint::Memcg, Some(l)) => {
            format!(": its memory cgroup reached its {} limit", human_kb(l))
        }
        (Constraint::Memcg, None) => ": its memory cgroup reached its limit".into(),
        (Constraint::None, _) => ": the machine ran out of memory".into(),
        (Constraint::Cpuset, _) => ": its cpuset's memory nodes ran out".into(),
        (Constraint::MemoryPolicy, _) => ": its memory policy's nodes ran out".into(),
        (Constraint::Unknown, _) => String::new(),
    };
    let after = match &f.after {
        Some((who, ns)) => format!(" {} after {who}", crate::units::small_duration(*ns)),
        None => String::new(),
    };
    let mut head = format!("{} was OOM-killed{after}{cause}", f.victim);
    let Some(t) = &f.top else {
        return cut(head, MAX_CHARS);
    };
    let who = t.who.as_deref().unwrap_or("it");
    let grew = match t.added_kb {
        Some(a) if a < 0 => format!("{who} added {}", signed_kb(a)),
        Some(a) => format!("{who} added {}", human_kb(a as u64)),
        None => {
            let whose = t.who.as_deref().map_or("its".into(), |w| format!("{w}'s"));
            format!("{whose} RSS grew {}", human_kb(t.rss_kb))
        }
    };
    head.push_str(&format!("; {grew} in {}", human_secs(t.window_ns)));
    match &t.at {
        Some(at) => {
            let room = MAX_CHARS.saturating_sub(head.chars().count() + ", in ".len());
            if room >= 12 {
                head.push_str(", in ");
                head.push_str(&cut(at.clone(), room));
            }
            cut(head, MAX_CHARS)
        }
        None => cut(head, MAX_CHARS),
    }
}

/// A death by a signal other than an OOM kill, in a line: `rank 1 (pid
/// 812) was killed by SIGKILL from bash (pid 900)`, `rank 1 (pid 812)
/// died of SIGSEGV`. `sender`: who sent it, where known (a crash's
/// signal is its own). `after`: the job's first OOM kill before it (its
/// victim, and how long before), which makes this death its consequence
/// (`model::consequence`): `…, 0.2 s after rank 0 (pid 811) was
/// OOM-killed: its consequence`.
pub fn died_line(
    victim: &str,
    sig: i32,
    sender: Option<&str>,
    after: Option<(&str, u64)>,
) -> String {
    let name = crate::units::signal_name(sig).map_or_else(|| format!("signal {sig}"), Into::into);
    let mut s = match sender {
        Some(from) => format!("{victim} was killed by {name} from {from}"),
        None => format!("{victim} died of {name}"),
    };
    if let Some((first, ns)) = after {
        s.push_str(&format!(
            ", {} after {first} was OOM-killed: its consequence",
            crate::units::small_duration(ns)
        ));
    }
    cut(s, MAX_CHARS)
}

/// A process in prose, as the whole report names it: `rank 1 (pid 700)`
/// for a rank's own process, `pt_data_worker of rank 1 (pid 701)` for one
/// it started (`rank`: its rank, and whether inherited), else `python3
/// (pid 700)`. Unescaped.
pub fn who(pid: u32, comm: &str, rank: Option<(u32, bool)>) -> String {
    match rank {
        Some((r, true)) => format!("{comm} of rank {r} (pid {pid})"),
        Some((r, false)) => format!("rank {r} (pid {pid})"),
        None => format!("{comm} (pid {pid})"),
    }
}

/// Where the heaviest of a process's growth stacks (bytes, frames
/// innermost first) grew, in its own code: the place [`line`] cites, as
/// the report finds it.
pub fn place_of(stacks: &[(u64, Vec<crate::decode::stacks::Frame>)]) -> Option<String> {
    let g: Vec<super::stacks::GrowthStack> = stacks
        .iter()
        .map(|(bytes, frames)| super::stacks::GrowthStack {
            bytes: *bytes,
            count: 1,
            frames: frames.clone(),
            error: None,
        })
        .collect();
    diagnosis::heaviest_place(&g)
}

/// Lines told by the recorder kept at most (one per kill).
pub(crate) const MAX_TOLD: usize = 4096;
/// A told line belongs to a kill whose first record is this close.
const TOLD_NS: u64 = 2_000_000_000;

/// The line the recorder told at kill `k`, if it told one: same victim,
/// within [`TOLD_NS`]. Cut to [`MAX_CHARS`] like any other.
pub(crate) fn told(told: &[(u64, crate::decode::KillVerdict)], k: &Kill) -> Option<String> {
    let v = &k.victim;
    told.iter()
        .find(|(ts, t)| {
            t.proc.tgid == v.pid
                && (t.proc.start_ns == 0 || v.start_ns == 0 || t.proc.start_ns == v.start_ns)
                && ts.abs_diff(k.ts_ns) <= TOLD_NS
        })
        .map(|(_, t)| cut(t.line.clone(), MAX_CHARS))
}

/// `s` in at most `n` characters, `…` marking a cut.
fn cut(s: String, n: usize) -> String {
    if s.chars().count() <= n {
        return s;
    }
    let mut out: String = s.chars().take(n.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// The facts of kill `k`, as the report has them.
pub(crate) fn facts(r: &Report, k: &Kill) -> Facts {
    let v = &k.victim;
    let top = k.growers.first().map(|g| Top {
        who: (!g.is_victim).then(|| r.who(g.pid, g.start_ns, &g.comm)),
        added_kb: g.honest_kb,
        rss_kb: g.grew_kb,
        window_ns: g.window_ns,
        at: diagnosis::place(r, k, g.pid, g.start_ns),
    });
    let victim = r.who(v.pid, v.start_ns, &v.comm);
    Facts {
        victim: if v.in_job {
            victim
        } else {
            format!("{victim}, outside the job,")
        },
        constraint: k.constraint,
        limit_kb: k
            .memcg_limit_kb
            .filter(|_| k.constraint == Constraint::Memcg),
        top,
        after: r
            .kills
            .iter()
            .find(|e| e.ts_ns < k.ts_ns && k.ts_ns - e.ts_ns <= AFTER_NS)
            .map(|e| {
                let v = &e.victim;
                (r.who(v.pid, v.start_ns, &v.comm), k.ts_ns - e.ts_ns)
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024;

    fn leak() -> Facts {
        Facts {
            victim: "rank 1 (pid 812)".into(),
            constraint: Constraint::Memcg,
            limit_kb: Some(2048 * MIB),
            top: Some(Top {
                who: None,
                added_kb: Some(1300 * MIB as i64),
                rss_kb: 1400 * MIB,
                window_ns: 40_000_000_000,
                at: Some("load_batch (train.py:42)".into()),
            }),
            after: None,
        }
    }

    #[test]
    fn who_what_and_where_in_a_line() {
        assert_eq!(
            line(&leak()),
            "rank 1 (pid 812) was OOM-killed: its memory cgroup reached its 2 GiB limit; it \
             added 1.27 GiB in 40.0 s, in load_batch (train.py:42)"
        );
        let mut f = leak();
        f.constraint = Constraint::None;
        f.limit_kb = None;
        let t = f.top.as_mut().unwrap();
        t.who = Some("rank 0 (pid 811)".into());
        t.added_kb = None;
        t.at = None;
        assert_eq!(
            line(&f),
            "rank 1 (pid 812) was OOM-killed: the machine ran out of memory; rank 0 (pid 811)'s \
             RSS grew 1.37 GiB in 40.0 s"
        );
        f.top.as_mut().unwrap().who = None;
        assert!(
            line(&f).ends_with("; its RSS grew 1.37 GiB in 40.0 s"),
            "{}",
            line(&f)
        );
        f.top = None;
        assert_eq!(
            line(&f),
            "rank 1 (pid 812) was OOM-killed: the machine ran out of memory"
        );
        assert_eq!(
            died_line(
                "rank 0 (pid 811)",
                15,
                Some("pt_elastic (pid 800)"),
                Some(("rank 1 (pid 812)", 210_000_000))
            ),
            "rank 0 (pid 811) was killed by SIGTERM from pt_elastic (pid 800), 210.0 ms after rank 1 \
             (pid 812) was OOM-killed: its consequence"
        );
        assert_eq!(
            died_line("rank 1 (pid 812)", 11, None, None),
            "rank 1 (pid 812) died of SIGSEGV"
        );
        // A second victim names the first.
        f.after = Some(("rank 0 (pid 811)".into(), 6_200_000));
        assert_eq!(
            line(&f),
            "rank 1 (pid 812) was OOM-killed 6.2 ms after rank 0 (pid 811): the machine ran out \
             of memory"
        );
    }

    /// A long place is shortened, a long name cut: never over the limit,
    /// and the victim always first.
    #[test]
    fn never_longer_than_the_limit() {
        let mut f = leak();
        f.top.as_mut().unwrap().at = Some(format!("{} (x.py:1)", "f".repeat(300)));
        let l = line(&f);
        assert_eq!(l.chars().count(), MAX_CHARS, "{l}");
        assert!(l.ends_with('…') && l.contains(", in fff"), "{l}");
        f.victim = "v".repeat(400);
        let l = line(&f);
        assert_eq!(l.chars().count(), MAX_CHARS);
        assert!(l.starts_with("vvv"));
    }
}
