//! Guarded replay (docs/architecture.md §9.3–9.5): one dead message, or
//! every DEAD entry of a ticket.
//!
//! - [`checks`]: the pre-checks of §9.3 as pure functions of the facts,
//!   the decision and the pacing schedule.
//! - [`single`]: one message, with the original `message_id` (§9.4), its
//!   audit row and its verification (§9.5).
//! - [`bulk`]: a ticket's snapshot, canaries first, the rest at a rate.
//! - [`rehearse`]: the order consumer's transaction for a dead message,
//!   read back and rolled back: what a replay would do.
//!
//! The names the CLI, the TUI and the tests use are re-exported here, so
//! `replay::replay`, `replay::Check` and the rest read as one module.

mod bulk;
mod checks;
mod rehearse;
mod single;

pub use bulk::{BulkReport, BulkRequest, Skipped, replay_ticket};
pub use checks::{
    Check, Facts, Level, RATE_RANGE, SchemaError, UnknownCheck, Verdict, decide, pace, verdicts,
};
pub use rehearse::{
    Rehearsal, RehearseError, RehearsedLedger, RehearsedOrder, RehearsedOutbox, RehearsedVerdict,
    rehearse,
};
pub use single::{ReplayError, ReplayReport, ReplayRequest, precheck, replay};
