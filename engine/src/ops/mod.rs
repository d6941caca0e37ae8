//! What an operator runs against the stores directly: activities, the
//! reconcile of the invariants, pipeline facts, reservation status, the
//! quarantine, the restore of Redis state, the engine registry's view and the prune of
//! the finished history (retention).

pub mod activity;
pub mod engines;
pub mod facts;
pub mod quarantine;
pub mod reconcile;
pub mod redis_state;
pub mod reservation_status;
pub mod restore;
pub mod retention;
pub mod trace;
