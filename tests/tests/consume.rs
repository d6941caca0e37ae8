//! The order-create consumer (docs/architecture.md §7) against a real PostgreSQL.
//!
//! Every scenario runs in three shapes, each in its own database:
//! - `batch_1`: every message in its own transaction, all at once;
//! - `batch_32_chunked`: the scenario's messages chunked 32 to a
//!   transaction (duplicates meet inside one batch), chunks at once;
//! - `batch_32_padded`: every message in its own transaction of 32,
//!   padded with unrelated messages of another activity, all at once.
//!
//! "At once" is a barrier every transaction waits on before it starts;
//! nothing waits on a sleep. Every scenario ends with [`check_invariants`],
//! the per-reservation facts of docs/architecture.md §12.

use anyhow::{Context, Result, ensure};
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use seckill_engine::{
    ActivityId, ConsumeVerdict, FailureClass, Handler, IncomingMessage, MessageId, OrderConsumer,
    OrderId, PROP_MESSAGE_ID, ReservationId, ReservationOutcome, SkuId, TopicKind, UserId, consume,
    consume::MessageOutcome, consume::Parsed, consume::RejectReason, consume::sql,
    message::CancelOrderIfUnpaid, message::OrderCreateRequested, message::OrderEvent,
    message::ReleaseReservation,
};
use seckill_tests::{Setup, TestEnv, run};
use secrecy::ExposeSecret;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use tokio::sync::Barrier;

const ACTIVITY: ActivityId = ActivityId(1);
const SKU: SkuId = SkuId(1);
/// Padding messages live here, so they never touch the scenario's stock or users.
const FILLER_ACTIVITY: ActivityId = ActivityId(2);
const FILLER_SKU: SkuId = SkuId(2);
const PAY_WITHIN_MS: i64 = 900_000;

#[derive(Debug, Clone, Copy)]
enum Mode {
    Single,
    Chunked(usize),
    Padded(usize),
}

/// Runs `scenario` in a fresh database in `mode`.
fn scenario<F, Fut>(mode: Mode, f: F)
where
    F: FnOnce(Fixture) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    run(Setup::Full, move |env| async move {
        let fx = Fixture::new(&env, mode).await?;
        f(fx).await
    });
}

/// One test per shape for each scenario.
macro_rules! in_every_shape {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            use super::*;
            #[test]
            fn batch_1() {
                scenario(Mode::Single, super::$name);
            }
            #[test]
            fn batch_32_chunked() {
                scenario(Mode::Chunked(32), super::$name);
            }
            #[test]
            fn batch_32_padded() {
                scenario(Mode::Padded(32), super::$name);
            }
        }
    )+};
}

in_every_shape!(
    same_message_100_times,
    same_reservation_under_10_message_ids,
    same_user_under_10_reservations,
    stock_10_for_25_users,
    expired_reservation,
    malformed_messages_are_quarantined,
    missing_inventory_row_retries,
    lock_timeout_retries,
    closed_pool_retries,
);

struct Fixture {
    mode: Mode,
    /// For assertions; the consumer has its own pool.
    pool: PgPool,
    consumer: OrderConsumer,
    names: seckill_engine::Names,
    url: String,
    next_user: Arc<AtomicI64>,
}

impl Fixture {
    async fn new(env: &TestEnv, mode: Mode) -> Result<Self> {
        let url = env.cfg.database_url.expose_secret().to_owned();
        for a in [ACTIVITY, FILLER_ACTIVITY] {
            sqlx::query(
                "INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES ($1, 300000, $2)",
            )
            .bind(a)
            .bind(PAY_WITHIN_MS)
            .execute(&env.pool)
            .await?;
        }
        set_stock(&env.pool, FILLER_ACTIVITY, FILLER_SKU, 1_000_000).await?;
        // 100 concurrent transactions share few connections: the acquire
        // timeout is generous so the pool queue is never the failure.
        let consumer_pool = PgPoolOptions::new()
            .max_connections(6)
            .acquire_timeout(Duration::from_secs(120))
            .connect(&url)
            .await?;
        Ok(Self {
            mode,
            pool: env.pool.clone(),
            consumer: OrderConsumer::new(consumer_pool, env.names.clone()),
            names: env.names.clone(),
            url,
            next_user: Arc::new(AtomicI64::new(1_000_000)),
        })
    }

    /// A fresh, valid message for the scenario's activity.
    fn msg(&self, user: i64) -> OrderCreateRequested {
        new_msg(ACTIVITY, SKU, UserId(user), Utc::now())
    }

    fn filler(&self) -> Parsed {
        let user = self.next_user.fetch_add(1, Ordering::Relaxed);
        Parsed::new(new_msg(
            FILLER_ACTIVITY,
            FILLER_SKU,
            UserId(user),
            Utc::now(),
        ))
    }

