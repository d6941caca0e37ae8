//! The micro-batching publisher (docs/architecture.md §6, §6.1, §6.2).
//!
//! Inputs: order-create messages of fresh reservations (already MQ_PENDING in
//! Redis, with their `message_id` fixed). Outputs: one bounded batch send per
//! up to `batch_max` messages or `linger_ms`, and the batch's outcome applied
//! to every reservation in it:
//! - CONFIRMED → `mark_sent` (a CAS on the `message_id`);
//! - UNKNOWN → nothing: the reservation stays pending and the scanner re-sends
//!   the same `message_id` once its `next_retry_at` passes (window 2 of
//!   docs/architecture.md §1). UNKNOWN never compensates;
//! - DEFINITE_FAILURE → SEND_FAILED and one compensation.
//!
//! While the broker is silent the send circuit holds every batch
//! (docs/architecture.md §6.7): nothing is lost, the reservations are
//! pending in Redis and the scanner sends them once a probe gets through.
//!
//! The queue in front of the batcher is bounded; when it is full the message
//! is simply not queued, and the scanner sends it instead. A message that
//! waited in the queue past its reservation's first retry time is likewise
//! left to the scanner, which has claimed it or is about to ([`still_ours`]).
//! A crash loses nothing either: Redis holds every pending reservation
//! (window 1).

use crate::config::PublisherConfig;
use crate::decide::circuit::Permit;
use crate::domain::clock::at_ms;
use crate::domain::message::{
    ORDER_CREATE_EVENT, OrderCreateRequested, SCHEMA_VERSION, TraceContext,
};
use crate::domain::stats::PublishStats;
use crate::mq::{
    OutgoingMessage, PROP_MESSAGE_ID, PROP_TRACEPARENT, Producer, SendOutcome, SendReceipt,
};
use crate::pipeline::circuit::SendCircuit;
use crate::pipeline::trail;
use crate::reservation::{MqStatus, Reservation, ReservationStore};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::task::TaskTracker;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Reservation(#[from] crate::reservation::ReservationError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Who sent it, in the body's `producer` field.
pub const PRODUCER_NAME: &str = "seckill-engine";

/// The docs/architecture.md §3.3 body for a reservation. Every send of it, first or re-send,
/// carries the same `message_id`; only `retry_count` moves.
pub fn order_message(r: &Reservation) -> OrderCreateRequested {
    OrderCreateRequested {
        schema_version: SCHEMA_VERSION,
        event_type: ORDER_CREATE_EVENT.to_owned(),
        message_id: r.message_id.clone(),
        message_key: r.reservation_id.clone(),
        request_id: r.request_id.clone(),
        reservation_id: r.reservation_id.clone(),
        order_id: r.order_id.clone(),
        activity_id: r.activity_id,
        sku_id: r.sku_id,
        user_id: r.user_id,
        quantity: 1,
        reservation_created_at: at_ms(r.created_at_ms),
        reservation_valid_until: at_ms(r.valid_until_ms),
        created_at: Utc::now(),
        retry_count: r.send_attempt as i32,
        replay_count: 0,
        producer: PRODUCER_NAME.to_owned(),
        // A new span of the reservation's own trace: every send, the
        // scanner's included, stays in it (docs/architecture.md §11.5).
        trace: TraceContext::child_of(&r.trace_id),
    }
}

/// The broker message: `message_id` as a user property, `reservation_id` as
/// the primary key with `order_id` and `request_id` as extra keys (docs/architecture.md §3).
pub fn to_outgoing(m: &OrderCreateRequested, topic: &str) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.to_owned(),
        tag: "CREATE_ORDER".to_owned(),
        keys: vec![
            m.reservation_id.to_string(),
            m.order_id.to_string(),
            m.request_id.to_string(),
        ],
        properties: vec![
            (PROP_MESSAGE_ID.to_owned(), m.message_id.to_string()),
            (PROP_TRACEPARENT.to_owned(), m.trace.traceparent.clone()),
        ],
        body: serde_json::to_vec(m).unwrap_or_default(),
        deliver_time_ms: None,
    }
}

/// Sends one batch (or one message when the batch has one) and returns the
/// outcome every member takes.
pub async fn send_batch<P: Producer>(
    producer: &P,
    topic: &str,
    batch: &[OrderCreateRequested],
    timeout: Duration,
    stats: &PublishStats,
) -> SendOutcome {
    let started = Instant::now();
    let mut msgs: Vec<OutgoingMessage> = batch.iter().map(|m| to_outgoing(m, topic)).collect();
    let outcome = if msgs.len() == 1 {
        producer.send(msgs.remove(0), timeout).await
    } else {
        producer.send_batch(msgs, timeout).await
    };
    stats.send_latency.record(started.elapsed());
    stats.batches.add(1);
    trail::sent(topic, batch, &outcome, started.elapsed());
    let n = batch.len() as u64;
    match &outcome {
        SendOutcome::Confirmed(_) => stats.confirmed.add(n),
        SendOutcome::Unknown { .. } => stats.unknown.add(n),
        SendOutcome::DefiniteFailure { .. } => stats.definite_failure.add(n),
    }
    outcome
}

