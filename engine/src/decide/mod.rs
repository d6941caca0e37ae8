//! Pure decisions over numbers the observers measured: backlog verdicts,
//! scale advice, alert rules, admission, the send circuit, the stalled
//! consumer watch, whether a Redis write waits for its replicas and the
//! verdict of one reservation's story, and retention's floor and
//! schedule. No I/O, unit-tested on the
//! worked examples of docs/architecture.md §10, §11.

pub mod admission;
pub mod alerts;
pub mod backlog;
pub mod circuit;
pub mod liveness;
pub mod redis_state;
pub mod replica_ack;
pub mod retention;
pub mod scale;
pub mod stall;
pub mod story;
