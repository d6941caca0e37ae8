//! The stages a reservation passes through, in order: ingress reserves in
//! Redis, publish sends within a bound (behind the send circuit), scan re-sends with the same
//! `message_id`, consume creates the orders in one transaction per batch,
//! the outbox publishes what the transaction promised, order pays and
//! cancels, lifecycle consumes cancels, compensations and order events;
//! trail is every stage's log lines.

pub mod circuit;
pub mod concurrency;
pub mod consume;
pub mod ingress;
pub mod lifecycle;
pub mod order;
pub mod outbox;
pub mod publish;
pub mod scan;
pub mod trail;