    /// The scenario's messages grouped into transactions by the mode; `None`
    /// marks padding.
    fn batches<T: Clone>(
        &self,
        items: &[T],
        filler: impl Fn() -> T,
    ) -> Vec<Vec<(Option<usize>, T)>> {
        let indexed: Vec<(Option<usize>, T)> = items
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, t)| (Some(i), t))
            .collect();
        match self.mode {
            Mode::Single => indexed.into_iter().map(|x| vec![x]).collect(),
            Mode::Chunked(n) => indexed.chunks(n).map(<[_]>::to_vec).collect(),
            Mode::Padded(n) => indexed
                .into_iter()
                .map(|x| {
                    let mut b = vec![x];
                    b.extend((1..n).map(|_| (None, filler())));
                    b
                })
                .collect(),
        }
    }

    /// Feeds `msgs` to `process`, every transaction at once; each message's
    /// outcome in input order. Padding must always create its order.
    async fn deliver(&self, msgs: &[Parsed]) -> Result<Vec<MessageOutcome>> {
        let batches = self.batches(msgs, || self.filler());
        let barrier = Arc::new(Barrier::new(batches.len()));
        let mut tasks = Vec::with_capacity(batches.len());
        for batch in batches {
            let (consumer, barrier) = (self.consumer.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let parsed: Vec<Parsed> = batch.iter().map(|(_, p)| p.clone()).collect();
                barrier.wait().await;
                let out = consumer.process(&parsed).await;
                (batch, out)
            }));
        }
        let mut outcomes = vec![None; msgs.len()];
        for task in tasks {
            let (batch, out) = task.await?;
            let out = out.context("process a batch")?;
            ensure!(out.len() == batch.len(), "one outcome per message");
            for ((idx, _), o) in batch.iter().zip(out) {
                match idx {
                    Some(i) => outcomes[*i] = Some(o),
                    None => ensure!(
                        matches!(o, MessageOutcome::Created { .. }),
                        "padding must create its order, got {o:?}"
                    ),
                }
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|o| o.expect("every message delivered"))
            .collect())
    }

    /// Feeds broker messages to `handle`, every batch at once; the verdict of
    /// each message's batch, in input order.
    async fn deliver_incoming(&self, msgs: &[IncomingMessage]) -> Result<Vec<ConsumeVerdict>> {
        self.deliver_incoming_to(&self.consumer, msgs).await
    }

    async fn deliver_incoming_to(
        &self,
        consumer: &OrderConsumer,
        msgs: &[IncomingMessage],
    ) -> Result<Vec<ConsumeVerdict>> {
        let batches = self.batches(msgs, || incoming(&self.filler().msg, 0));
        let barrier = Arc::new(Barrier::new(batches.len()));
        let mut tasks = Vec::with_capacity(batches.len());
        for batch in batches {
            let (consumer, barrier) = (consumer.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let body: Vec<IncomingMessage> = batch.iter().map(|(_, m)| m.clone()).collect();
                barrier.wait().await;
                let verdict = consumer.handle(body).await;
                (batch, verdict)
            }));
        }
        let mut verdicts = vec![None; msgs.len()];
        for task in tasks {
            let (batch, verdict) = task.await?;
            for (idx, _) in &batch {
                if let Some(i) = idx {
                    verdicts[*i] = Some(verdict);
                }
            }
        }
        Ok(verdicts
            .into_iter()
            .map(|v| v.expect("every message delivered"))
            .collect())
    }
}

fn new_msg(
    activity: ActivityId,
    sku: SkuId,
    user: UserId,
    created: DateTime<Utc>,
) -> OrderCreateRequested {
    let mut m = seckill_tests::order_create(activity, sku, user.0);
    m.reservation_created_at = created;
    m.reservation_valid_until = created + ChronoDuration::minutes(5);
    m.created_at = created;
    m
}

/// A message as the broker would hand it over.
fn incoming(m: &OrderCreateRequested, reconsume_times: i32) -> IncomingMessage {
    raw_incoming(
        serde_json::to_vec(m).expect("serialize"),
        Some(m.message_id.as_str()),
        reconsume_times,
    )
}

fn raw_incoming(body: Vec<u8>, message_id: Option<&str>, reconsume_times: i32) -> IncomingMessage {
    let mut properties = BTreeMap::new();
    if let Some(id) = message_id {
        properties.insert(PROP_MESSAGE_ID.to_owned(), id.to_owned());
    }
    IncomingMessage {
        topic: "T_PROD_SECKILL_ORDER_CREATE_V1".into(),
        tag: Some("CREATE_ORDER".into()),
        keys: vec![],
        properties,
        body,
        broker_msg_id: format!("BROKER{}", ulid::Ulid::new()),
        queue_id: 0,
        queue_offset: 0,
        reconsume_times,
        store_timestamp_ms: 0,
        born_timestamp_ms: 0,
    }
}

async fn set_stock(pool: &PgPool, a: ActivityId, s: SkuId, stock: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock) VALUES ($1, $2, $3, $3)",
    )
    .bind(a)
    .bind(s)
    .bind(stock)
    .execute(pool)
    .await?;
    Ok(())
}

async fn scalar(pool: &PgPool, sql: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(pool).await?)
}

async fn available(pool: &PgPool) -> Result<i64> {
    scalar(
        pool,
        "SELECT available_stock FROM inventory WHERE activity_id = 1 AND sku_id = 1",
    )
    .await
}

fn count(outcomes: &[MessageOutcome], f: impl Fn(&MessageOutcome) -> bool) -> usize {
    outcomes.iter().filter(|o| f(o)).count()
}

fn created(o: &MessageOutcome) -> bool {
    matches!(o, MessageOutcome::Created { .. })
}

