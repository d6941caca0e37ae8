//! The DLQ closed loop (docs/architecture.md §9, §9.3): discover and own.
//!
//! - [`mirror`]: the governor's pass. Every message of `%DLQ%<group>` of
//!   each seckill consumer group is copied into `dlq_messages` (original
//!   topic, body, properties, the error class of the consumer's last
//!   recorded failure, delivery attempts, `dead_at`) and grouped into the
//!   live `dlq_tickets` row of its (group, error class).
//! - [`key`]: how a dead message is keyed: its `message_id`, or, for a
//!   message that carries none or a malformed one, what the mirror could
//!   key it by (§9.1).
//! - [`tickets`]: the ticket lifecycle OPEN → ACKED → FIXED → REPLAYING →
//!   VERIFIED → CLOSED as a pure transition table, and the reads the CLI
//!   shows.
//! - [`replay`]: guarded replay with the original `message_id`, pre-checks,
//!   audit and verification.
//! - [`entry`]: an entry's lifecycle as one pure state machine, and the
//!   ticket that follows its entries.
//! - [`discard`]: ends a dead message on purpose, fenced by its inbox row,
//!   compensating an order message's reservation once.
//! - [`verifier`]: the governor's pass that verifies entries whose effect
//!   now exists, whoever produced it, and moves tickets after them.

pub mod discard;
pub mod entry;
pub mod key;
pub mod mirror;
pub mod replay;
pub mod tickets;
pub mod verifier;
pub mod webhook;

pub use mirror::mirror_once;