/// A definite send failure on a reservation that no earlier attempt can
/// have stored: one compensation task (written first, so a crash after it
/// leaves a PENDING task for the compensation worker rather than a leak),
/// SEND_FAILED, and the Redis stock given back (the release script is
/// idempotent; the task's primary key makes it unique per reservation).
pub async fn compensate_send_failure(
    store: &ReservationStore,
    pool: &PgPool,
    m: &OrderCreateRequested,
    detail: &str,
) -> Result<(), PublishError> {
    tracing::error!(
        message_id = %m.message_id, reservation_id = %m.reservation_id, error = detail,
        "definite send failure; compensating"
    );
    sqlx::query(
        "INSERT INTO compensation_tasks (reservation_id, activity_id, sku_id, user_id, source, reason)
         VALUES ($1, $2, $3, $4, 'SEND_FAILURE', $5) ON CONFLICT (reservation_id) DO NOTHING",
    )
    .bind(&m.reservation_id)
    .bind(m.activity_id)
    .bind(m.sku_id)
    .bind(m.user_id)
    .bind(detail)
    .execute(pool)
    .await?;
    store
        .mark_send_failed(m.activity_id, &m.reservation_id, &m.message_id, detail)
        .await?;
    store.release(m.activity_id, &m.reservation_id).await?;
    sqlx::query(
        "UPDATE compensation_tasks SET status = 'RELEASED', released_at = now()
         WHERE reservation_id = $1 AND status = 'PENDING'",
    )
    .bind(&m.reservation_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// A confirmed batch: every reservation MQ_SENT, with the broker's id.
/// The first send and the scanner's re-send both record it here.
pub async fn mark_sent(
    store: &ReservationStore,
    batch: &[OrderCreateRequested],
    receipt: &SendReceipt,
) -> Result<(), PublishError> {
    let items: Vec<_> = batch
        .iter()
        .map(|m| {
            (
                m.activity_id,
                m.reservation_id.clone(),
                m.message_id.clone(),
            )
        })
        .collect();
    store.mark_sent_many(&items, &receipt.broker_msg_id).await?;
    Ok(())
}

/// Applies a batch outcome on the in-process (first) send path.
async fn apply_first_send(
    store: &ReservationStore,
    pool: &PgPool,
    batch: &[OrderCreateRequested],
    outcome: &SendOutcome,
) -> Result<(), PublishError> {
    match outcome {
        SendOutcome::Confirmed(r) => mark_sent(store, batch, r).await?,
        // Stays MQ_PENDING with its first retry time: the scanner re-sends
        // (`trail::sent` logged it, with the batch's ids).
        SendOutcome::Unknown { .. } => {}
        SendOutcome::DefiniteFailure { detail, .. } => {
            for m in batch {
                // Only a reservation that nothing else has touched is known
                // never to have been stored; once the scanner has claimed or
                // re-sent it, an earlier copy may be on the broker, and the
                // scanner's expiry path decides (docs/architecture.md §1, window 2).
                let untouched = store
                    .get(m.activity_id, &m.reservation_id)
                    .await?
                    .is_some_and(|r| r.mq_status == MqStatus::MqPending && r.send_attempt == 0);
                if untouched {
                    compensate_send_failure(store, pool, m, detail).await?;
                } else {
                    tracing::error!(reservation_id = %m.reservation_id, error = %detail,
                        "definite send failure on a reservation the scanner owns; left to it");
                }
            }
        }
    }
    Ok(())
}

/// Whether the first-send path should still send `m`, at `now`. Its
/// reservation went into Redis due for a scanner re-send at `created +
/// hand_over_after`; past that moment the scanner owns it, and a send from
/// here too would only put a second copy on the broker. When sends are slower
/// than ingress (batch size 1 here: 7,588 of 10,000 reservations were sent
/// twice, issue 3), that doubled the broker's and the consumer's work just
/// when they were behind. Skipping is safe: the reservation is still
/// MQ_PENDING in Redis until a send is confirmed.
pub fn still_ours(m: &OrderCreateRequested, now: DateTime<Utc>, hand_over_after: Duration) -> bool {
    let waited = now.signed_duration_since(m.reservation_created_at);
    waited.to_std().map_or(true, |w| w < hand_over_after)
}

/// Handle to the running publisher: cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    tx: mpsc::Sender<OrderCreateRequested>,
}

impl Publisher {
    /// Queues a message for the next batch. `false` when the queue is full:
    /// the reservation is still pending in Redis and the scanner sends it.
    pub fn offer(&self, m: OrderCreateRequested) -> bool {
        self.tx.try_send(m).is_ok()
    }
}

/// Everything the publisher needs.
pub struct PublisherDeps<P> {
    pub producer: P,
    pub store: ReservationStore,
    pub pool: PgPool,
    pub topic: String,
    pub send_timeout: Duration,
    pub stats: Arc<PublishStats>,
    /// The scanner's first retry delay (`scanner.first_retry_after_ms`).
    pub hand_over_after: Duration,
    /// Shared with the scanner: no sends while the broker is silent.
    pub circuit: Arc<SendCircuit>,
}

/// Starts the batching loop on `tracker`. It runs until every [`Publisher`]
/// handle is dropped (the HTTP server has drained), then flushes what is
/// still queued and ends once the batches in flight finish.
pub fn spawn<P: Producer>(
    deps: PublisherDeps<P>,
    cfg: &PublisherConfig,
    tracker: &TaskTracker,
) -> Publisher {
    let (tx, mut rx) = mpsc::channel::<OrderCreateRequested>(cfg.queue_capacity.max(1));
    let max = cfg.batch_max.max(1);
    let linger = Duration::from_millis(cfg.linger_ms);
    let in_flight = Arc::new(Semaphore::new(cfg.in_flight.max(1)));
    let deps = Arc::new(deps);
    let inner = tracker.clone();
    tracker.spawn(async move {
        while let Some(first) = rx.recv().await {
            let mut batch = vec![first];
            let deadline = tokio::time::Instant::now() + linger;
            while batch.len() < max {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => tokio::select! {
                        m = rx.recv() => match m { Some(m) => batch.push(m), None => break },
                        _ = tokio::time::sleep_until(deadline) => break,
                    },
                }
            }
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                break;
            };
            let now = Utc::now();
            let queued = batch.len();
            batch.retain(|m| still_ours(m, now, deps.hand_over_after));
            deps.stats
                .handed_to_scanner
                .add((queued - batch.len()) as u64);
            if batch.is_empty() {
                continue;
            }
            let deps = deps.clone();
            let span = tracing::info_span!("publish", n = batch.len());
            trail::link(&span, batch.iter().map(|m| m.trace.traceparent.as_str()));
            inner.spawn(tracing::Instrument::instrument(async move {
                // Held: the batch stays pending in Redis, due for the
                // scanner at its first retry time, which sends it once the
                // circuit closes (docs/architecture.md §6.7).
                if deps.circuit.permit(batch.len()) == Permit::Hold {
                    drop(permit);
                    return;
                }
                let outcome = send_batch(
                    &deps.producer,
                    &deps.topic,
                    &batch,
                    deps.send_timeout,
                    &deps.stats,
                )
                .await;
                deps.circuit.record(&outcome);
                if let Err(e) = apply_first_send(&deps.store, &deps.pool, &batch, &outcome).await {
                    // Confirmed or not, the reservations are still pending in
                    // Redis, and the scanner re-sends them.
                    tracing::error!(error = %e, n = batch.len(), "could not record a send outcome");
                }
                drop(permit);
            }, span));
        }
    });
    Publisher { tx }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::{
        ActivityId, MessageId, OrderId, RequestId, ReservationId, SkuId, UserId,
    };

    fn reservation(created_at_ms: i64) -> Reservation {
        let reservation_id = ReservationId::generate();
        Reservation {
            trace_id: crate::domain::trace::TraceId::of_reservation(&reservation_id),
            reservation_id,
            message_id: MessageId::generate(),
            request_id: RequestId::generate(),
            order_id: OrderId::generate(),
            activity_id: ActivityId(1),
            sku_id: SkuId(1),
            user_id: UserId(7),
            mq_status: MqStatus::MqPending,
            send_attempt: 0,
            next_retry_at_ms: created_at_ms + 5_000,
            lease_owner: None,
            lease_until_ms: 0,
            created_at_ms,
            valid_until_ms: created_at_ms + 300_000,
            broker_message_id: None,
            last_error: None,
        }
    }

    #[test]
    fn a_message_queued_past_its_first_retry_is_the_scanners() {
        let created = Utc::now().timestamp_millis();
        let m = order_message(&reservation(created));
        let at = |ms: i64| at_ms(created + ms);
        let after = Duration::from_secs(5);
        assert!(still_ours(&m, at(0), after));
        assert!(still_ours(&m, at(4_999), after));
        assert!(
            !still_ours(&m, at(5_000), after),
            "the scanner claims it now"
        );
        assert!(!still_ours(&m, at(60_000), after));
        // A clock that reads earlier than the reservation: still ours.
        assert!(still_ours(&m, at(-1_000), after));
    }
}