/// docs/architecture.md §12, per reservation and per inventory row, over the whole
/// database (padding included).
async fn check_invariants(pool: &PgPool) -> Result<()> {
    // Conservation in PostgreSQL: available + valid orders = total.
    let rows: Vec<(i64, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT i.activity_id, i.sku_id, i.total_stock, i.available_stock,
                (SELECT count(*) FROM orders o WHERE o.activity_id = i.activity_id
                   AND o.sku_id = i.sku_id AND o.status <> 'CANCELED')
         FROM inventory i",
    )
    .fetch_all(pool)
    .await?;
    for (a, s, total, avail, valid) in rows {
        ensure!(
            avail + valid == total,
            "conservation broken for ({a},{s}): {avail} + {valid} != {total}"
        );
    }
    // Each decided reservation has exactly the rows its outcome implies. A
    // reservation compensated before by another source gets no second
    // RELEASE from the consumer: that compensation counts as its release.
    let rows: Vec<(String, ReservationOutcome, i64, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT r.reservation_id, r.outcome,
           (SELECT count(*) FROM orders o WHERE o.reservation_id = r.reservation_id),
           (SELECT count(*) FROM inventory_ledger l WHERE l.reservation_id = r.reservation_id),
           (SELECT count(*) FROM compensation_tasks c WHERE c.reservation_id = r.reservation_id),
           (SELECT count(*) FROM event_outbox e WHERE e.message_key = r.reservation_id
              AND e.tag = 'RELEASE_RESERVATION')
             + (SELECT count(*) FROM compensation_tasks c WHERE c.reservation_id = r.reservation_id
                  AND c.source <> 'BUSINESS_REJECTION'),
           (SELECT count(*) FROM event_outbox e WHERE e.message_key = r.order_id)
         FROM reservations r",
    )
    .fetch_all(pool)
    .await?;
    for (rsv, outcome, orders, ledger, comp, release, order_events) in rows {
        let got = (orders, ledger, comp, release, order_events);
        let want = match outcome {
            ReservationOutcome::OrderCreated => (1, 1, 0, 0, 2),
            ReservationOutcome::RejectedNoStock
            | ReservationOutcome::RejectedDuplicate
            | ReservationOutcome::RejectedExpired => (0, 0, 1, 1, 0),
            ReservationOutcome::Released => anyhow::bail!("nothing here releases"),
        };
        ensure!(
            got == want,
            "{rsv} {outcome}: (orders, ledger, compensations, releases, order events) = {got:?}, want {want:?}"
        );
    }
    let orphans = scalar(
        pool,
        "SELECT count(*) FROM orders o WHERE NOT EXISTS
           (SELECT 1 FROM reservations r WHERE r.reservation_id = o.reservation_id
              AND r.outcome = 'ORDER_CREATED')",
    )
    .await?;
    ensure!(
        orphans == 0,
        "{orphans} orders without an ORDER_CREATED reservation"
    );
    let open = scalar(
        pool,
        "SELECT count(*) FROM consumer_inbox WHERE status = 'PROCESSING'",
    )
    .await?;
    ensure!(open == 0, "{open} inbox rows left PROCESSING");
    Ok(())
}

/// Counts of every table the consumer writes, for the scenario's activity
/// (inbox and quarantine in full).
async fn snapshot(pool: &PgPool) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    for q in [
        "SELECT count(*) FROM consumer_inbox",
        "SELECT count(*) FROM reservations WHERE activity_id = 1",
        "SELECT count(*) FROM orders WHERE activity_id = 1",
        "SELECT count(*) FROM inventory_ledger WHERE activity_id = 1",
        "SELECT count(*) FROM compensation_tasks WHERE activity_id = 1",
        "SELECT count(*) FROM event_outbox WHERE (payload->>'activity_id')::bigint = 1",
        "SELECT coalesce((SELECT available_stock FROM inventory WHERE activity_id = 1 AND sku_id = 1), -1)",
        "SELECT count(*) FROM message_quarantine",
        "SELECT count(*) FROM consumer_failures",
    ] {
        out.push(scalar(pool, q).await?);
    }
    Ok(out)
}

// ---------------------------------------------------------------- scenarios

/// The same message_id 100 times at once: one business effect.
async fn same_message_100_times(fx: Fixture) -> Result<()> {
    set_stock(&fx.pool, ACTIVITY, SKU, 1_000).await?;
    let m = Parsed::new(fx.msg(7));
    let outcomes = fx.deliver(&vec![m.clone(); 100]).await?;

    ensure!(count(&outcomes, created) == 1, "{outcomes:?}");
    ensure!(
        count(&outcomes, |o| *o == MessageOutcome::AlreadyProcessed) == 99,
        "{outcomes:?}"
    );
    let rsv = m.msg.reservation_id.as_str();
    for (what, sql) in [
        (
            "orders",
            "SELECT count(*) FROM orders WHERE reservation_id = $1",
        ),
        (
            "ledger rows",
            "SELECT count(*) FROM inventory_ledger WHERE reservation_id = $1",
        ),
        (
            "reservations",
            "SELECT count(*) FROM reservations WHERE reservation_id = $1",
        ),
    ] {
        let n: i64 = sqlx::query_scalar(sql)
            .bind(rsv)
            .fetch_one(&fx.pool)
            .await?;
        ensure!(n == 1, "{n} {what} for the reservation");
    }
    let inbox: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT status::text, result_code FROM consumer_inbox WHERE message_id = $1",
    )
    .bind(&m.msg.message_id)
    .fetch_all(&fx.pool)
    .await?;
    ensure!(
        inbox == vec![("SUCCEEDED".into(), Some("ORDER_CREATED".into()))],
        "inbox: {inbox:?}"
    );
    ensure!(available(&fx.pool).await? == 999);
    check_invariants(&fx.pool).await
}

