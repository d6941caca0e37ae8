//! The order-create consumer (DESIGN.md §7): one READ COMMITTED PostgreSQL
//! transaction per listener batch, then ACK.
//!
//! Inputs: [`IncomingMessage`]s of the ORDER_CREATE topic (seed §9.1
//! bodies). Outputs, committed together per batch: `consumer_inbox` rows,
//! `reservations` (the final truth per reservation), `orders`,
//! `inventory` decrements, `inventory_ledger`, `compensation_tasks`, and
//! `event_outbox` rows (delayed cancel, `ORDER_CREATED`,
//! `RELEASE_RESERVATION`); outside the transaction, `message_quarantine`
//! for bad bodies and `consumer_failures` before a retry. Returns a
//! [`ConsumeVerdict`] for the broker.
//!
//! Layout: [`decide`] is the pure decision table (ACK, retry, quarantine),
//! `plan` the pure per-message screening and stock allocation, [`sql`] the
//! statements, `tx` the transaction that runs them, [`events`] the outbox
//! payloads.

pub mod decide;
pub mod events;
mod plan;
pub mod sql;
mod tx;

pub use decide::{
    Decision, classify, classify_db_error, classify_sqlstate, db_failure_class, failure_class,
    verdict,
};

use crate::ids::{ActivityId, MessageId, OrderId, SkuId};
use crate::message::{Malformed, OrderCreateRequested, parse_order_create};
use crate::mq::{ConsumeVerdict, Handler, IncomingMessage, Names, PROP_REPLAY_ID, TopicKind};
use crate::status::{FailureClass, ReservationOutcome};
use sqlx::PgPool;

/// A valid order-create message with its delivery facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub msg: OrderCreateRequested,
    /// The broker's reconsume count: 0 on first delivery (DESIGN.md §3).
    pub delivery_attempt: i32,
    /// Set when an operator replayed the message (DESIGN.md §9.4).
    pub replay_id: Option<String>,
}

impl Parsed {
    /// A first delivery, not a replay.
    pub fn new(msg: OrderCreateRequested) -> Self {
        Self {
            msg,
            delivery_attempt: 0,
            replay_id: None,
        }
    }

    /// Parses a delivered message; a [`Malformed`] one goes to quarantine.
    pub fn from_incoming(m: &IncomingMessage) -> Result<Self, Malformed> {
        Ok(Self {
            msg: parse_order_create(&m.body)?,
            delivery_attempt: m.reconsume_times.max(0),
            replay_id: m.property(PROP_REPLAY_ID).map(str::to_owned),
        })
    }
}

/// Why a reservation was turned down; each one is compensated once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    NoStock,
    /// The user already holds a valid order in this activity.
    DuplicateUser,
    /// The message arrived after `reservation_valid_until` (seed §21).
    Expired,
}

impl RejectReason {
    pub fn outcome(self) -> ReservationOutcome {
        match self {
            RejectReason::NoStock => ReservationOutcome::RejectedNoStock,
            RejectReason::DuplicateUser => ReservationOutcome::RejectedDuplicate,
            RejectReason::Expired => ReservationOutcome::RejectedExpired,
        }
    }
}

/// What became of one message. Every variant is committed, so every one ACKs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageOutcome {
    Created {
        order_id: OrderId,
    },
    /// This `message_id` was consumed before (or earlier in the same batch).
    AlreadyProcessed,
    /// The same reservation under another `message_id`: its effect already
    /// happened, so nothing is written and nothing is compensated.
    DuplicateReservation,
    /// Recorded, compensated once, inbox REJECTED.
    Rejected(RejectReason),
}

/// Why a batch's transaction did not commit. Nothing of it was written.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    /// No `inventory` row for a message's (activity, sku). A configuration
    /// error, not "no stock": rejecting would compensate reservations that
    /// may be sellable, so the batch is retried and, unless an operator
    /// adds the row, dead-lettered and ticketed (DESIGN.md §9).
    #[error(
        "no inventory row for activity {activity_id} sku {sku_id}; create it (`seckillctl activity stock`) and replay"
    )]
    MissingInventory {
        activity_id: ActivityId,
        sku_id: SkuId,
    },
}

/// The order-create consumer. Cheap to clone: the pool is a handle.
#[derive(Debug, Clone)]
pub struct OrderConsumer {
    pool: PgPool,
    group: String,
    names: Names,
}

