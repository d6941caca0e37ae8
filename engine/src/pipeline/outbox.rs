//! The outbox publisher (docs/architecture.md §8, §8.6): sends what the order,
//! pay and cancel transactions committed to `event_outbox`.
//!
//! Inputs: PENDING `event_outbox` rows whose `next_attempt_at` has passed.
//! Outputs: broker messages (the delayed cancel as a timer message at
//! `deliver_at`, order events and releases in batches per topic), and each
//! row's send outcome written back: SENT, or PENDING again with a backoff.
//!
//! Claiming is `FOR UPDATE SKIP LOCKED` plus a lease: the claim pushes
//! `next_attempt_at` forward by `lease_ms` and commits at once, so N
//! instances never claim the same row, and a row whose claimer died is
//! claimed again when the lease lapses. An UNKNOWN send keeps the row
//! PENDING and it is re-sent with the same `message_id` (docs/architecture.md §1,
//! window 2); every consumer of these topics is idempotent on it.

use crate::config::OutboxConfig;
use crate::domain::ids::{MessageId, ReservationId};
use crate::domain::message::TraceContext;
use crate::domain::stats::{ConsumeStats, LifecycleStats};
use crate::domain::trace::TraceId;
use crate::mq::{OutgoingMessage, PROP_MESSAGE_ID, PROP_TRACEPARENT, Producer, SendOutcome};
use crate::reservation::backoff_ms;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Messages per batch request (docs/architecture.md §6: 32 keeps a request small).
const BATCH_SEND_MAX: usize = 32;

/// One claimed row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Claimed {
    pub outbox_id: i64,
    pub message_id: MessageId,
    pub topic: String,
    pub tag: String,
    pub message_key: String,
    pub payload: serde_json::Value,
    pub deliver_at: Option<DateTime<Utc>>,
    /// Including this claim.
    pub attempts: i32,
    /// The trace of the reservation the row is about, as the consumer
    /// stored it (docs/architecture.md §11.5); `None` for rows of
    /// reservations from before traces were stored.
    pub trace_id: Option<String>,
}

/// The broker refuses a timer message whose time has passed by the time it
/// arrives ("timer delivery time is not in the future"), and each refusal
/// cost the row a retry. A time closer than this is moved out to it: the
/// cancel comes at most this late, and is never refused (§8.2).
const TIMER_MARGIN: chrono::Duration = chrono::Duration::seconds(1);

/// When the broker is asked to deliver a row due at `deliver_at` (pure):
/// `lead` before it, so that its consumer has it in hand at `deliver_at`
/// and holds it until then (docs/architecture.md §8.2). `None` sends it for
/// immediate delivery: it is already due (a late publish must not push the
/// cancel further out), or asking for less than [`TIMER_MARGIN`] out would
/// be refused by the broker, and the consumer's hold covers the rest.
pub fn timer_at(
    deliver_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    lead: chrono::Duration,
) -> Option<DateTime<Utc>> {
    let ask = deliver_at? - lead;
    (ask >= now + TIMER_MARGIN).then_some(ask)
}

/// The longest a consumer holds a timer message that came early: the lead
/// and the margin of [`timer_at`], and a little for the broker's clock.
pub fn max_hold(lead: chrono::Duration) -> chrono::Duration {
    lead + TIMER_MARGIN + chrono::Duration::milliseconds(500)
}

impl Claimed {
    /// The reservation's trace: stored, else derived from the payload's
    /// reservation id as the ingress derives it; `None` for a payload
    /// without one.
    pub fn trace(&self) -> Option<TraceId> {
        self.trace_id
            .as_deref()
            .and_then(TraceId::parse)
            .or_else(|| {
                self.payload["reservation_id"]
                    .as_str()
                    .and_then(|r| r.parse::<ReservationId>().ok())
                    .map(|r| TraceId::of_reservation(&r))
            })
    }

