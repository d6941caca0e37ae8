//! Pure decisions over numbers the observers measured: backlog verdicts,
//! scale advice, alert rules, admission, the send circuit and the stalled
//! consumer watch. No I/O, unit-tested on the
//! worked examples of docs/architecture.md §10, §11.

pub mod admission;
pub mod alerts;
pub mod backlog;
pub mod circuit;
pub mod redis_state;
pub mod scale;
pub mod stall;