impl OrderConsumer {
    pub fn new(pool: PgPool, names: Names) -> Self {
        Self {
            group: names.group(TopicKind::OrderCreate),
            pool,
            names,
        }
    }

    /// The consumer group: the inbox namespace.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Runs the order transaction for `msgs` and commits it. One outcome per
    /// message, in input order. On error nothing was committed.
    pub async fn process(&self, msgs: &[Parsed]) -> Result<Vec<MessageOutcome>, ProcessError> {
        tx::process(&self.pool, &self.group, &self.names, msgs).await
    }

    /// Writes the batch's bad messages to `message_quarantine`, in one
    /// statement.
    async fn quarantine(&self, bad: &[(&IncomingMessage, Malformed)]) -> Result<(), sqlx::Error> {
        let props: Vec<serde_json::Value> = bad
            .iter()
            .map(|(m, _)| serde_json::to_value(&m.properties).unwrap_or_default())
            .collect();
        sqlx::query(sql::QUARANTINE)
            .bind(&self.group)
            .bind(
                bad.iter()
                    .map(|(m, _)| m.topic.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(bad.iter().map(|(m, _)| m.message_id()).collect::<Vec<_>>())
            .bind(
                bad.iter()
                    .map(|(m, _)| m.broker_msg_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(bad.iter().map(|(_, e)| e.reason).collect::<Vec<_>>())
            .bind(
                bad.iter()
                    .map(|(_, e)| e.detail.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(bad.iter().map(|(m, _)| m.body.clone()).collect::<Vec<_>>())
            .bind(props)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Best effort: the failure is already on its way back to the broker.
    async fn record_failures(&self, msgs: &[Parsed], class: FailureClass, detail: &str) {
        let result = sqlx::query(sql::RECORD_FAILURES)
            .bind(&self.group)
            .bind(
                msgs.iter()
                    .map(|p| p.msg.message_id.clone())
                    .collect::<Vec<MessageId>>(),
            )
            .bind(msgs.iter().map(|p| p.delivery_attempt).collect::<Vec<_>>())
            .bind(class)
            .bind(detail)
            .execute(&self.pool)
            .await;
        if let Err(e) = result {
            tracing::warn!(
                group = %self.group,
                messages = msgs.len(),
                error = %e,
                "could not record consumer failures; the retry goes ahead"
            );
        }
    }
}

impl Handler for OrderConsumer {
    /// Bad bodies never poison the batch: the valid messages run in one
    /// transaction first, then the bad ones are quarantined. ACK only when
    /// both are durable (DESIGN.md §7: commit, then ACK); a retry
    /// redelivers the batch, and the inbox turns what was committed into
    /// no-ops.
    async fn handle(&self, batch: Vec<IncomingMessage>) -> ConsumeVerdict {
        let mut good = Vec::with_capacity(batch.len());
        let mut bad = Vec::new();
        for m in &batch {
            match Parsed::from_incoming(m) {
                Ok(p) => good.push(p),
                Err(e) => bad.push((m, e)),
            }
        }

        let mut decisions: Vec<Decision> = Vec::with_capacity(1 + bad.len());
        if !good.is_empty() {
            match self.process(&good).await {
                Ok(outcomes) => {
                    tracing::debug!(group = %self.group, messages = outcomes.len(), "order batch committed");
                    decisions.push(Decision::Ack);
                }
                Err(e) => {
                    let (class, detail) = (failure_class(&e), e.to_string());
                    tracing::warn!(
                        group = %self.group, messages = good.len(), class = %class, error = %detail,
                        "order batch failed; asking for redelivery"
                    );
                    self.record_failures(&good, class, &detail).await;
                    // The bad ones are not quarantined yet: the redelivery
                    // would record them a second time.
                    return ConsumeVerdict::Retry;
                }
            }
        }

        if !bad.is_empty() {
            for (m, e) in &bad {
                tracing::warn!(
                    group = %self.group, broker_msg_id = %m.broker_msg_id,
                    message_id = m.message_id().unwrap_or("-"), reason = %e.reason, detail = %e.detail,
                    "quarantining a malformed message"
                );
            }
            match self.quarantine(&bad).await {
                Ok(()) => decisions.extend(bad.into_iter().map(|(_, e)| Decision::Quarantine(e))),
                Err(e) => {
                    tracing::warn!(group = %self.group, error = %e, "quarantine write failed; asking for redelivery");
                    decisions.push(classify_db_error(&e));
                }
            }
        }
        verdict(&decisions)
    }
}
