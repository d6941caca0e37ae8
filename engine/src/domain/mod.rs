//! The vocabulary every layer shares, with no I/O: identifier newtypes,
//! status enums, message bodies, the elected singletons, in-process counters, the labelled traffic meters and the clock.

pub mod auth;
pub mod clock;
pub mod ids;
pub mod message;
pub mod meters;
pub mod singleton;
pub mod stats;
pub mod status;
pub mod trace;
