//! Diagnosis: what most likely happened, the evidence for it from this
//! recording, and what to change.
//!
//! People whose job died with `Killed` otherwise learn the usual causes
//! from blog posts (the OOM killer, `oom_score_adj`, a container's limit,
//! DataLoader workers copying the dataset, pinned memory, `/dev/shm`, a
//! leak) and then look for the evidence by hand. Each of those causes is a
//! rule here, over the finished [`Report`]: a rule that finds its evidence
//! adds a [`Diagnosis`] naming the figures it used and a concrete fix.
//!
//! Rules are pure functions of the report, one module each, listed in
//! [`RULES`] in the order that breaks ties: when two diagnoses of one kill
//! have the same confidence, the one whose rule comes first leads. A rule
//! that only sees part of its evidence says so with a lower confidence
//! rather than staying silent, and one that sees none adds nothing.

mod container_limit;
mod cuda_in_workers;
mod dataloader_cow;
mod fast_growth;
mod gpu_oom;
/// What `steady_leak` and `fast_growth` share: a kill's limit, where a
/// process grows.
mod growth;
mod no_swap_overcommit;
mod pinned_memory;
mod shm_full;
mod steady_leak;
mod too_many_workers;
mod userspace_killer;
mod victim_not_grower;
mod workers;

#[cfg(test)]
pub(crate) mod fixture;
#[cfg(test)]
mod recorded;

use super::Report;

/// How sure a rule is, from how much of its evidence it saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Confidence {
    Low,
    Medium,
    High,
}

impl Confidence {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        }
    }
}

/// One cause, with its evidence and its fix.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Diagnosis {
    /// The rule's stable id (`dataloader_cow`, `steady_leak`, ...).
    pub(crate) id: &'static str,
    pub(crate) confidence: Confidence,
    /// One line: what most likely happened, with this run's figures.
    pub(crate) title: String,
    /// The figures from this recording the rule used, one per line.
    pub(crate) evidence: Vec<String>,
    /// What to change, most useful first; the first is the one-line fix.
    pub(crate) fix: Vec<String>,
    /// The kill it explains (index into [`Report::kills`]), or `None` for
    /// one about the whole run.
    pub(crate) kill: Option<usize>,
    /// The processes it is about (tgids).
    pub(crate) pids: Vec<u32>,
}

/// A rule: reads the report, adds what it finds.
type Rule = fn(&Report, &mut Vec<Diagnosis>);

/// Every rule, in the order that breaks ties between equally sure
/// diagnoses of one kill: the more specific cause first.
const RULES: &[(&str, Rule)] = &[
    ("gpu_oom", gpu_oom::check),
    ("shm_full", shm_full::check),
    ("dataloader_cow", dataloader_cow::check),
    ("too_many_workers", too_many_workers::check),
    ("cuda_in_workers", cuda_in_workers::check),
    ("pinned_memory", pinned_memory::check),
    ("steady_leak", steady_leak::check),
    ("fast_growth", fast_growth::check),
    ("userspace_killer", userspace_killer::check),
    ("victim_not_grower", victim_not_grower::check),
    ("container_limit", container_limit::check),
    ("no_swap_overcommit", no_swap_overcommit::check),
];

/// Every rule's id, in tie-break order.
#[cfg(test)]
pub(crate) fn rule_ids() -> impl Iterator<Item = &'static str> {
    RULES.iter().map(|(id, _)| *id)
}

/// Runs every rule. The result is ordered by kill (kills first, in time
/// order, then the run's own), and within one kill by confidence, then by
/// rule order, so that the first diagnosis of a kill is its "most likely".
/// Where a process of kill `k` grew most, in its own code: `function
/// (file:line)` of its heaviest growth stack, as the diagnoses cite it.
pub(crate) fn place(r: &Report, k: &super::Kill, pid: u32, start_ns: u64) -> Option<String> {
    growth::grower_place(r, k, pid, start_ns).map(|(_, at)| at)
}

/// The place of the heaviest of `stacks`, as [`place`] gives it.
pub(crate) fn heaviest_place(stacks: &[super::stacks::GrowthStack]) -> Option<String> {
    growth::heaviest(stacks).map(|(_, at)| at)
}

pub(crate) fn diagnose(report: &Report) -> Vec<Diagnosis> {
    let mut out = Vec::new();
    for (id, rule) in RULES {
        let from = out.len();
        rule(report, &mut out);
        for d in &out[from..] {
            debug_assert_eq!(d.id, *id, "rule {id} added a diagnosis under another id");
        }
    }
    let order = |id: &str| {
        RULES
            .iter()
            .position(|(r, _)| *r == id)
            .unwrap_or(usize::MAX)
    };
    out.sort_by(|a, b| {
        (
            a.kill.is_none(),
            a.kill,
            std::cmp::Reverse(a.confidence),
            order(a.id),
        )
            .cmp(&(
                b.kill.is_none(),
                b.kill,
                std::cmp::Reverse(b.confidence),
                order(b.id),
            ))
    });
    out
}

/// The most likely diagnosis of kill `kill`: its first, as ordered by
/// [`diagnose`].
pub(crate) fn most_likely(diagnoses: &[Diagnosis], kill: usize) -> Option<&Diagnosis> {
    diagnoses.iter().find(|d| d.kill == Some(kill))
}

/// The run's top diagnosis: the first kill's most likely one, or else the
/// surest about the run as a whole.
pub(crate) fn top(diagnoses: &[Diagnosis]) -> Option<&Diagnosis> {
    diagnoses.iter().find(|d| d.kill.is_some()).or_else(|| {
        diagnoses
            .iter()
            .filter(|d| d.kill.is_none())
            .max_by_key(|d| d.confidence)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_ids_are_unique_and_every_module_is_listed() {
        let ids: Vec<_> = rule_ids().collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len());
        assert_eq!(ids.len(), 12);
    }

    #[test]
    fn an_empty_report_has_no_diagnosis() {
        assert!(diagnose(&Report::default()).is_empty());
    }

    #[test]
    fn ordering_puts_each_kills_surest_first_and_ties_by_rule_order() {
        let d = |id, confidence, kill| Diagnosis {
            id,
            confidence,
            title: String::new(),
            evidence: vec![],
            fix: vec![],
            kill,
            pids: vec![],
        };
        let mut v = vec![
            d("container_limit", Confidence::High, Some(0)),
            d("steady_leak", Confidence::Medium, None),
            d("dataloader_cow", Confidence::High, Some(0)),
            d("fast_growth", Confidence::Low, Some(0)),
            d("gpu_oom", Confidence::High, Some(1)),
        ];
        let order = |id: &str| RULES.iter().position(|(r, _)| *r == id).unwrap();
        v.sort_by_key(|a| {
            (
                a.kill.is_none(),
                a.kill,
                std::cmp::Reverse(a.confidence),
                order(a.id),
            )
        });
        assert_eq!(most_likely(&v, 0).unwrap().id, "dataloader_cow");
        assert_eq!(most_likely(&v, 1).unwrap().id, "gpu_oom");
        assert_eq!(top(&v).unwrap().id, "dataloader_cow");
        assert_eq!(v.last().unwrap().id, "steady_leak");
    }
}
