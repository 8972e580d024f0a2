//! Who sees each kernel record as it passes. The collector decodes a
//! record once and hands the typed event to each of them: the status
//! line, the live metrics, the stacks' thread, and its own bookkeeping of
//! the job. None of them reads the record's bytes.

use trainbpf_report::decode::Timed;

pub(crate) trait Observe {
    /// A kernel record, decoded; most observers look at a few kinds.
    fn observe(&mut self, t: &Timed);
}