    /// The broker message: a timer message for [`timer_at`], or one for
    /// immediate delivery. It carries the reservation's trace as a new
    /// span (docs/architecture.md §11.5).
    pub fn to_outgoing(&self, now: DateTime<Utc>, lead: chrono::Duration) -> OutgoingMessage {
        let mut properties = vec![(PROP_MESSAGE_ID.to_owned(), self.message_id.to_string())];
        if let Some(t) = self.trace() {
            properties.push((
                PROP_TRACEPARENT.to_owned(),
                TraceContext::child_of(&t).traceparent,
            ));
        }
        OutgoingMessage {
            topic: self.topic.clone(),
            tag: self.tag.clone(),
            keys: vec![self.message_key.clone()],
            properties,
            body: serde_json::to_vec(&self.payload).unwrap_or_default(),
            deliver_time_ms: timer_at(self.deliver_at, now, lead)
                .map(|at| at.timestamp_millis() as u64),
        }
    }
}

/// How one pass went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    pub claimed: usize,
    pub sent: usize,
    pub retry: usize,
}

/// Claims up to `limit` due rows for `lease`.
pub async fn claim(
    pool: &PgPool,
    limit: i64,
    lease: Duration,
) -> Result<Vec<Claimed>, sqlx::Error> {
    sqlx::query_as(
        "WITH due AS (
             SELECT outbox_id FROM event_outbox
             WHERE status = 'PENDING' AND next_attempt_at <= now()
             ORDER BY next_attempt_at
             LIMIT $1
             FOR UPDATE SKIP LOCKED
         )
         UPDATE event_outbox o
         SET next_attempt_at = now() + make_interval(secs => $2), attempts = o.attempts + 1
         FROM due
         WHERE o.outbox_id = due.outbox_id
         RETURNING o.outbox_id, o.message_id, o.topic, o.tag, o.message_key, o.payload,
                   o.deliver_at, o.attempts,
                   -- The reservation's trace (§11.5): a primary-key lookup.
                   (SELECT r.trace_id FROM reservations r
                    WHERE r.reservation_id = o.payload->>'reservation_id') AS trace_id",
    )
    .bind(limit)
    .bind(lease.as_secs_f64())
    .fetch_all(pool)
    .await
}

/// Groups a claim into send units: each timer message alone (the broker
/// does not batch them), the rest in batches of one topic and tag.
pub fn plan_sends(rows: Vec<Claimed>, now: DateTime<Utc>) -> Vec<Vec<Claimed>> {
    let mut units = Vec::new();
    let mut by_route: BTreeMap<(String, String), Vec<Claimed>> = BTreeMap::new();
    for r in rows {
        if r.deliver_at.is_some_and(|at| at > now) {
            units.push(vec![r]);
        } else {
            by_route
                .entry((r.topic.clone(), r.tag.clone()))
                .or_default()
                .push(r);
        }
    }
    for (_, rows) in by_route {
        let mut rows = rows.into_iter().peekable();
        while rows.peek().is_some() {
            units.push(rows.by_ref().take(BATCH_SEND_MAX).collect());
        }
    }
    units
}

/// Dependencies of the publisher loop.
#[derive(Clone)]
pub struct OutboxDeps<P: Producer> {
    pub producer: P,
    pub pool: PgPool,
    pub send_timeout: Duration,
    pub stats: Arc<LifecycleStats>,
    /// The order consumer's figures, to yield to it; `None` never yields.
    pub orders: Option<Arc<ConsumeStats>>,
}

/// Where the publisher stands with the order path (docs/architecture.md §10.5 item 4: non-core
/// work yields to the order path). In a burst, the outbox's claims, sends and
/// SENT updates, and the projection and cancel work its events feed, took
/// about a third of the CPU the order consumer needed on two cores (issue 3).
/// None of it is urgent: the order's status is read from PostgreSQL until
/// the projection catches up, and delayed cancels are claimed a minute early.
/// Holding back is bounded, so a sale that never pauses still gets its
/// events: after `yield_to_orders_ms` the outbox drains everything due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Passes run as rows come due.
    Free,
    /// Holding back, since `since`, because orders are being created.
    Holding { since: Instant },
    /// Held back as long as allowed: passes run until one claims less than
    /// a full batch, i.e. until caught up.
    Draining,
}

