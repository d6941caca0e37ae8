//! The consumers after order creation (docs/architecture.md §8): the delayed cancel,
//! the compensation (Redis release) and the query projection, plus the
//! sweeps that catch what a lost message would leave behind.
//!
//! Inputs: messages of the ORDER_TIMEOUT, INVENTORY_COMPENSATE and
//! ORDER_EVENT topics, published from the outbox. Outputs: order status
//! changes and their outbox rows ([`crate::pipeline::order`]), Redis releases and
//! `compensation_tasks` settled, Redis order views, and inbox rows.
//!
//! These topics carry far less than ORDER_CREATE, so each message is
//! settled in its own transaction: simple, and a failure retries only its
//! batch. The cancel is the exception: a sale's deadlines come in a burst,
//! so it settles a listener batch in one transaction and falls back to one
//! message at a time (docs/architecture.md §8.2). Every consumer is idempotent on the business `message_id` (the
//! inbox) or, for the projection, on `aggregate_version`.

pub mod cancel;
pub mod compensate;
mod inbox;
pub mod projection;

pub use cancel::CancelConsumer;
pub use compensate::CompensationConsumer;
pub use projection::ProjectionConsumer;

use crate::domain::message::Malformed;
use crate::domain::status::FailureClass;
use crate::mq::{ConsumeVerdict, IncomingMessage, PROP_TRACEPARENT};
use crate::pipeline::consume::{db_failure_class, quarantine, record_failures};
use crate::pipeline::trail;
use crate::reservation::ReservationError;
use sqlx::PgPool;
use std::future::Future;

/// Why one message could not be settled; nothing of it was committed.
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Redis(#[from] ReservationError),
}

impl SettleError {
    pub fn class(&self) -> FailureClass {
        match self {
            SettleError::Db(e) => db_failure_class(e),
            SettleError::Redis(ReservationError::Redis(_)) => FailureClass::RedisUnavailable,
            SettleError::Redis(_) => FailureClass::Unknown,
        }
    }
}

/// A consumer that settles one message at a time.
pub(crate) trait SettleEach: Send + Sync + 'static {
    type Msg: Send;
    fn group(&self) -> &str;
    fn pool(&self) -> &PgPool;
    fn parse(m: &IncomingMessage) -> Result<Self::Msg, Malformed>;
    fn settle(
        &self,
        msg: Self::Msg,
        m: &IncomingMessage,
    ) -> impl Future<Output = Result<(), SettleError>> + Send;
}

/// The batch verdict: ACK only when every message is settled or
/// quarantined (docs/architecture.md §7's table). A retry redelivers the batch, and
/// the settled messages are no-ops the second time; bad bodies are
/// quarantined on the delivery that ACKs, so they are recorded once.
pub(crate) async fn handle_each<C: SettleEach>(
    c: &C,
    batch: Vec<IncomingMessage>,
) -> ConsumeVerdict {
    // One span a stage (docs/architecture.md §11.3).
    let span = tracing::info_span!("lifecycle", group = c.group(), n = batch.len());
    trail::link(
        &span,
        batch.iter().filter_map(|m| m.property(PROP_TRACEPARENT)),
    );
    tracing::Instrument::instrument(settle_each(c, batch), span).await
}

async fn settle_each<C: SettleEach>(c: &C, batch: Vec<IncomingMessage>) -> ConsumeVerdict {
    let mut bad = Vec::new();
    let mut failed = Vec::new();
    for m in &batch {
        match C::parse(m) {
            Err(e) => bad.push((m, e)),
            Ok(msg) => {
                if let Err(e) = c.settle(msg, m).await {
                    tracing::warn!(
                        group = c.group(), message_id = m.message_id().unwrap_or("-"),
                        class = %e.class(), error = %e, "could not settle a message; asking for redelivery"
                    );
                    failed.push((m, e));
                }
            }
        }
    }
    if !failed.is_empty() {
        for (m, e) in &failed {
            let id = m.message_id().unwrap_or(&m.broker_msg_id).to_owned();
            record_failures(
                c.pool(),
                c.group(),
                &[(id, m.reconsume_times.max(0))],
                e.class(),
                &e.to_string(),
            )
            .await;
        }
        return ConsumeVerdict::Retry;
    }
    if !bad.is_empty()
        && let Err(e) = quarantine(c.pool(), c.group(), &bad).await
    {
        tracing::warn!(group = c.group(), error = %e, "quarantine write failed; asking for redelivery");
        return ConsumeVerdict::Retry;
    }
    ConsumeVerdict::Ack
}