/// docs/architecture.md §12.1 item 2: one reservation under 10 message ids. One order, and
/// the duplicates compensate nothing.
async fn same_reservation_under_10_message_ids(fx: Fixture) -> Result<()> {
    set_stock(&fx.pool, ACTIVITY, SKU, 100).await?;
    let first = fx.msg(7);
    let msgs: Vec<Parsed> = (0..10)
        .map(|_| {
            let mut m = first.clone();
            m.message_id = MessageId::generate();
            Parsed::new(m)
        })
        .collect();
    let outcomes = fx.deliver(&msgs).await?;

    ensure!(count(&outcomes, created) == 1, "{outcomes:?}");
    ensure!(
        count(&outcomes, |o| *o == MessageOutcome::DuplicateReservation) == 9,
        "{outcomes:?}"
    );
    ensure!(
        scalar(
            &fx.pool,
            "SELECT count(*) FROM orders WHERE activity_id = 1"
        )
        .await?
            == 1
    );
    ensure!(scalar(&fx.pool, "SELECT count(*) FROM compensation_tasks").await? == 0);
    ensure!(
        scalar(
            &fx.pool,
            "SELECT count(*) FROM event_outbox WHERE tag = 'RELEASE_RESERVATION'"
        )
        .await?
            == 0
    );
    let inbox: Vec<(String, i64)> = sqlx::query_as(
        "SELECT result_code, count(*) FROM consumer_inbox WHERE message_id = ANY($1)
         AND status = 'SUCCEEDED' GROUP BY 1 ORDER BY 1",
    )
    .bind(
        msgs.iter()
            .map(|p| p.msg.message_id.clone())
            .collect::<Vec<_>>(),
    )
    .fetch_all(&fx.pool)
    .await?;
    ensure!(
        inbox
            == vec![
                ("DUPLICATE_RESERVATION".into(), 9),
                ("ORDER_CREATED".into(), 1)
            ],
        "inbox: {inbox:?}"
    );
    ensure!(available(&fx.pool).await? == 99);
    check_invariants(&fx.pool).await
}

/// One user, 10 reservations: one valid order, 9 rejected and compensated.
async fn same_user_under_10_reservations(fx: Fixture) -> Result<()> {
    set_stock(&fx.pool, ACTIVITY, SKU, 100).await?;
    let t0 = Utc::now();
    let msgs: Vec<Parsed> = (0..10)
        .map(|i| {
            Parsed::new(new_msg(
                ACTIVITY,
                SKU,
                UserId(7),
                t0 + ChronoDuration::milliseconds(i),
            ))
        })
        .collect();
    let outcomes = fx.deliver(&msgs).await?;

    ensure!(count(&outcomes, created) == 1, "{outcomes:?}");
    ensure!(
        count(&outcomes, |o| *o
            == MessageOutcome::Rejected(RejectReason::DuplicateUser))
            == 9,
        "{outcomes:?}"
    );
    if let Mode::Chunked(_) = fx.mode {
        // In one batch the oldest reservation wins.
        ensure!(created(&outcomes[0]), "the oldest must win: {outcomes:?}");
    }
    let valid = scalar(
        &fx.pool,
        "SELECT count(*) FROM orders WHERE activity_id = 1 AND user_id = 7 AND status <> 'CANCELED'",
    )
    .await?;
    ensure!(valid == 1, "{valid} valid orders for the user");
    let comp: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT source::text, reason, count(*) FROM compensation_tasks WHERE activity_id = 1 GROUP BY 1, 2",
    )
    .fetch_all(&fx.pool)
    .await?;
    ensure!(
        comp == vec![("BUSINESS_REJECTION".into(), "REJECTED_DUPLICATE".into(), 9)],
        "compensations: {comp:?}"
    );
    let rejected = scalar(
        &fx.pool,
        "SELECT count(*) FROM reservations WHERE activity_id = 1 AND outcome = 'REJECTED_DUPLICATE'",
    )
    .await?;
    ensure!(rejected == 9);
    // A unit taken for a candidate that lost its user to a concurrent
    // order was given back in the same transaction.
    ensure!(available(&fx.pool).await? == 99);
    check_invariants(&fx.pool).await
}

