//! The GPU ledger, the late-library hold and the probing, with stand-in drivers.

mod late;
mod ledger;
mod links;
mod probing;
mod scan;
