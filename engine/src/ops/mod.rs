//! What an operator runs against the stores directly: activities, the
//! reconcile of the invariants, pipeline facts and reservation status.

pub mod activity;
pub mod facts;
pub mod reconcile;
pub mod redis_state;
pub mod reservation_status;