/// Stock 10, 25 users: exactly 10 orders, 15 rejected, each compensated
/// once, and the outbox rows carry the documented payloads.
async fn stock_10_for_25_users(fx: Fixture) -> Result<()> {
    set_stock(&fx.pool, ACTIVITY, SKU, 10).await?;
    let t0 = Utc::now();
    let msgs: Vec<Parsed> = (0..25)
        .map(|i| {
            Parsed::new(new_msg(
                ACTIVITY,
                SKU,
                UserId(100 + i),
                t0 + ChronoDuration::milliseconds(i),
            ))
        })
        .collect();
    let outcomes = fx.deliver(&msgs).await?;

    ensure!(count(&outcomes, created) == 10, "{outcomes:?}");
    ensure!(
        count(&outcomes, |o| *o
            == MessageOutcome::Rejected(RejectReason::NoStock))
            == 15,
        "{outcomes:?}"
    );
    if let Mode::Chunked(_) = fx.mode {
        ensure!(
            outcomes[..10].iter().all(created),
            "the 10 oldest win: {outcomes:?}"
        );
    }
    ensure!(available(&fx.pool).await? == 0);
    ensure!(
        scalar(
            &fx.pool,
            "SELECT count(*) FROM orders WHERE activity_id = 1"
        )
        .await?
            == 10
    );
    let per_rejection: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT (SELECT count(*) FROM compensation_tasks c WHERE c.reservation_id = r.reservation_id
                   AND c.reason = 'REJECTED_NO_STOCK' AND c.source = 'BUSINESS_REJECTION'),
                (SELECT count(*) FROM event_outbox e WHERE e.message_key = r.reservation_id
                   AND e.tag = 'RELEASE_RESERVATION')
         FROM reservations r WHERE r.activity_id = 1 AND r.outcome = 'REJECTED_NO_STOCK'",
    )
    .fetch_all(&fx.pool)
    .await?;
    ensure!(
        per_rejection == vec![(1, 1); 15],
        "per rejection: {per_rejection:?}"
    );
    let no_stock_inbox = scalar(
        &fx.pool,
        "SELECT count(*) FROM consumer_inbox WHERE status = 'REJECTED' AND result_code = 'REJECTED_NO_STOCK'",
    )
    .await?;
    ensure!(no_stock_inbox == 15);
    check_payloads(&fx).await?;
    check_invariants(&fx.pool).await
}

#[derive(Debug, sqlx::FromRow)]
struct OutboxRow {
    message_id: String,
    topic: String,
    tag: String,
    payload: serde_json::Value,
    deliver_at: Option<DateTime<Utc>>,
}

#[derive(Debug, sqlx::FromRow)]
struct QuarantineRow {
    reason: String,
    message_id: Option<String>,
    broker_msg_id: String,
    body: Vec<u8>,
    properties: serde_json::Value,
}

/// The outbox rows of the scenario's activity: topic, tag, key, deliver_at
/// and a payload the readers' types accept.
async fn check_payloads(fx: &Fixture) -> Result<()> {
    let orders: Vec<(OrderId, ReservationId, DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT order_id, reservation_id, expires_at, created_at FROM orders WHERE activity_id = 1",
    )
    .fetch_all(&fx.pool)
    .await?;
    for (order_id, rsv, expires_at, created_at) in orders {
        ensure!(
            expires_at == created_at + ChronoDuration::milliseconds(PAY_WITHIN_MS),
            "expires_at {expires_at} is not created_at {created_at} + pay_within_ms"
        );
        let rows: Vec<OutboxRow> = sqlx::query_as(
            "SELECT message_id, topic, tag, payload, deliver_at FROM event_outbox
             WHERE message_key = $1 ORDER BY tag",
        )
        .bind(&order_id)
        .fetch_all(&fx.pool)
        .await?;
        ensure!(rows.len() == 2, "{order_id}: {rows:?}");
        let cancel_row = &rows[0];
        ensure!(
            cancel_row.tag == "CANCEL_IF_UNPAID"
                && cancel_row.topic == fx.names.topic(TopicKind::OrderTimeout),
            "{cancel_row:?}"
        );
        ensure!(
            cancel_row.deliver_at == Some(expires_at),
            "cancel deliver_at {:?}",
            cancel_row.deliver_at
        );
        let cancel: CancelOrderIfUnpaid = serde_json::from_value(cancel_row.payload.clone())?;
        ensure!(
            cancel.message_id.as_str() == cancel_row.message_id
                && cancel.order_id == order_id
                && cancel.reservation_id == rsv
        );
        ensure!(cancel.message_key == order_id && cancel.deliver_at == expires_at);
        ensure!(
            MessageId::parse(&cancel_row.message_id).is_ok(),
            "{} is not evt_<ULID>",
            cancel_row.message_id
        );
        let event_row = &rows[1];
        ensure!(
            event_row.tag == "ORDER_CREATED"
                && event_row.topic == fx.names.topic(TopicKind::OrderEvent),
            "{event_row:?}"
        );
        ensure!(event_row.deliver_at.is_none());
        let event: OrderEvent = serde_json::from_value(event_row.payload.clone())?;
        ensure!(event.message_id.as_str() == event_row.message_id && event.order_id == order_id);
        ensure!(event.aggregate_version == 1 && event.event_type == "ORDER_CREATED");
    }
    let releases: Vec<(String, String, String, serde_json::Value)> = sqlx::query_as(
        "SELECT message_id, topic, message_key, payload FROM event_outbox WHERE tag = 'RELEASE_RESERVATION'",
    )
    .fetch_all(&fx.pool)
    .await?;
    for (id, topic, key, payload) in releases {
        ensure!(topic == fx.names.topic(TopicKind::InventoryCompensate));
        let rel: ReleaseReservation = serde_json::from_value(payload)?;
        ensure!(rel.message_id.as_str() == id && rel.reservation_id.as_str() == key);
        ensure!(rel.event_type == "RELEASE_RESERVATION" && rel.reason.starts_with("REJECTED_"));
    }
    Ok(())
}

