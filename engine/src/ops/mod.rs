//! What an operator runs against the stores directly: activities, the
//! reconcile of the invariants, pipeline facts, reservation status, the
//! quarantine, the restore of Redis state and the engine registry's view.

pub mod activity;
pub mod engines;
pub mod facts;
pub mod quarantine;
pub mod reconcile;
pub mod redis_state;
pub mod reservation_status;
pub mod restore;
pub mod trace;
