//! The order-create consumer (docs/architecture.md §7): one READ COMMITTED PostgreSQL
//! transaction per listener batch, then ACK.
//!
//! Inputs: [`IncomingMessage`]s of the ORDER_CREATE topic (docs/architecture.md §3.3
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
mod plan;
pub mod sql;
mod tx;

pub use decide::{
    Decision, classify, classify_db_error, classify_sqlstate, db_failure_class, failure_class,
    may_be_one_message, verdict,
};
pub use tx::rehearse_in;

use crate::domain::ids::{ActivityId, OrderId, SkuId};
use crate::domain::message::{Malformed, OrderCreateRequested, parse_order_create};
use crate::domain::stats::ConsumeStats;
use crate::domain::status::{FailureClass, ReservationOutcome};
use crate::domain::trace::TraceId;
use crate::mq::{
    ConsumeVerdict, Handler, IncomingMessage, Names, PROP_REPLAY_ID, PROP_TRACEPARENT, TopicKind,
};
use crate::pipeline::concurrency::Limiter;
use crate::pipeline::trail;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Instant;

/// A valid order-create message with its delivery facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub msg: OrderCreateRequested,
    /// The broker's reconsume count: 0 on first delivery (docs/architecture.md §3).
    pub delivery_attempt: i32,
    /// Set when an operator replayed the message (docs/architecture.md §9.4).
    pub replay_id: Option<String>,
    /// Where the broker delivered it from, for the logs (§11.3).
    pub queue: Option<(i32, i64)>,
}

impl Parsed {
    /// The reservation's trace: the body's, when it is a valid W3C trace
    /// id, else the one derived from the reservation id, as the ingress
    /// does (docs/architecture.md §11.5).
    pub fn trace_id(&self) -> TraceId {
        TraceId::parse(&self.msg.trace.trace_id)
            .unwrap_or_else(|| TraceId::of_reservation(&self.msg.reservation_id))
    }

    /// A first delivery, not a replay.
    pub fn new(msg: OrderCreateRequested) -> Self {
        Self {
            msg,
            delivery_attempt: 0,
            replay_id: None,
            queue: None,
        }
    }

    /// Parses a delivered message; a [`Malformed`] one goes to quarantine.
    pub fn from_incoming(m: &IncomingMessage) -> Result<Self, Malformed> {
        Ok(Self {
            msg: parse_order_create(&m.body)?,
            delivery_attempt: m.reconsume_times.max(0),
            replay_id: m.property(PROP_REPLAY_ID).map(str::to_owned),
            queue: Some((m.queue_id, m.queue_offset)),
        })
    }
}

/// Why a reservation was turned down; each one is compensated once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    NoStock,
    /// The user already holds a valid order in this activity.
    DuplicateUser,
    /// The message arrived after `reservation_valid_until` (docs/architecture.md §4.4).
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

impl MessageOutcome {
    /// Its name in the logs (docs/architecture.md §11.3).
    pub fn name(&self) -> &'static str {
        match self {
            MessageOutcome::Created { .. } => "CREATED",
            MessageOutcome::AlreadyProcessed => "ALREADY_PROCESSED",
            MessageOutcome::DuplicateReservation => "DUPLICATE_RESERVATION",
            MessageOutcome::Rejected(r) => r.outcome().as_str(),
        }
    }
}

/// Why a batch's transaction did not commit. Nothing of it was written.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    /// No `inventory` row for a message's (activity, sku). A configuration
    /// error, not "no stock": rejecting would compensate reservations that
    /// may be sellable. The handler retries that SKU's messages (committing
    /// the rest of the batch) and, unless an operator adds the row, the
    /// broker dead-letters them to be ticketed (docs/architecture.md §9).
    #[error(
        "no inventory row for activity {activity_id} sku {sku_id}: a configuration error; create it (`seckillctl activity create`), then the retry or a DLQ replay creates the order"
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
    stats: Arc<ConsumeStats>,
    /// The adaptive gate inside the PostgreSQL budget (docs/architecture.md §10.10); none
    /// means the listener threads are the only bound.
    limiter: Option<Arc<Limiter>>,
}

impl OrderConsumer {
    pub fn new(pool: PgPool, names: Names) -> Self {
        Self {
            group: names.group(TopicKind::OrderCreate),
            pool,
            names,
            stats: Arc::default(),
            limiter: None,
        }
    }

    /// Counts into `stats` (the daemon's `/metrics`).
    pub fn with_stats(mut self, stats: Arc<ConsumeStats>) -> Self {
        self.stats = stats;
        self
    }

