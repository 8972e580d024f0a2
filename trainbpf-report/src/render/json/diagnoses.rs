//! The report's `diagnoses` array (docs/report-json.md, "diagnoses"): what
//! most likely happened, the evidence from this recording, what to change.

use schemars::JsonSchema;
use serde::Serialize;

use crate::model::Report;
use crate::model::diagnosis::Diagnosis as ModelDiagnosis;

/// One cause the report's rules found, with its evidence and fix.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Diagnosis {
    /// The rule: `dataloader_cow`, `too_many_workers`, `steady_leak`,
    /// `fast_growth`, `pinned_memory`, `cuda_in_workers`, `shm_full`,
    /// `container_limit`, `victim_not_grower`, `userspace_killer`,
    /// `no_swap_overcommit`, `gpu_oom`.
    pub(crate) id: String,
    /// How much of the rule's evidence the recording held.
    pub(crate) confidence: Confidence,
    /// What most likely happened, in one line with this run's figures.
    pub(crate) title: String,
    /// The figures it rests on, from this recording, one per line.
    pub(crate) evidence: Vec<String>,
    /// What to change, most useful first.
    pub(crate) fix: Vec<String>,
    /// The kill it explains (an index into `kills`), or null for one about
    /// the whole run.
    pub(crate) kill: Option<usize>,
    /// The processes it is about.
    pub(crate) pids: Vec<u32>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Confidence {
    High,
    Medium,
    Low,
}

impl Diagnosis {
    /// In the model's order: per kill, its most likely first; then the
    /// run's own.
    pub(crate) fn all(r: &Report) -> Vec<Diagnosis> {
        r.diagnoses.iter().map(Diagnosis::new).collect()
    }

    fn new(d: &ModelDiagnosis) -> Diagnosis {
        use crate::model::diagnosis::Confidence as C;
        Diagnosis {
            id: d.id.to_string(),
            confidence: match d.confidence {
                C::High => Confidence::High,
                C::Medium => Confidence::Medium,
                C::Low => Confidence::Low,
            },
            title: d.title.clone(),
            evidence: d.evidence.clone(),
            fix: d.fix.clone(),
            kill: d.kill,
            pids: d.pids.clone(),
        }
    }
}