/// An expired reservation is rejected and compensated once; redelivering
/// it, or the same reservation under a new message id, changes nothing.
async fn expired_reservation(fx: Fixture) -> Result<()> {
    set_stock(&fx.pool, ACTIVITY, SKU, 10).await?;
    let mut m = fx.msg(7);
    m.reservation_created_at = Utc::now() - ChronoDuration::minutes(10);
    m.reservation_valid_until = Utc::now() - ChronoDuration::seconds(1);
    let m = Parsed::new(m);
    let outcomes = fx.deliver(std::slice::from_ref(&m)).await?;
    ensure!(
        outcomes == vec![MessageOutcome::Rejected(RejectReason::Expired)],
        "{outcomes:?}"
    );
    let comp: Vec<(String, String)> =
        sqlx::query_as("SELECT source::text, reason FROM compensation_tasks WHERE activity_id = 1")
            .fetch_all(&fx.pool)
            .await?;
    ensure!(
        comp == vec![("BUSINESS_REJECTION".into(), "REJECTED_EXPIRED".into())],
        "{comp:?}"
    );
    ensure!(
        available(&fx.pool).await? == 10,
        "an expired reservation takes no stock"
    );
    let inbox: (String, String) = sqlx::query_as(
        "SELECT status::text, result_code FROM consumer_inbox WHERE message_id = $1",
    )
    .bind(&m.msg.message_id)
    .fetch_one(&fx.pool)
    .await?;
    ensure!(
        inbox == ("REJECTED".into(), "REJECTED_EXPIRED".into()),
        "{inbox:?}"
    );

    let before = snapshot(&fx.pool).await?;
    let again = fx.deliver(std::slice::from_ref(&m)).await?;
    ensure!(again == vec![MessageOutcome::AlreadyProcessed], "{again:?}");
    let mut after = snapshot(&fx.pool).await?;
    // Padding writes its own inbox rows; the rest is scoped to the activity.
    if let Mode::Padded(n) = fx.mode {
        after[0] -= n as i64 - 1;
    }
    ensure!(
        before == after,
        "redelivery changed something: {before:?} -> {after:?}"
    );

    let mut other = m.clone();
    other.msg.message_id = MessageId::generate();
    let dup = fx.deliver(&[other]).await?;
    ensure!(dup == vec![MessageOutcome::DuplicateReservation], "{dup:?}");
    ensure!(
        scalar(
            &fx.pool,
            "SELECT count(*) FROM compensation_tasks WHERE activity_id = 1"
        )
        .await?
            == 1
    );

    // A reservation already compensated by another source (a send that
    // failed for certain) is rejected without a second compensation: no new
    // task, no RELEASE outbox row.
    let mut late = fx.msg(8);
    late.reservation_valid_until = Utc::now() - ChronoDuration::seconds(1);
    sqlx::query(
        "INSERT INTO compensation_tasks (reservation_id, activity_id, sku_id, user_id, source, reason)
         VALUES ($1, 1, 1, 8, 'SEND_FAILURE', 'TOPIC_NOT_EXIST')",
    )
    .bind(&late.reservation_id)
    .execute(&fx.pool)
    .await?;
    let out = fx.deliver(&[Parsed::new(late.clone())]).await?;
    ensure!(
        out == vec![MessageOutcome::Rejected(RejectReason::Expired)],
        "{out:?}"
    );
    let row: (String, i64) = sqlx::query_as(
        "SELECT (SELECT source::text FROM compensation_tasks WHERE reservation_id = $1),
                (SELECT count(*) FROM event_outbox WHERE message_key = $1)",
    )
    .bind(&late.reservation_id)
    .fetch_one(&fx.pool)
    .await?;
    ensure!(row == ("SEND_FAILURE".into(), 0), "{row:?}");
    check_invariants(&fx.pool).await
}