    /// Passes `limiter` before every transaction.
    pub fn with_limiter(mut self, limiter: Arc<Limiter>) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// The consumer group: the inbox namespace.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Runs the order transaction for `msgs` and commits it. One outcome per
    /// message, in input order. On error nothing was committed.
    pub async fn process(&self, msgs: &[Parsed]) -> Result<Vec<MessageOutcome>, ProcessError> {
        let _permit = match &self.limiter {
            Some(l) => Some(l.acquire().await),
            None => None,
        };
        let started = Instant::now();
        let result = tx::process(&self.pool, &self.group, &self.names, msgs, &self.stats).await;
        self.stats.tx_latency.record(started.elapsed());
        match &result {
            Ok(outcomes) => self.count(outcomes),
            Err(e) => match failure_class(e) {
                FailureClass::DbDeadlock => self.stats.deadlocks.add(1),
                FailureClass::DbSerialization => self.stats.serialization_failures.add(1),
                _ => {}
            },
        }
        result
    }

    fn count(&self, outcomes: &[MessageOutcome]) {
        let s = &self.stats;
        for o in outcomes {
            match o {
                MessageOutcome::Created { .. } => s.created.add(1),
                MessageOutcome::AlreadyProcessed => s.duplicates.add(1),
                MessageOutcome::DuplicateReservation => s.duplicate_reservation.add(1),
                MessageOutcome::Rejected(RejectReason::NoStock) => s.rejected_no_stock.add(1),
                MessageOutcome::Rejected(RejectReason::DuplicateUser) => {
                    s.rejected_duplicate_user.add(1)
                }
                MessageOutcome::Rejected(RejectReason::Expired) => s.rejected_expired.add(1),
            }
        }
    }

    /// Best effort: the failure is already on its way back to the broker.
    /// After a batch failed for a reason that may be one message's (a
    /// constraint, a trigger, a bad row), each message runs in its own
    /// transaction: the good ones commit now, and only the failing ones are
    /// retried and, in the end, dead-lettered. Without this one poison
    /// message took its whole batch through every retry, and the innocent
    /// ones that were redelivered beside it on the last attempt went to the
    /// DLQ with no order (the poison drill, docs/architecture.md §7).
    /// Returns the messages that failed alone, their failures recorded.
    async fn one_by_one(&self, batch: Vec<Parsed>) -> Vec<Parsed> {
        let mut failed = Vec::new();
        for p in batch {
            let started = Instant::now();
            match self.process(std::slice::from_ref(&p)).await {
                Ok(outcomes) => self.log_committed(std::slice::from_ref(&p), &outcomes, started),
                Err(e) => {
                    let (class, detail) = (failure_class(&e), e.to_string());
                    tracing::warn!(
                        group = %self.group, message_id = %p.msg.message_id, class = %class,
                        error = %detail, "order message failed on its own; asking for redelivery"
                    );
                    self.record_failures(std::slice::from_ref(&p), class, &detail)
                        .await;
                    failed.push(p);
                }
            }
        }
        failed
    }

    /// The committed transaction's log lines (docs/architecture.md §11.3).
    fn log_committed(&self, msgs: &[Parsed], outcomes: &[MessageOutcome], started: Instant) {
        let mut tally = trail::Tally::default();
        for o in outcomes {
            match o {
                MessageOutcome::Created { .. } => tally.created += 1,
                MessageOutcome::Rejected(_) => tally.rejected += 1,
                _ => tally.duplicates += 1,
            }
        }
        let topic = self.names.topic(TopicKind::OrderCreate);
        let each = msgs.iter().zip(outcomes).map(|(p, o)| trail::Consumed {
            msg: &p.msg,
            trace_id: p.trace_id(),
            queue: p.queue.map(|q| q.0),
            offset: p.queue.map(|q| q.1),
            retry_count: p.delivery_attempt,
            outcome: o.name(),
        });
        trail::consumed(&self.group, &topic, tally, started.elapsed(), each);
    }

    async fn record_failures(&self, msgs: &[Parsed], class: FailureClass, detail: &str) {
        let failed: Vec<(String, i32)> = msgs
            .iter()
            .map(|p| (p.msg.message_id.to_string(), p.delivery_attempt))
            .collect();
        record_failures(&self.pool, &self.group, &failed, class, detail).await;
    }
}

/// Writes a batch's bad messages to `message_quarantine`, in one statement.
/// Every consumer quarantines through here.
pub async fn quarantine(
    pool: &PgPool,
    group: &str,
    bad: &[(&IncomingMessage, Malformed)],
) -> Result<(), sqlx::Error> {
    for (m, e) in bad {
        tracing::warn!(
            group,
            broker_msg_id = %m.broker_msg_id,
            message_id = m.message_id().unwrap_or("-"),
            reason = %e.reason,
            detail = %e.detail,
            "quarantining a malformed message"
        );
    }
    let props: Vec<serde_json::Value> = bad
        .iter()
        .map(|(m, _)| serde_json::to_value(&m.properties).unwrap_or_default())
        .collect();
    sqlx::query(sql::QUARANTINE)
        .bind(group)
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
        .execute(pool)
        .await?;
    Ok(())
}

