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
use crate::pipeline::trail;
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

impl Settled {
    /// Its word in the logs (docs/architecture.md §11.3).
    pub fn name(&self) -> &'static str {
        match self {
            Settled::AlreadyProcessed => "ALREADY_PROCESSED",
            Settled::Done(CancelOutcome::Canceled { .. }) => "CANCELED",
            Settled::Done(CancelOutcome::NoOp { reason, .. }) => reason.as_str(),
            Settled::Rearmed { .. } => "REARMED",
        }
    }
}

#[derive(Clone)]
pub struct CancelConsumer {
    pool: PgPool,
    names: Names,
    group: String,
    stats: Arc<LifecycleStats>,
    /// How long a message that came before its `deliver_at` is held for it
    /// (the outbox asks the broker for it early, docs/architecture.md §8.2);
    /// zero holds nothing.
    hold_max: chrono::Duration,
}

impl CancelConsumer {
    pub fn new(pool: PgPool, names: Names, stats: Arc<LifecycleStats>) -> Self {
        Self {
            group: names.group(TopicKind::OrderTimeout),
            pool,
            names,
            stats,
            hold_max: chrono::Duration::zero(),
        }
    }

    /// Holds early messages up to `hold_max` for their `deliver_at`.
    pub fn with_hold(mut self, hold_max: chrono::Duration) -> Self {
        self.hold_max = hold_max;
        self
    }

    /// Waits until the latest `deliver_at` of the batch if it is near
    /// (within `hold_max`): the broker was asked for these messages early
    /// so that they are in hand at their deadline. Further out, the message
    /// is early for another reason (a broker timer firing early) and is
    /// settled now, as NOT_YET_DUE with one re-arm. A little past the
    /// deadline, so PostgreSQL's clock agrees it is due.
    async fn hold_until_due(&self, due: impl Iterator<Item = DateTime<Utc>>) {
        let Some(latest) = due.max() else { return };
        let wait = latest - Utc::now() + chrono::Duration::milliseconds(20);
        if wait > chrono::Duration::zero() && wait <= self.hold_max {
            tokio::time::sleep(wait.to_std().unwrap_or_default()).await;
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
        let one = [(msg.clone(), delivery_attempt, replay_id.map(str::to_owned))];
        let mut settled = self.process_batch(&one).await?;
        Ok(settled.pop().expect("one message in, one verdict out"))
    }

    /// Settles a listener batch in one transaction: each message's inbox
    /// claim, conditional cancel and outbox rows, then the units of every
    /// canceled order added to `inventory` at once ([`order::StockOwed`]),
    /// so the SKU's row is locked for one statement and the commit, not for
    /// the batch. A sale's deadlines come in a burst, and one transaction
    /// per message held that row for each commit in turn
    /// (docs/architecture.md §8.2). All or nothing: a failure leaves no
    /// message of the batch settled.
    pub async fn process_batch(
        &self,
        batch: &[(CancelOrderIfUnpaid, i32, Option<String>)],
    ) -> Result<Vec<Settled>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let mut owed = order::StockOwed::default();
        let mut out = Vec::with_capacity(batch.len());
        for (msg, attempt, replay_id) in batch {
            let s = self
                .settle_in(&mut tx, msg, *attempt, replay_id.as_deref(), &mut owed)
                .await?;
            out.push(s);
        }
        owed.give_back(&mut tx).await?;
        tx.commit().await?;
        for s in &out {
            self.count(s);
        }
        Ok(out)
    }

    async fn settle_in(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        msg: &CancelOrderIfUnpaid,
        delivery_attempt: i32,
        replay_id: Option<&str>,
        owed: &mut order::StockOwed,
    ) -> Result<Settled, sqlx::Error> {
        let id = msg.message_id.as_str();
        if !inbox::claim(tx, &self.group, id, delivery_attempt, replay_id).await? {
            return Ok(Settled::AlreadyProcessed);
        }
        let out = order::cancel_owing(
            tx,
            &self.names,
            &msg.order_id,
            CancelMode::IfDue,
            PAY_TIMEOUT,
            id,
            owed,
        )
        .await?;
        let settled = match out {
            CancelOutcome::NoOp {
                reason: CancelNoop::NotYetDue,
                order: Some(o),
            } if msg.retry_count < MAX_REARMS => {
                let next = rearm(&self.names, msg, o.expires_at, o.tx_now);
                order::insert_outbox(tx, &[next]).await?;
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
        inbox::finish(tx, &self.group, id, InboxStatus::Succeeded, code).await?;
        Ok(settled)
    }

    fn count(&self, settled: &Settled) {
        match settled {
            Settled::Done(CancelOutcome::Canceled { .. }) => self.stats.canceled.add(1),
            Settled::Done(CancelOutcome::NoOp { reason, .. }) => {
                self.stats.cancel_noop(*reason).add(1)
            }
            Settled::Rearmed { .. } => self.stats.cancel_noop(CancelNoop::NotYetDue).add(1),
            Settled::AlreadyProcessed => self.stats.cancel_duplicates.add(1),
        }
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
        trail::settled(
            &self.group,
            m,
            &msg.reservation_id,
            Some(&msg.order_id),
            settled.name(),
        );
        Ok(())
    }
}

impl Handler for CancelConsumer {
    /// The whole batch in one transaction; if it fails, or a body is bad,
    /// one message at a time, so that one bad message neither blocks the
    /// others nor goes unrecorded (the inbox makes the retry of a settled
    /// one a no-op).
    async fn handle(&self, batch: Vec<IncomingMessage>) -> ConsumeVerdict {
        let parsed: Option<Vec<_>> = batch
            .iter()
            .map(|m| {
                let msg = parse_cancel(&m.body).ok()?;
                let replay = m.property(PROP_REPLAY_ID).map(str::to_owned);
                Some((msg, m.reconsume_times.max(0), replay))
            })
            .collect();
        match &parsed {
            Some(items) => {
                self.hold_until_due(items.iter().map(|i| i.0.deliver_at))
                    .await
            }
            None => {
                let due = batch.iter().filter_map(|m| parse_cancel(&m.body).ok());
                self.hold_until_due(due.map(|m| m.deliver_at)).await
            }
        }
        if let Some(items) = parsed.filter(|i| i.len() > 1) {
            match self.process_batch(&items).await {
                Ok(_) => return ConsumeVerdict::Ack,
                Err(e) => tracing::warn!(
                    group = %self.group, messages = items.len(), error = %e,
                    "the batch's cancel transaction failed; settling its messages one by one"
                ),
            }
        }
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