/// Bad JSON and schema_version 2 are quarantined and ACKed, writing nothing
/// else; a bad message among good ones does not stop them.
async fn malformed_messages_are_quarantined(fx: Fixture) -> Result<()> {
    set_stock(&fx.pool, ACTIVITY, SKU, 10).await?;
    let bad_json = raw_incoming(b"{\"schema_version\": 1, ".to_vec(), Some("evt_BADJSON"), 0);
    let v2 = fx.msg(7);
    let mut body = serde_json::to_value(&v2)?;
    body["schema_version"] = 2.into();
    let v2_msg = raw_incoming(serde_json::to_vec(&body)?, Some(v2.message_id.as_str()), 0);

    let verdicts = fx
        .deliver_incoming(&[bad_json.clone(), v2_msg.clone()])
        .await?;
    ensure!(verdicts == vec![ConsumeVerdict::Ack; 2], "{verdicts:?}");
    let rows: Vec<QuarantineRow> = sqlx::query_as(
        "SELECT reason::text AS reason, message_id, broker_msg_id, body, properties
         FROM message_quarantine WHERE consumer_group = $1 ORDER BY reason",
    )
    .bind(fx.consumer.group())
    .fetch_all(&fx.pool)
    .await?;
    ensure!(rows.len() == 2, "{rows:?}");
    let (json_row, v2_row) = (&rows[0], &rows[1]);
    ensure!(json_row.reason == "BAD_JSON" && json_row.message_id.as_deref() == Some("evt_BADJSON"));
    ensure!(json_row.broker_msg_id == bad_json.broker_msg_id && json_row.body == bad_json.body);
    ensure!(
        json_row.properties["message_id"] == "evt_BADJSON",
        "{}",
        json_row.properties
    );
    ensure!(
        v2_row.reason == "UNSUPPORTED_SCHEMA"
            && v2_row.message_id.as_deref() == Some(v2.message_id.as_str())
    );
    let written = scalar(
        &fx.pool,
        "SELECT (SELECT count(*) FROM consumer_inbox WHERE message_id LIKE 'evt_BADJSON%')
              + (SELECT count(*) FROM reservations WHERE activity_id = 1)
              + (SELECT count(*) FROM orders WHERE activity_id = 1)",
    )
    .await?;
    ensure!(written == 0, "a bad message wrote {written} rows");
    let v2_inbox: i64 =
        sqlx::query_scalar("SELECT count(*) FROM consumer_inbox WHERE message_id = $1")
            .bind(&v2.message_id)
            .fetch_one(&fx.pool)
            .await?;
    ensure!(v2_inbox == 0);

    // Good, bad, good.
    let (g1, g2) = (fx.msg(8), fx.msg(9));
    let mut missing = serde_json::to_value(fx.msg(10))?;
    missing.as_object_mut().expect("object").remove("order_id");
    let mixed = [
        incoming(&g1, 0),
        raw_incoming(serde_json::to_vec(&missing)?, None, 0),
        incoming(&g2, 0),
    ];
    let verdicts = fx.deliver_incoming(&mixed).await?;
    ensure!(verdicts == vec![ConsumeVerdict::Ack; 3], "{verdicts:?}");
    let users: Vec<i64> =
        sqlx::query_scalar("SELECT user_id FROM orders WHERE activity_id = 1 ORDER BY user_id")
            .fetch_all(&fx.pool)
            .await?;
    ensure!(users == vec![8, 9], "orders for {users:?}");
    let q = scalar(
        &fx.pool,
        "SELECT count(*) FROM message_quarantine WHERE reason = 'MISSING_FIELD'",
    )
    .await?;
    ensure!(q == 1);
    check_invariants(&fx.pool).await
}

/// A missing inventory row is a configuration error: its messages retry
/// (and, unless fixed, reach the DLQ) with the failure recorded and nothing
/// else written, while the other messages of the batch still commit. Once
/// the row exists, the redelivery creates the order.
async fn missing_inventory_row_retries(fx: Fixture) -> Result<()> {
    let stuck = fx.msg(7);
    // A neighbour on a SKU that is configured.
    let neighbour = fx.filler().msg;
    let before = snapshot(&fx.pool).await?;
    let verdicts = fx
        .deliver_incoming(&[incoming(&stuck, 0), incoming(&neighbour, 0)])
        .await?;
    ensure!(verdicts[0] == ConsumeVerdict::Retry, "{verdicts:?}");
    let failures: Vec<(String, FailureClass, String, i32)> = sqlx::query_as(
        "SELECT message_id, error_class, detail, delivery_attempt FROM consumer_failures
         WHERE consumer_group = $1",
    )
    .bind(fx.consumer.group())
    .fetch_all(&fx.pool)
    .await?;
    ensure!(
        failures.len() == 1 && failures[0].0 == stuck.message_id.as_str(),
        "only the stuck message failed: {failures:?}"
    );
    let (_, class, detail, attempt) = &failures[0];
    ensure!(
        *class == FailureClass::Unknown && *attempt == 0,
        "{failures:?}"
    );
    ensure!(
        detail.contains("no inventory row for activity 1 sku 1"),
        "{detail}"
    );
    // Nothing of the stuck message's activity was written...
    let after = snapshot(&fx.pool).await?;
    ensure!(
        before[1..7] == after[1..7],
        "the stuck message wrote something: {before:?} -> {after:?}"
    );
    let stuck_inbox: i64 =
        sqlx::query_scalar("SELECT count(*) FROM consumer_inbox WHERE message_id = $1")
            .bind(&stuck.message_id)
            .fetch_one(&fx.pool)
            .await?;
    ensure!(stuck_inbox == 0);
    // ...while its neighbour, in the same batch or not, got its order.
    let neighbour_orders: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE reservation_id = $1")
            .bind(&neighbour.reservation_id)
            .fetch_one(&fx.pool)
            .await?;
    ensure!(neighbour_orders == 1, "the neighbour was held hostage");

    set_stock(&fx.pool, ACTIVITY, SKU, 5).await?;
    let verdicts = fx
        .deliver_incoming(&[incoming(&stuck, 1), incoming(&neighbour, 1)])
        .await?;
    ensure!(verdicts == vec![ConsumeVerdict::Ack; 2], "{verdicts:?}");
    let attempt: i32 =
        sqlx::query_scalar("SELECT delivery_attempt FROM consumer_inbox WHERE message_id = $1")
            .bind(&stuck.message_id)
            .fetch_one(&fx.pool)
            .await?;
    ensure!(
        attempt == 1,
        "the inbox records the broker's reconsume count"
    );
    let orders: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE reservation_id = ANY($1)")
            .bind(vec![
                stuck.reservation_id.clone(),
                neighbour.reservation_id.clone(),
            ])
            .fetch_one(&fx.pool)
            .await?;
    ensure!(orders == 2, "{orders} orders");
    check_invariants(&fx.pool).await
}