/// Records the failure behind a retry, one row per (message_id, delivery
/// attempt), for the DLQ governor's error class (docs/architecture.md §9.1). Best
/// effort: the retry goes ahead either way.
pub async fn record_failures(
    pool: &PgPool,
    group: &str,
    failed: &[(String, i32)],
    class: FailureClass,
    detail: &str,
) {
    let result = sqlx::query(sql::RECORD_FAILURES)
        .bind(group)
        .bind(failed.iter().map(|f| f.0.as_str()).collect::<Vec<_>>())
        .bind(failed.iter().map(|f| f.1).collect::<Vec<_>>())
        .bind(class)
        .bind(detail)
        .execute(pool)
        .await;
    if let Err(e) = result {
        tracing::warn!(
            group,
            messages = failed.len(),
            error = %e,
            "could not record consumer failures; the retry goes ahead"
        );
    }
}

impl Handler for OrderConsumer {
    /// Neither a bad body nor a misconfigured SKU poisons the batch. The
    /// valid messages run in one transaction; if it fails for lack of an
    /// inventory row, that SKU's messages are set aside (to be retried,
    /// then dead-lettered) and the rest run again, so their orders are not
    /// held hostage. Bad bodies are quarantined last. ACK only when
    /// everything is durable (docs/architecture.md §7: commit, then ACK); a retry
    /// redelivers the whole batch, and the inbox turns what was committed
    /// into no-ops.
    async fn handle(&self, batch: Vec<IncomingMessage>) -> ConsumeVerdict {
        let n = batch.len() as u64;
        let started = Instant::now();
        self.stats.inflight.add(n as i64);
        // One span a stage (docs/architecture.md §11.3): an OpenTelemetry
        // layer turns it into a span of the trace.
        let span = tracing::info_span!("consume", group = %self.group, n);
        trail::link(
            &span,
            batch.iter().filter_map(|m| m.property(PROP_TRACEPARENT)),
        );
        let verdict = tracing::Instrument::instrument(self.handle_batch(batch), span).await;
        self.stats.inflight.add(-(n as i64));
        self.stats.process_latency.record(started.elapsed());
        match verdict {
            ConsumeVerdict::Ack => self.stats.acked.add(n),
            ConsumeVerdict::Retry => self.stats.retried.add(n),
        }
        verdict
    }
}

impl OrderConsumer {
    async fn handle_batch(&self, batch: Vec<IncomingMessage>) -> ConsumeVerdict {
        let mut pending = Vec::with_capacity(batch.len());
        let mut bad = Vec::new();
        for m in &batch {
            match Parsed::from_incoming(m) {
                Ok(p) => pending.push(p),
                Err(e) => bad.push((m, e)),
            }
        }

        let mut decisions: Vec<Decision> = Vec::with_capacity(2 + bad.len());
        // Each pass either commits or sets aside at least one message, so
        // there are at most as many passes as messages.
        while !pending.is_empty() {
            let started = Instant::now();
            let err = match self.process(&pending).await {
                Ok(outcomes) => {
                    self.log_committed(&pending, &outcomes, started);
                    decisions.push(Decision::Ack);
                    break;
                }
                Err(e) => e,
            };
            let (class, detail) = (failure_class(&err), err.to_string());
            tracing::warn!(
                group = %self.group,
                messages = pending.len(),
                class = %class,
                error = %detail,
                "order batch failed; asking for redelivery"
            );
            let stuck: Vec<Parsed> = match &err {
                ProcessError::MissingInventory {
                    activity_id,
                    sku_id,
                } => {
                    let (stuck, rest) = std::mem::take(&mut pending).into_iter().partition(|p| {
                        p.msg.activity_id == *activity_id && p.msg.sku_id == *sku_id
                    });
                    pending = rest;
                    stuck
                }
                ProcessError::Db(_) if pending.len() > 1 && may_be_one_message(class) => {
                    let failed = self.one_by_one(std::mem::take(&mut pending)).await;
                    if !failed.is_empty() {
                        decisions.push(Decision::Retry { class, detail });
                    }
                    break;
                }
                ProcessError::Db(_) => std::mem::take(&mut pending),
            };
            if stuck.is_empty() {
                // Cannot happen (the error names a message's SKU), but never loop.
                self.record_failures(&pending, class, &detail).await;
                return ConsumeVerdict::Retry;
            }
            self.record_failures(&stuck, class, &detail).await;
            decisions.push(Decision::Retry { class, detail });
        }

        if decisions
            .iter()
            .any(|d| matches!(d, Decision::Retry { .. }))
        {
            // The bad ones are quarantined on the redelivery that ACKs;
            // doing it now would record them twice.
            return ConsumeVerdict::Retry;
        }
        if !bad.is_empty() {
            match quarantine(&self.pool, &self.group, &bad).await {
                Ok(()) => {
                    self.stats.quarantined.add(bad.len() as u64);
                    decisions.extend(bad.into_iter().map(|(_, e)| Decision::Quarantine(e)))
                }
                Err(e) => {
                    tracing::warn!(
                        group = %self.group,
                        error = %e,
                        "quarantine write failed; asking for redelivery"
                    );
                    decisions.push(classify_db_error(&e));
                }
            }
        }
        verdict(&decisions)
    }
}
