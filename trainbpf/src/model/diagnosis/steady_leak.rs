//! `steady_leak`: not written yet.

use super::Diagnosis;
use crate::model::Report;

pub(super) fn check(_report: &Report, _out: &mut Vec<Diagnosis>) {}