/// What the loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Pass,
    Hold,
}

impl Turn {
    /// Before a pass: `busy` is whether the order consumer worked since the
    /// last look; `max` the longest hold (zero: never hold).
    pub fn before_pass(self, busy: bool, now: Instant, max: Duration) -> (Turn, Step) {
        match self {
            _ if max.is_zero() => (Turn::Free, Step::Pass),
            Turn::Draining => (Turn::Draining, Step::Pass),
            _ if !busy => (Turn::Free, Step::Pass),
            Turn::Free => (Turn::Holding { since: now }, Step::Hold),
            Turn::Holding { since } if now.saturating_duration_since(since) < max => {
                (self, Step::Hold)
            }
            Turn::Holding { .. } => (Turn::Draining, Step::Pass),
        }
    }

    /// After a pass that claimed a `full` batch or less.
    pub fn after_pass(self, full: bool) -> Turn {
        match self {
            Turn::Draining if !full => Turn::Free,
            t => t,
        }
    }
}

/// Whether the order consumer worked since the last look: a message in hand,
/// or one answered since.
struct OrderPath {
    stats: Arc<ConsumeStats>,
    answered: u64,
}

impl OrderPath {
    fn busy(&mut self) -> bool {
        let answered = self.stats.acked.get() + self.stats.retried.get();
        let busy = self.stats.inflight.get() > 0 || answered != self.answered;
        self.answered = answered;
        busy
    }
}

/// One pass: claim, send, record. Returns what it did; a database error
/// leaves the claimed rows to be re-claimed when their lease lapses.
///
/// The effects run in this order, each step finishing before the next
/// (docs/architecture.md §8.1): the claim commits on its own, so the lease
/// holds while the sends are out; every send is answered (or its task
/// panicked) before anything is written back; then SENT, then the retries.
pub async fn publish_once<P: Producer>(
    deps: &OutboxDeps<P>,
    cfg: &OutboxConfig,
) -> Result<PassReport, sqlx::Error> {
    let rows = claim(
        &deps.pool,
        cfg.batch_max.max(1),
        Duration::from_millis(cfg.lease_ms),
    )
    .await?;
    let mut report = PassReport {
        claimed: rows.len(),
        ..PassReport::default()
    };
    if rows.is_empty() {
        return Ok(report);
    }
    let sends = spawn_sends(deps, cfg, rows, Utc::now());
    let settled = settle_sends(deps, cfg, sends).await;
    report.sent = settled.sent.len();
    report.retry = settled.retry.len();
    mark_sent(&deps.pool, &settled.sent).await?;
    mark_retry(&deps.pool, &settled.retry).await?;
    Ok(report)
}

/// One send unit's task: the rows it carried and how the broker answered.
type SendTask = (Vec<Claimed>, SendOutcome);

/// Starts one task per send unit of [`plan_sends`], at most `in_flight`
/// of them talking to the broker at once (docs/architecture.md §8.1).
fn spawn_sends<P: Producer>(
    deps: &OutboxDeps<P>,
    cfg: &OutboxConfig,
    rows: Vec<Claimed>,
    now: DateTime<Utc>,
) -> JoinSet<SendTask> {
    let mut sends = JoinSet::new();
    let permits = Arc::new(tokio::sync::Semaphore::new(cfg.in_flight.max(1)));
    for unit in plan_sends(rows, now) {
        let (producer, timeout) = (deps.producer.clone(), deps.send_timeout);
        let permits = permits.clone();
        let lead = chrono::Duration::milliseconds(cfg.timer_lead_ms as i64);
        sends.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let outcome = send_unit(&producer, &unit, now, lead, timeout).await;
            (unit, outcome)
        });
    }
    sends
}

