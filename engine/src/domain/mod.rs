//! The vocabulary every layer shares, with no I/O: identifier newtypes,
//! status enums, message bodies, in-process counters and the clock.

pub mod auth;
pub mod clock;
pub mod ids;
pub mod message;
pub mod stats;
pub mod status;