/// A real lock timeout (SQLSTATE 55P03) on the hot row: retry, class
/// DB_TIMEOUT, nothing written; once the lock is gone the retry succeeds.
async fn lock_timeout_retries(fx: Fixture) -> Result<()> {
    set_stock(&fx.pool, ACTIVITY, SKU, 5).await?;
    let opts = PgConnectOptions::from_str(&fx.url)?.options([("lock_timeout", "300ms")]);
    let impatient = OrderConsumer::new(
        PgPoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await?,
        fx.names.clone(),
    );
    let mut holder = fx.pool.begin().await?;
    sqlx::query("SELECT 1 FROM inventory WHERE activity_id = 1 AND sku_id = 1 FOR UPDATE")
        .execute(&mut *holder)
        .await?;
    let m = fx.msg(7);
    let verdicts = fx
        .deliver_incoming_to(&impatient, &[incoming(&m, 0)])
        .await?;
    holder.rollback().await?;
    ensure!(verdicts == vec![ConsumeVerdict::Retry], "{verdicts:?}");
    let class: FailureClass =
        sqlx::query_scalar("SELECT error_class FROM consumer_failures WHERE message_id = $1")
            .bind(&m.message_id)
            .fetch_one(&fx.pool)
            .await?;
    ensure!(class == FailureClass::DbTimeout, "{class}");
    ensure!(scalar(&fx.pool, "SELECT count(*) FROM consumer_inbox").await? == 0);

    let verdicts = fx
        .deliver_incoming_to(&impatient, &[incoming(&m, 1)])
        .await?;
    ensure!(verdicts == vec![ConsumeVerdict::Ack], "{verdicts:?}");
    ensure!(available(&fx.pool).await? == 4);
    check_invariants(&fx.pool).await
}

/// A consumer whose pool is gone: retry, classified as a connection failure.
async fn closed_pool_retries(fx: Fixture) -> Result<()> {
    set_stock(&fx.pool, ACTIVITY, SKU, 5).await?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&fx.url)
        .await?;
    let closed = OrderConsumer::new(pool.clone(), fx.names.clone());
    pool.close().await;
    let m = Parsed::new(fx.msg(7));
    let err = closed.process(std::slice::from_ref(&m)).await.unwrap_err();
    ensure!(
        consume::failure_class(&err) == FailureClass::DbConnection,
        "{err}"
    );
    let verdicts = fx
        .deliver_incoming_to(&closed, &[incoming(&m.msg, 0)])
        .await?;
    ensure!(verdicts == vec![ConsumeVerdict::Retry], "{verdicts:?}");
    let written = snapshot(&fx.pool).await?;
    ensure!(written[..6] == [0; 6] && written[6] == 5, "{written:?}");
    check_invariants(&fx.pool).await
}

// ------------------------------------------------------------ bench scripts

/// The pgbench scripts must run the consumer's statements verbatim, each
/// `$n` spelled as the named pgbench variable.
#[test]
fn bench_scripts_run_the_consumers_statements() {
    let statements: [(&str, &str, &[&str]); 5] = [
        ("BEGIN", sql::BEGIN, &[]),
        (
            "INBOX_AND_CLAIM",
            sql::INBOX_AND_CLAIM,
            &[
                "grp",
                "mids",
                "attempts",
                "replays",
                "rsvs",
                "reqs",
                "oids",
                "aids",
                "skus",
                "uids",
                "valid_untils",
                "reserved_ats",
                "traces",
            ],
        ),
        (
            "INSERT_ORDERS",
            sql::INSERT_ORDERS,
            &["oids", "rsvs", "reqs", "aids", "skus", "uids", "expires"],
        ),
        (
            "FINISH",
            sql::FINISH,
            &[
                "rsvs",
                "oids",
                "aids",
                "skus",
                "mids",
                "rej_rsvs",
                "rej_outcomes",
                "rej_aids",
                "rej_skus",
                "rej_uids",
                "rej_reasons",
                "rel_mids",
                "rel_payloads",
                "rel_topic",
                "rel_tag",
                "out_mids",
                "out_topics",
                "out_tags",
                "out_keys",
                "out_payloads",
                "out_deliver_ats",
                "grp",
                "inbox_mids",
                "inbox_statuses",
                "inbox_codes",
            ],
        ),
        // Last before COMMIT: the hot row is locked only from here on.
        (
            "TAKE_STOCK",
            sql::TAKE_STOCK,
            &["want_aids", "want_skus", "want_units"],
        ),
    ];
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench");
    for file in ["order_tx.sql", "order_tx_batch.sql"] {
        let text = std::fs::read_to_string(dir.join(file)).expect("read the bench script");
        let script = normalize(&text);
        let mut at = 0;
        for (name, stmt, vars) in statements {
            let want = format!("{};", normalize(&substitute(stmt, vars)));
            let found = script[at..].find(&want);
            assert!(
                found.is_some(),
                "{file} does not run {name} (in order) as the consumer does; expected:\n{want}"
            );
            at += found.unwrap_or(0) + want.len();
        }
        assert!(
            script[at..].trim_start().starts_with("COMMIT;"),
            "{file} must commit right after TAKE_STOCK"
        );
    }
}

/// `$n` → `:vars[n-1]`.
fn substitute(stmt: &str, vars: &[&str]) -> String {
    let mut out = String::with_capacity(stmt.len());
    let mut chars = stmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            let mut n = 0usize;
            while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
                n = n * 10 + d as usize;
                chars.next();
            }
            out.push(':');
            out.push_str(vars[n - 1]);
        } else {
            out.push(c);
        }
    }
    out
}

fn normalize(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