/// Sends one unit: a lone message (a timer, or a route's single row) as a
/// plain send, anything more as one batch request.
async fn send_unit<P: Producer>(
    producer: &P,
    unit: &[Claimed],
    now: DateTime<Utc>,
    lead: chrono::Duration,
    timeout: Duration,
) -> SendOutcome {
    let mut msgs: Vec<OutgoingMessage> = unit.iter().map(|r| r.to_outgoing(now, lead)).collect();
    if msgs.len() == 1 {
        producer.send(msgs.remove(0), timeout).await
    } else {
        producer.send_batch(msgs, timeout).await
    }
}

/// What the pass writes back once every send has answered.
#[derive(Debug, Default)]
struct Settled {
    /// Rows to mark SENT.
    sent: Vec<i64>,
    /// Rows to keep PENDING: (outbox_id, backoff in ms, error).
    retry: Vec<(i64, i64, String)>,
}

/// Waits for every send, counting and logging each answer as it arrives.
async fn settle_sends<P: Producer>(
    deps: &OutboxDeps<P>,
    cfg: &OutboxConfig,
    mut sends: JoinSet<SendTask>,
) -> Settled {
    let mut settled = Settled::default();
    while let Some(done) = sends.join_next().await {
        let Ok((unit, outcome)) = done else {
            // A panicked send task: its rows stay claimed until the lease
            // lapses, then they are sent again with the same message_id.
            continue;
        };
        match &outcome {
            SendOutcome::Confirmed(_) => {
                deps.stats.outbox_sent.add(unit.len() as u64);
                settled.sent.extend(unit.iter().map(|r| r.outbox_id));
            }
            SendOutcome::Unknown { detail, .. } | SendOutcome::DefiniteFailure { detail, .. } => {
                settled
                    .retry
                    .extend(not_confirmed(deps, cfg, &unit, &outcome, detail));
            }
        }
    }
    settled
}

/// A unit the broker did not confirm. Neither outcome loses the row
/// (docs/architecture.md §8.1): an UNKNOWN may have been stored (re-send,
/// same id), and a definite failure here (topic missing, no permission) is
/// an operator's to fix; the row waits, with its error, until it goes
/// through. Returns each row's retry.
fn not_confirmed<P: Producer>(
    deps: &OutboxDeps<P>,
    cfg: &OutboxConfig,
    unit: &[Claimed],
    outcome: &SendOutcome,
    detail: &str,
) -> Vec<(i64, i64, String)> {
    let counter = if matches!(outcome, SendOutcome::Unknown { .. }) {
        &deps.stats.outbox_unknown
    } else {
        &deps.stats.outbox_failed
    };
    counter.add(unit.len() as u64);
    tracing::warn!(
        outcome = outcome.label(), rows = unit.len(), topic = %unit[0].topic,
        error = %detail, "outbox send not confirmed; will retry"
    );
    unit.iter()
        .map(|r| {
            let delay = backoff_ms(
                r.attempts.max(1) as u32,
                cfg.backoff_base_ms,
                cfg.backoff_max_ms,
                rand::random::<f64>(),
            );
            (
                r.outbox_id,
                delay as i64,
                format!("{}: {detail}", outcome.label()),
            )
        })
        .collect()
}

