//! The delayed cancel (docs/architecture.md §8, §8.3): the consumer of
//! ORDER_TIMEOUT and the sweep behind it.
//!
//! A cancel delivered late simply cancels (the conditional update does not
//! care how late); delivered twice, the inbox makes the second a no-op;
//! delivered early (NOT_YET_DUE), it changes nothing and re-arms one new
//! timer message for `expires_at`, so the order still cancels on time. The
//! sweep cancels unpaid orders that are overdue by more than a grace
//! period, whatever happened to their messages.

use super::{SettleEach, SettleError, handle_each, inbox};
use crate::domain::ids::MessageId;
use crate::domain::message::{
    CANCEL_EVENT, CancelOrderIfUnpaid, Malformed, SCHEMA_VERSION, parse_cancel,
};
use crate::domain::stats::LifecycleStats;
use crate::domain::status::InboxStatus;
use crate::mq::{ConsumeVerdict, Handler, IncomingMessage, Names, PROP_REPLAY_ID, TopicKind};
use crate::pipeline::order::{self, CancelMode, CancelNoop, CancelOutcome, OutboxRow};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

/// `cancel_reason` of an order whose pay window ran out.
pub const PAY_TIMEOUT: &str = "PAY_TIMEOUT";
/// Result code of an early cancel that queued its successor.
pub const REARMED: &str = "NOT_YET_DUE_REARMED";
/// Re-arms per order before the sweep is left to it: a broker whose timers
/// fire early would otherwise bounce the message forever.
const MAX_REARMS: i32 = 5;

/// What became of one cancel message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Consumed before: nothing written.
    AlreadyProcessed,
    Done(CancelOutcome),
    /// Early: nothing changed, and a new timer message was queued.
    Rearmed {
        deliver_at: DateTime<Utc>,
    },
}

#[derive(Clone)]
pub struct CancelConsumer {
    pool: PgPool,
    names: Names,
    group: String,
    stats: Arc<LifecycleStats>,
}

impl CancelConsumer {
    pub fn new(pool: PgPool, names: Names, stats: Arc<LifecycleStats>) -> Self {
        Self {
            group: names.group(TopicKind::OrderTimeout),
            pool,
            names,
            stats,
        }
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// Settles one cancel message in one transaction.
    pub async fn process(
        &self,
        msg: &CancelOrderIfUnpaid,
        delivery_attempt: i32,
        replay_id: Option<&str>,
    ) -> Result<Settled, sqlx::Error> {
        let id = msg.message_id.as_str();
        let mut tx = self.pool.begin().await?;
        if !inbox::claim(&mut tx, &self.group, id, delivery_attempt, replay_id).await? {
            tx.rollback().await?;
            return Ok(Settled::AlreadyProcessed);
        }
        let out = order::cancel_in(
            &mut tx,
            &self.names,
            &msg.order_id,
            CancelMode::IfDue,
            PAY_TIMEOUT,
            id,
        )
        .await?;
        let settled = match out {
            CancelOutcome::NoOp {
                reason: CancelNoop::NotYetDue,
                order: Some(o),
            } if msg.retry_count < MAX_REARMS => {
                let next = rearm(&self.names, msg, o.expires_at, o.tx_now);
                order::insert_outbox(&mut tx, &[next]).await?;
                Settled::Rearmed {
                    deliver_at: o.expires_at,
                }
            }
            out => Settled::Done(out),
        };
        let code = match &settled {
            Settled::Done(CancelOutcome::Canceled { .. }) => "CANCELED",
            Settled::Done(CancelOutcome::NoOp { reason, .. }) => reason.as_str(),
            Settled::Rearmed { .. } => REARMED,
            Settled::AlreadyProcessed => unreachable!("returned above"),
        };
        inbox::finish(&mut tx, &self.group, id, InboxStatus::Succeeded, code).await?;
        tx.commit().await?;
        match &settled {
            Settled::Done(CancelOutcome::Canceled { .. }) => self.stats.canceled.add(1),
            Settled::Done(CancelOutcome::NoOp { reason, .. }) => {
                self.stats.cancel_noop(*reason).add(1)
            }
            Settled::Rearmed { .. } => self.stats.cancel_noop(CancelNoop::NotYetDue).add(1),
            Settled::AlreadyProcessed => {}
        }
        Ok(settled)
    }
}

/// The successor of an early cancel: a new message (its own `message_id`,
/// since the inbox already holds this one) for the same order at
/// `expires_at`. A duplicate successor is harmless: the cancel is
/// conditional.
fn rearm(
    names: &Names,
    msg: &CancelOrderIfUnpaid,
    expires_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> OutboxRow {
    let id = MessageId::generate();
    let next = CancelOrderIfUnpaid {
        schema_version: SCHEMA_VERSION,
        event_type: CANCEL_EVENT.to_owned(),
        message_id: id.clone(),
        deliver_at: expires_at,
        created_at: now,
        retry_count: msg.retry_count + 1,
        ..msg.clone()
    };
    OutboxRow {
        message_id: id,
        topic: names.topic(TopicKind::OrderTimeout),
        tag: crate::domain::message::TAG_CANCEL_IF_UNPAID,
        key: msg.order_id.to_string(),
        payload: crate::domain::message::json(&next),
        deliver_at: Some(expires_at),
    }
}

impl SettleEach for CancelConsumer {
    type Msg = CancelOrderIfUnpaid;

    fn group(&self) -> &str {
        &self.group
    }

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn parse(m: &IncomingMessage) -> Result<CancelOrderIfUnpaid, Malformed> {
        parse_cancel(&m.body)
    }

    async fn settle(
        &self,
        msg: CancelOrderIfUnpaid,
        m: &IncomingMessage,
    ) -> Result<(), SettleError> {
        let settled = self
            .process(&msg, m.reconsume_times.max(0), m.property(PROP_REPLAY_ID))
            .await?;
        tracing::debug!(order_id = %msg.order_id, ?settled, "cancel settled");
        Ok(())
    }
}

impl Handler for CancelConsumer {
    async fn handle(&self, batch: Vec<IncomingMessage>) -> ConsumeVerdict {
        handle_each(self, batch).await
    }
}

/// One sweep pass: cancels up to `limit` unpaid orders overdue by more
/// than `grace`. Returns how many it canceled (a cancel message may win
/// any of them first; that is a no-op here).
pub async fn sweep_once(
    pool: &PgPool,
    names: &Names,
    grace: Duration,
    limit: i64,
    stats: &LifecycleStats,
) -> Result<usize, sqlx::Error> {
    let mut canceled = 0;
    for id in order::overdue(pool, grace, limit).await? {
        if let CancelOutcome::Canceled { order } =
            order::cancel(pool, names, &id, CancelMode::IfDue, PAY_TIMEOUT).await?
        {
            tracing::warn!(
                order_id = %order.order_id, expires_at = %order.expires_at,
                "sweep canceled an unpaid order its delayed cancel had missed"
            );
            canceled += 1;
        }
    }
    stats.sweep_canceled.add(canceled as u64);
    Ok(canceled)
}