/// Marks confirmed rows SENT; nothing to do, no statement.
async fn mark_sent(pool: &PgPool, sent: &[i64]) -> Result<(), sqlx::Error> {
    if !sent.is_empty() {
        sqlx::query(
            "UPDATE event_outbox SET status = 'SENT', sent_at = now(), last_error = NULL
             WHERE outbox_id = ANY($1) AND status = 'PENDING'",
        )
        .bind(sent)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// Pushes unconfirmed rows' next attempt out by their backoff, with the
/// error, in one statement; nothing to do, no statement.
async fn mark_retry(pool: &PgPool, retry: &[(i64, i64, String)]) -> Result<(), sqlx::Error> {
    if !retry.is_empty() {
        sqlx::query(
            "UPDATE event_outbox o
             SET next_attempt_at = now() + make_interval(secs => r.delay_ms / 1000.0), last_error = r.error
             FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS r (outbox_id, delay_ms, error)
             WHERE o.outbox_id = r.outbox_id AND o.status = 'PENDING'",
        )
        .bind(retry.iter().map(|r| r.0).collect::<Vec<_>>())
        .bind(retry.iter().map(|r| r.1).collect::<Vec<_>>())
        .bind(retry.iter().map(|r| r.2.clone()).collect::<Vec<_>>())
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// Runs passes until `cancel`: back to back while claims come back full,
/// otherwise every `poll_ms`.
pub fn spawn<P: Producer>(
    deps: OutboxDeps<P>,
    cfg: OutboxConfig,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) {
    tracker.spawn(async move {
        let idle = Duration::from_millis(cfg.poll_ms.max(1));
        let max_hold = Duration::from_millis(cfg.yield_to_orders_ms);
        let mut orders = deps
            .orders
            .clone()
            .map(|stats| OrderPath { stats, answered: 0 });
        let mut turn = Turn::Free;
        loop {
            let busy = orders.as_mut().is_some_and(OrderPath::busy);
            let (next, step) = turn.before_pass(busy, Instant::now(), max_hold);
            if next != turn && matches!(next, Turn::Holding { .. } | Turn::Draining) {
                tracing::debug!(?next, "outbox yields to the order path");
            }
            turn = next;
            let full = match step {
                Step::Hold => false,
                Step::Pass => {
                    let full = match publish_once(&deps, &cfg).await {
                        Ok(r) => r.claimed as i64 >= cfg.batch_max,
                        Err(e) => {
                            tracing::warn!(error = %e, "outbox pass failed; retrying");
                            false
                        }
                    };
                    turn = turn.after_pass(full);
                    full
                }
            };
            if full && !cancel.is_cancelled() {
                continue;
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(idle) => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, topic: &str, tag: &str, deliver_at: Option<DateTime<Utc>>) -> Claimed {
        Claimed {
            outbox_id: id,
            message_id: MessageId::generate(),
            topic: topic.into(),
            tag: tag.into(),
            message_key: format!("k{id}"),
            payload: serde_json::json!({"n": id}),
            deliver_at,
            attempts: 1,
            trace_id: None,
        }
    }

    #[test]
    fn an_outbox_message_carries_its_reservations_trace() {
        let rsv = ReservationId::generate();
        let traceparent = |c: &Claimed| {
            c.to_outgoing(Utc::now(), chrono::Duration::zero())
                .properties
                .into_iter()
                .find(|(k, _)| k == PROP_TRACEPARENT)
                .map(|(_, v)| v)
        };
        let mut c = row(1, "E", "ORDER_CREATED", None);
        assert_eq!(traceparent(&c), None, "no reservation, no trace");
        c.payload = serde_json::json!({"reservation_id": rsv.to_string()});
        let derived = TraceId::of_reservation(&rsv);
        assert!(traceparent(&c).is_some_and(|t| t.starts_with(&format!("00-{derived}-"))));
        c.trace_id = Some("4bf92f3577b34da6a3ce929d0e0e4736".into());
        assert!(
            traceparent(&c).is_some_and(|t| t.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-")),
            "the stored trace wins"
        );
    }

    #[test]
    fn the_outbox_holds_back_while_orders_are_created_then_drains() {
        let max = Duration::from_secs(5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);

        // Quiet order path: passes run.
        assert_eq!(
            Turn::Free.before_pass(false, t0, max),
            (Turn::Free, Step::Pass)
        );
        // Orders being created: hold, from now.
        let holding = Turn::Holding { since: t0 };
        assert_eq!(Turn::Free.before_pass(true, t0, max), (holding, Step::Hold));
        assert_eq!(
            holding.before_pass(true, at(4_999), max),
            (holding, Step::Hold)
        );
        // The order path went quiet: back to passes at once.
        assert_eq!(
            holding.before_pass(false, at(300), max),
            (Turn::Free, Step::Pass)
        );
        // Held as long as allowed: drain, busy or not, until a short claim.
        let (turn, step) = holding.before_pass(true, at(5_000), max);
        assert_eq!((turn, step), (Turn::Draining, Step::Pass));
        assert_eq!(turn.after_pass(true), Turn::Draining);
        assert_eq!(
            Turn::Draining.before_pass(true, at(6_000), max),
            (Turn::Draining, Step::Pass)
        );
        let caught_up = Turn::Draining.after_pass(false);
        assert_eq!(caught_up, Turn::Free);
        // Then it may hold back again, for a fresh interval.
        assert_eq!(
            caught_up.before_pass(true, at(7_000), max),
            (Turn::Holding { since: at(7_000) }, Step::Hold)
        );
        // Zero never holds.
        assert_eq!(
            Turn::Free.before_pass(true, t0, Duration::ZERO),
            (Turn::Free, Step::Pass)
        );
        // A pass outside a drain leaves the turn as it was.
        assert_eq!(Turn::Free.after_pass(false), Turn::Free);
    }

    #[test]
    fn the_order_path_is_busy_with_a_message_in_hand_or_one_answered_since() {
        let stats = Arc::new(ConsumeStats::default());
        let mut path = OrderPath {
            stats: stats.clone(),
            answered: 0,
        };
        assert!(!path.busy());
        stats.inflight.add(1);
        assert!(path.busy());
        stats.inflight.add(-1);
        stats.acked.add(32);
        assert!(path.busy(), "answered since the last look");
        assert!(!path.busy(), "nothing since");
        stats.retried.add(1);
        assert!(path.busy());
    }

    #[test]
    fn timers_go_alone_and_the_rest_batch_per_route() {
        let now = Utc::now();
        let later = Some(now + chrono::Duration::minutes(15));
        let past = Some(now - chrono::Duration::seconds(1));
        let mut rows = vec![row(1, "T", "CANCEL", later), row(2, "T", "CANCEL", past)];
        rows.extend((10..80).map(|i| row(i, "E", "ORDER_CREATED", None)));
        rows.push(row(99, "E", "ORDER_PAID", None));
        let units = plan_sends(rows, now);
        let sizes: Vec<usize> = units.iter().map(Vec::len).collect();
        // One timer; the overdue cancel is sent at once in its route's batch;
        // 70 created events in 32+32+6; one paid event.
        assert_eq!(sizes, vec![1, 32, 32, 6, 1, 1]);
        assert_eq!(units[0][0].outbox_id, 1);
        assert!(
            units
                .iter()
                .all(|u| u.iter().all(|r| r.topic == u[0].topic && r.tag == u[0].tag))
        );
    }

    #[test]
    fn a_future_deliver_at_becomes_a_timer_asked_for_the_lead_before_it() {
        let now = Utc::now();
        let lead = chrono::Duration::milliseconds(1_500);
        let at = now + chrono::Duration::minutes(15);
        let m = row(1, "T", "CANCEL", Some(at)).to_outgoing(now, lead);
        assert_eq!(
            m.deliver_time_ms,
            Some((at - lead).timestamp_millis() as u64)
        );
        assert_eq!(m.keys, vec!["k1".to_owned()]);
        assert_eq!(m.properties[0].0, PROP_MESSAGE_ID);
        // Already due: at once.
        let past = now - chrono::Duration::seconds(5);
        assert_eq!(
            row(1, "T", "CANCEL", Some(past))
                .to_outgoing(now, lead)
                .deliver_time_ms,
            None
        );
        // Due within the lead and the margin: at once too (a timer that
        // close would be refused); the consumer holds it.
        let soon = now + chrono::Duration::milliseconds(2_400);
        assert_eq!(timer_at(Some(soon), now, lead), None);
        assert!(soon - now <= max_hold(lead));
        let later = now + chrono::Duration::milliseconds(2_600);
        assert_eq!(timer_at(Some(later), now, lead), Some(later - lead));
        assert_eq!(timer_at(None, now, lead), None);
    }
}
