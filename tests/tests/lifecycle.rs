//! After the order (docs/architecture.md §8) against the real PostgreSQL, Redis and
//! RocketMQ: the pay/cancel race, the delayed cancel delivered early, late
//! and twice, the compensation released exactly once, the projection
//! replayed out of order, the sweeps, and the outbox publisher.
//!
//! Orders are written straight into PostgreSQL here, so each test controls
//! `expires_at` to the millisecond; the end-to-end run through the daemon
//! is in `pipeline.rs`.

use anyhow::{Result, ensure};
use chrono::{Duration as ChronoDuration, Utc};
use seckill_engine::{
    ActivityId, CancelConsumer, CancelMode, CancelNoop, CancelOutcome, CompensationConsumer,
    CompensationSource, ConsumeVerdict, ConsumerSpec, Handler, IncomingMessage, LifecycleStats,
    MessageId, OrderId, OrderStatus, OutboxConfig, OutgoingMessage, PROP_MESSAGE_ID, PayOutcome,
    Producer, ProjectionConsumer, ReleaseOutcome, RequestId, ReservationId, ReservationStore,
    ReserveOutcome, ReserveRequest, RocketConsumer, RocketProducer, SendOutcome, SkuId, TopicKind,
    UnknownCause, UserId, lifecycle::cancel, lifecycle::cancel::Settled as CancelSettled,
    lifecycle::compensate, lifecycle::compensate::Settled as CompSettled, message::CANCEL_EVENT,
    message::CancelOrderIfUnpaid, message::OrderEvent, message::RELEASE_RESERVATION_EVENT,
    message::ReleaseReservation, message::SCHEMA_VERSION, order, outbox, outbox::OutboxDeps,
};
use seckill_tests::{Setup, TestEnv, eventually, run};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Barrier;

const ACTIVITY: ActivityId = ActivityId(7);
const SKU: SkuId = SkuId(3);

fn store(env: &TestEnv) -> ReservationStore {
    ReservationStore::new(env.redis.clone(), env.cfg.redis_prefix.clone())
}

fn stats() -> Arc<LifecycleStats> {
    Arc::new(LifecycleStats::default())
}

async fn count(env: &TestEnv, sql: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(&env.pool).await?)
}

/// The activity and its inventory, every unit already sold: `sold` orders
/// are created by [`insert_order`].
async fn seed_sold_out(env: &TestEnv, sold: i64) -> Result<()> {
    sqlx::query("INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES ($1, 300000, 900000)")
        .bind(ACTIVITY)
        .execute(&env.pool)
        .await?;
    sqlx::query("INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock) VALUES ($1, $2, $3, 0)")
        .bind(ACTIVITY)
        .bind(SKU)
        .bind(sold)
        .execute(&env.pool)
        .await?;
    Ok(())
}

/// An order as the order consumer leaves it: CREATED, with its ledger row.
async fn insert_order(env: &TestEnv, user: i64, expires_in: ChronoDuration) -> Result<OrderId> {
    let (order, rsv) = (OrderId::generate(), ReservationId::generate());
    sqlx::query(
        "WITH o AS (
             INSERT INTO orders (order_id, reservation_id, request_id, activity_id, sku_id, user_id,
                                 quantity, status, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, 1, 'CREATED', $7)
         )
         INSERT INTO inventory_ledger (reservation_id, order_id, activity_id, sku_id, reason, delta, message_id)
         VALUES ($2, $1, $4, $5, 'ORDER_CREATED', -1, $8)",
    )
    .bind(&order)
    .bind(&rsv)
    .bind(RequestId::generate())
    .bind(ACTIVITY)
    .bind(SKU)
    .bind(UserId(user))
    .bind(Utc::now() + expires_in)
    .bind(MessageId::generate())
    .execute(&env.pool)
    .await?;
    Ok(order)
}

/// PostgreSQL conservation (docs/architecture.md §12) and the per-order facts: a
/// canceled order has exactly one +1 ledger row and one CANCELLATION task;
/// any other order has neither.
async fn check_books(env: &TestEnv) -> Result<()> {
    let broken = count(
        env,
        "SELECT count(*) FROM inventory i
         WHERE i.available_stock + (SELECT count(*) FROM orders o
                                    WHERE o.activity_id = i.activity_id AND o.sku_id = i.sku_id
                                      AND o.status <> 'CANCELED') <> i.total_stock",
    )
    .await?;
    ensure!(broken == 0, "PostgreSQL conservation broken");
    let wrong = count(
        env,
        "SELECT count(*) FROM orders o
         WHERE (o.status = 'CANCELED') <> EXISTS (
                   SELECT 1 FROM inventory_ledger l
                   WHERE l.reservation_id = o.reservation_id AND l.reason = 'ORDER_CANCELED')
            OR (o.status = 'CANCELED') <> EXISTS (
                   SELECT 1 FROM compensation_tasks c
                   WHERE c.reservation_id = o.reservation_id AND c.source = 'CANCELLATION')
            OR (SELECT count(*) FROM inventory_ledger l WHERE l.reservation_id = o.reservation_id
                  AND l.reason = 'ORDER_CANCELED') > 1",
    )
    .await?;
    ensure!(wrong == 0, "{wrong} order(s) with wrong cancel bookkeeping");
    Ok(())
}

/// Sleeps a random 0..max_ms, so the two sides of a race start in either order.
async fn jitter(max_ms: u64) {
    let ms = rand_ms(max_ms);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

fn rand_ms(max_ms: u64) -> u64 {
    // A ULID's random part is plenty for test jitter.
    (ulid::Ulid::new().random() % (max_ms as u128 + 1)) as u64
}

#[test]
fn pay_and_cancel_raced_100_times_never_both() {
    run(Setup::Full, |env| async move {
        const N: i64 = 100;
        seed_sold_out(&env, 2 * N).await?;
        let mut results = Vec::new();
        // Round 1: an operator cancel (always eligible) against a payment
        // (always eligible): exactly one wins each order.
        // Round 2: the delayed cancel against a payment, both right at the
        // order's expiry: at most one wins, and a paid order stays paid.
        for (round, mode) in [(1, CancelMode::Now), (2, CancelMode::IfDue)] {
            let mut orders = Vec::new();
            for i in 0..N {
                let expires = ChronoDuration::milliseconds(if round == 1 { 600_000 } else { 150 });
                orders.push(insert_order(&env, round * 1_000 + i, expires).await?);
            }
            let barrier = Arc::new(Barrier::new(2 * N as usize));
            let mut tasks = Vec::new();
            for id in orders {
                let (pool, names, b) = (env.pool.clone(), env.names.clone(), barrier.clone());
                let (pool2, names2, b2, id2) = (
                    env.pool.clone(),
                    env.names.clone(),
                    barrier.clone(),
                    id.clone(),
                );
                let pay = tokio::spawn(async move {
                    b.wait().await;
                    jitter(300).await;
                    order::pay(&pool, &names, &id, "pay_test", &seckill_tests::test_actor()).await
                });
                let cancel = tokio::spawn(async move {
                    b2.wait().await;
                    jitter(300).await;
                    order::cancel(&pool2, &names2, &id2, mode, "race").await
                });
                tasks.push((round, pay, cancel));
            }
            for (round, pay, cancel) in tasks {
                results.push((round, pay.await??, cancel.await??));
            }
        }

        let (mut paid, mut canceled) = (0, 0);
        for (round, pay, cancel) in &results {
            let pay_won = matches!(pay, PayOutcome::Paid { .. });
            let cancel_won = matches!(cancel, CancelOutcome::Canceled { .. });
            ensure!(!(pay_won && cancel_won), "both won: {pay:?} / {cancel:?}");
            if *round == 1 {
                ensure!(
                    pay_won || cancel_won,
                    "nobody won an eligible race: {pay:?} / {cancel:?}"
                );
            }
            // Each loser says who won.
            if pay_won {
                ensure!(
                    matches!(
                        cancel,
                        CancelOutcome::NoOp {
                            reason: CancelNoop::AlreadyPaid | CancelNoop::NotYetDue,
                            ..
                        }
                    ),
                    "{cancel:?}"
                );
            }
            if cancel_won {
                // The payment either met the canceled order or, past the
                // window, lost before the cancel committed.
                ensure!(
                    matches!(
                        pay,
                        PayOutcome::Canceled { .. } | PayOutcome::WindowClosed { .. }
                    ),
                    "{pay:?}"
                );
                if *round == 1 {
                    ensure!(matches!(pay, PayOutcome::Canceled { .. }), "{pay:?}");
                }
            }
            paid += pay_won as i64;
            canceled += cancel_won as i64;
        }
        assert_eq!(
            count(&env, "SELECT count(*) FROM orders WHERE status = 'PAID'").await?,
            paid
        );
        assert_eq!(
            count(
                &env,
                "SELECT count(*) FROM orders WHERE status = 'CANCELED'"
            )
            .await?,
            canceled
        );
        assert_eq!(
            count(&env, "SELECT available_stock FROM inventory").await?,
            canceled,
            "every cancel gave exactly one unit back"
        );
        // One ORDER_PAID or ORDER_CANCELED event per winner, one release per cancel.
        assert_eq!(
            count(
                &env,
                "SELECT count(*) FROM event_outbox WHERE tag = 'ORDER_PAID'"
            )
            .await?,
            paid
        );
        assert_eq!(
            count(
                &env,
                "SELECT count(*) FROM event_outbox WHERE tag = 'RELEASE_RESERVATION'"
            )
            .await?,
            canceled
        );
        check_books(&env).await?;
        ensure!(
            paid > 0 && canceled > 0,
            "the race was one-sided: {paid} paid, {canceled} canceled"
        );
        Ok(())
    });
}

fn cancel_msg(order: &order::OrderRow) -> CancelOrderIfUnpaid {
    let id = MessageId::generate();
    CancelOrderIfUnpaid {
        schema_version: SCHEMA_VERSION,
        event_type: CANCEL_EVENT.to_owned(),
        message_id: id,
        message_key: order.order_id.clone(),
        order_id: order.order_id.clone(),
        reservation_id: order.reservation_id.clone(),
        activity_id: order.activity_id,
        sku_id: order.sku_id,
        user_id: order.user_id,
        deliver_at: order.expires_at,
        created_at: Utc::now(),
        retry_count: 0,
        replay_count: 0,
    }
}

#[test]
fn a_cancel_delivered_early_late_or_twice_is_safe() {
    run(Setup::Full, |env| async move {
        seed_sold_out(&env, 3).await?;
        let stats = stats();
        let consumer = CancelConsumer::new(env.pool.clone(), env.names.clone(), stats.clone());
        let early = insert_order(&env, 1, ChronoDuration::minutes(10)).await?;
        let late = insert_order(&env, 2, ChronoDuration::hours(-1)).await?;
        let paid = insert_order(&env, 3, ChronoDuration::minutes(10)).await?;
        let get = |id: OrderId| {
            let pool = env.pool.clone();
            async move { Ok::<_, anyhow::Error>(order::get(&pool, &id).await?.expect("order")) }
        };

        // Early: nothing changes, and one successor is queued for expires_at.
        let o = get(early.clone()).await?;
        let m = cancel_msg(&o);
        let out = consumer.process(&m, 0, None).await?;
        assert_eq!(
            out,
            CancelSettled::Rearmed {
                deliver_at: o.expires_at
            }
        );
        assert_eq!(get(early.clone()).await?.status, OrderStatus::Created);
        let successor: (serde_json::Value, chrono::DateTime<Utc>) = sqlx::query_as(
            "SELECT payload, deliver_at FROM event_outbox WHERE tag = 'CANCEL_IF_UNPAID'",
        )
        .fetch_one(&env.pool)
        .await?;
        let next: CancelOrderIfUnpaid = serde_json::from_value(successor.0)?;
        assert_eq!(next.order_id, early);
        assert_ne!(next.message_id, m.message_id, "a new message, not a replay");
        assert_eq!(next.retry_count, 1);
        assert_eq!(successor.1, o.expires_at);
        // The same early message again: the inbox makes it a no-op, no second successor.
        assert_eq!(
            consumer.process(&m, 1, None).await?,
            CancelSettled::AlreadyProcessed
        );
        assert_eq!(
            count(
                &env,
                "SELECT count(*) FROM event_outbox WHERE tag = 'CANCEL_IF_UNPAID'"
            )
            .await?,
            1
        );

        // Late: it cancels, however late.
        let o = get(late.clone()).await?;
        let m = cancel_msg(&o);
        let out = consumer.process(&m, 0, None).await?;
        assert!(
            matches!(out, CancelSettled::Done(CancelOutcome::Canceled { .. })),
            "{out:?}"
        );
        // Twice: the same message is a no-op; another message for the same
        // order finds it already canceled.
        assert_eq!(
            consumer.process(&m, 1, None).await?,
            CancelSettled::AlreadyProcessed
        );
        let again = consumer.process(&cancel_msg(&o), 0, None).await?;
        assert!(
            matches!(
                again,
                CancelSettled::Done(CancelOutcome::NoOp {
                    reason: CancelNoop::AlreadyCanceled,
                    ..
                })
            ),
            "{again:?}"
        );

        // A paid order is never canceled, even when its cancel is long overdue.
        let o = get(paid.clone()).await?;
        assert!(matches!(
            order::pay(
                &env.pool,
                &env.names,
                &paid,
                "p1",
                &seckill_tests::test_actor()
            )
            .await?,
            PayOutcome::Paid { .. }
        ));
        sqlx::query("UPDATE orders SET expires_at = now() - interval '1 hour' WHERE order_id = $1")
            .bind(&paid)
            .execute(&env.pool)
            .await?;
        let out = consumer.process(&cancel_msg(&o), 0, None).await?;
        assert!(
            matches!(
                out,
                CancelSettled::Done(CancelOutcome::NoOp {
                    reason: CancelNoop::AlreadyPaid,
                    ..
                })
            ),
            "{out:?}"
        );
        assert_eq!(get(paid.clone()).await?.status, OrderStatus::Paid);
        // Paying again is idempotent; the answer names the earlier payment.
        match order::pay(
            &env.pool,
            &env.names,
            &paid,
            "p2",
            &seckill_tests::test_actor(),
        )
        .await?
        {
            PayOutcome::AlreadyPaid { order } => {
                assert_eq!(order.payment_id.as_deref(), Some("p1"))
            }
            other => panic!("{other:?}"),
        }
        // An unknown order is a counted no-op.
        let ghost = order::OrderRow {
            order_id: OrderId::generate(),
            ..o.clone()
        };
        let out = consumer.process(&cancel_msg(&ghost), 0, None).await?;
        assert!(
            matches!(
                out,
                CancelSettled::Done(CancelOutcome::NoOp {
                    reason: CancelNoop::UnknownOrder,
                    ..
                })
            ),
            "{out:?}"
        );

        assert_eq!(stats.canceled.get(), 1);
        assert_eq!(stats.cancel_noop_not_yet_due.get(), 1);
        assert_eq!(stats.cancel_noop_already_canceled.get(), 1);
        assert_eq!(stats.cancel_noop_already_paid.get(), 1);
        assert_eq!(stats.cancel_noop_unknown_order.get(), 1);
        assert_eq!(
            count(&env, "SELECT available_stock FROM inventory").await?,
            1
        );
        check_books(&env).await?;
        Ok(())
    });
}

/// A Redis reservation plus the compensation task a source would write.
async fn reserved_with_task(
    env: &TestEnv,
    user: i64,
    source: CompensationSource,
) -> Result<ReleaseReservation> {
    let now = Utc::now().timestamp_millis();
    let reservation_id = ReservationId::generate();
    let req = ReserveRequest {
        activity_id: ACTIVITY,
        sku_id: SKU,
        user_id: UserId(user),
        request_id: RequestId::generate(),
        trace_id: seckill_engine::TraceId::of_reservation(&reservation_id),
        reservation_id,
        message_id: MessageId::generate(),
        order_id: OrderId::generate(),
        now_ms: now,
        valid_until_ms: now + 300_000,
    };
    let out = store(env).reserve(&req, now + 60_000).await?;
    ensure!(matches!(out, ReserveOutcome::Reserved(_)), "{out:?}");
    sqlx::query(
        "INSERT INTO compensation_tasks (reservation_id, activity_id, sku_id, user_id, source, reason)
         VALUES ($1, $2, $3, $4, $5, 'test')",
    )
    .bind(&req.reservation_id)
    .bind(ACTIVITY)
    .bind(SKU)
    .bind(UserId(user))
    .bind(source)
    .execute(&env.pool)
    .await?;
    Ok(release_msg(&req.reservation_id, user, source))
}

fn release_msg(rsv: &ReservationId, user: i64, source: CompensationSource) -> ReleaseReservation {
    ReleaseReservation {
        schema_version: SCHEMA_VERSION,
        event_type: RELEASE_RESERVATION_EVENT.to_owned(),
        message_id: MessageId::generate(),
        reservation_id: rsv.clone(),
        activity_id: ACTIVITY,
        sku_id: SKU,
        user_id: UserId(user),
        source,
        reason: "test".into(),
        created_at: Utc::now(),
    }
}

#[test]
fn a_compensation_delivered_twice_releases_once() {
    run(Setup::Full, |env| async move {
        let store = store(&env);
        store.seed_stock(ACTIVITY, SKU, 10, false, 1).await?;
        let stats = stats();
        let consumer =
            CompensationConsumer::new(env.pool.clone(), store.clone(), &env.names, stats.clone());
        let m = reserved_with_task(&env, 1, CompensationSource::Cancellation).await?;
        assert_eq!(store.stock(ACTIVITY, SKU).await?, Some(9));

        assert_eq!(
            consumer.process(&m, 0, None).await?,
            CompSettled::Released(ReleaseOutcome::Released)
        );
        assert_eq!(store.stock(ACTIVITY, SKU).await?, Some(10));
        assert_eq!(
            store.live_reservations(ACTIVITY).await?,
            0,
            "the buyer slot is free"
        );
        // The same message again: the inbox stops it before Redis.
        assert_eq!(
            consumer.process(&m, 1, None).await?,
            CompSettled::AlreadyProcessed
        );
        // Another message for the same reservation: the script stops it.
        let other = release_msg(&m.reservation_id, 1, CompensationSource::Cancellation);
        assert_eq!(
            consumer.process(&other, 0, None).await?,
            CompSettled::Released(ReleaseOutcome::AlreadyReleased)
        );
        assert_eq!(store.stock(ACTIVITY, SKU).await?, Some(10));

        // 20 deliveries of one reservation's release under different ids, at once.
        let m = reserved_with_task(&env, 2, CompensationSource::BusinessRejection).await?;
        let barrier = Arc::new(Barrier::new(20));
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let (c, b) = (consumer.clone(), barrier.clone());
            let msg = release_msg(&m.reservation_id, 2, CompensationSource::BusinessRejection);
            tasks.push(tokio::spawn(async move {
                b.wait().await;
                c.process(&msg, 0, None).await
            }));
        }
        let mut released = 0;
        for t in tasks {
            if t.await?? == CompSettled::Released(ReleaseOutcome::Released) {
                released += 1;
            }
        }
        assert_eq!(released, 1, "exactly one delivery gave the unit back");
        assert_eq!(store.stock(ACTIVITY, SKU).await?, Some(10));
        assert_eq!(
            count(
                &env,
                "SELECT count(*) FROM compensation_tasks WHERE status = 'RELEASED'"
            )
            .await?,
            2
        );
        assert_eq!(stats.released.get(), 2);

        // A reservation Redis no longer holds: ORPHANED, not retried forever.
        let gone = reserved_with_task(&env, 3, CompensationSource::SendFailure).await?;
        let _: () = redis::cmd("DEL")
            .arg(store.keys(ACTIVITY).rsv(&gone.reservation_id))
            .query_async(&mut env.redis.clone())
            .await?;
        assert_eq!(
            consumer.process(&gone, 0, None).await?,
            CompSettled::Released(ReleaseOutcome::Unknown)
        );
        assert_eq!(
            count(
                &env,
                "SELECT count(*) FROM compensation_tasks WHERE status = 'ORPHANED'"
            )
            .await?,
            1
        );
        Ok(())
    });
}

fn event(o: &order::OrderRow, status: OrderStatus, version: i64) -> OrderEvent {
    OrderEvent {
        schema_version: SCHEMA_VERSION,
        event_type: OrderEvent::event_type_for(status).to_owned(),
        message_id: MessageId::generate(),
        order_id: o.order_id.clone(),
        reservation_id: o.reservation_id.clone(),
        activity_id: o.activity_id,
        sku_id: o.sku_id,
        user_id: o.user_id,
        status,
        aggregate_version: version,
        occurred_at: Utc::now(),
    }
}

fn incoming(topic: &str, body: Vec<u8>, id: &MessageId) -> IncomingMessage {
    IncomingMessage {
        topic: topic.to_owned(),
        tag: None,
        keys: vec![],
        properties: [(PROP_MESSAGE_ID.to_owned(), id.to_string())].into(),
        body,
        broker_msg_id: "test".into(),
        queue_id: 0,
        queue_offset: 0,
        reconsume_times: 0,
        store_timestamp_ms: 0,
        born_timestamp_ms: 0,
    }
}

#[test]
fn the_projection_replayed_out_of_order_ends_at_the_newest_state() {
    run(Setup::Full, |env| async move {
        seed_sold_out(&env, 1).await?;
        let store = store(&env);
        store.seed_stock(ACTIVITY, SKU, 1, false, 1).await?;
        let id = insert_order(&env, 1, ChronoDuration::minutes(10)).await?;
        let o = order::get(&env.pool, &id).await?.expect("order");
        let consumer =
            ProjectionConsumer::new(env.pool.clone(), store.clone(), &env.names, stats());
        let topic = env.names.topic(TopicKind::OrderEvent);
        let created = event(&o, OrderStatus::Created, 1);
        let paid = event(&o, OrderStatus::Paid, 2);
        // Newest first, then the stale one, then the newest again, through
        // the handler (so the bodies are parsed as on the wire).
        for e in [&paid, &created, &paid, &created] {
            let m = incoming(&topic, serde_json::to_vec(e)?, &e.message_id);
            assert_eq!(consumer.handle(vec![m]).await, ConsumeVerdict::Ack);
        }
        let view = store
            .order_view(ACTIVITY, &o.reservation_id)
            .await?
            .expect("view");
        assert_eq!(
            (view.status, view.aggregate_version),
            (OrderStatus::Paid, 2)
        );
        let shown =
            seckill_engine::reservation_status::lookup(&env.pool, &store, &o.reservation_id)
                .await?;
        assert_eq!(shown, Some(seckill_engine::ReservationStatus::Paid));
        assert_eq!(
            serde_json::to_string(&shown)?,
            r#""PAID""#,
            "the API's string"
        );
        assert!(!consumer.apply(&created).await?, "a stale event is refused");
        assert!(consumer.apply(&event(&o, OrderStatus::Canceled, 3)).await?);
        let view = store
            .order_view(ACTIVITY, &o.reservation_id)
            .await?
            .expect("view");
        assert_eq!(view.status, OrderStatus::Canceled);

        // A malformed event is quarantined and ACKed; the view is untouched.
        let bad = incoming(
            &topic,
            br#"{"schema_version": 1, "event_type": "ORDER_PAID"}"#.to_vec(),
            &MessageId::generate(),
        );
        assert_eq!(consumer.handle(vec![bad]).await, ConsumeVerdict::Ack);
        assert_eq!(
            count(&env, "SELECT count(*) FROM message_quarantine").await?,
            1
        );
        assert_eq!(
            store
                .order_view(ACTIVITY, &o.reservation_id)
                .await?
                .expect("view")
                .aggregate_version,
            3
        );
        Ok(())
    });
}

#[test]
fn the_sweeps_settle_what_lost_messages_left_behind() {
    run(Setup::Full, |env| async move {
        seed_sold_out(&env, 2).await?;
        let store = store(&env);
        store.seed_stock(ACTIVITY, SKU, 5, false, 1).await?;
        let stats = stats();
        let overdue = insert_order(&env, 1, ChronoDuration::minutes(-5)).await?;
        let fresh = insert_order(&env, 2, ChronoDuration::seconds(-1)).await?;
        let grace = Duration::from_secs(60);
        let n = cancel::sweep_once(&env.pool, &env.names, grace, 100, &stats).await?;
        assert_eq!(n, 1, "only the order overdue past the grace");
        assert_eq!(
            order::get(&env.pool, &overdue).await?.unwrap().status,
            OrderStatus::Canceled
        );
        assert_eq!(
            order::get(&env.pool, &fresh).await?.unwrap().status,
            OrderStatus::Created
        );
        assert_eq!(
            cancel::sweep_once(&env.pool, &env.names, grace, 100, &stats).await?,
            0
        );
        check_books(&env).await?;

        // A send failure's task whose release never ran (a crash between the two).
        let m = reserved_with_task(&env, 3, CompensationSource::SendFailure).await?;
        assert_eq!(store.stock(ACTIVITY, SKU).await?, Some(4));
        assert_eq!(
            compensate::sweep_once(&env.pool, &store, Duration::from_secs(60), 100, &stats).await?,
            0,
            "too young for the sweep"
        );
        sqlx::query("UPDATE compensation_tasks SET created_at = now() - interval '2 minutes' WHERE reservation_id = $1")
            .bind(&m.reservation_id)
            .execute(&env.pool)
            .await?;
        assert_eq!(
            compensate::sweep_once(&env.pool, &store, Duration::from_secs(60), 100, &stats).await?,
            1
        );
        assert_eq!(store.stock(ACTIVITY, SKU).await?, Some(5));
        assert_eq!(
            compensate::sweep_once(&env.pool, &store, Duration::from_secs(60), 100, &stats).await?,
            0,
            "settled tasks are not swept again"
        );
        Ok(())
    });
}

/// A producer that records what it was asked to send and answers with a
/// fixed outcome, standing in for a broker that times out.
#[derive(Clone)]
struct Scripted {
    sent: Arc<Mutex<Vec<OutgoingMessage>>>,
    unknown: bool,
}

impl Scripted {
    /// The business message id of every message it was asked to send.
    fn message_ids(&self) -> Vec<String> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .filter_map(|m| m.properties.iter().find(|p| p.0 == PROP_MESSAGE_ID))
            .map(|p| p.1.clone())
            .collect()
    }

    fn outcome(&self) -> SendOutcome {
        if self.unknown {
            SendOutcome::Unknown {
                cause: UnknownCause::Timeout,
                detail: "scripted timeout".into(),
            }
        } else {
            SendOutcome::Confirmed(seckill_engine::SendReceipt {
                broker_msg_id: "scripted".into(),
                offset_msg_id: None,
                queue_id: None,
                queue_offset: 0,
            })
        }
    }
}

impl Producer for Scripted {
    async fn send(&self, msg: OutgoingMessage, _timeout: Duration) -> SendOutcome {
        self.sent.lock().unwrap().push(msg);
        self.outcome()
    }

    async fn send_batch(&self, msgs: Vec<OutgoingMessage>, _timeout: Duration) -> SendOutcome {
        self.sent.lock().unwrap().extend(msgs);
        self.outcome()
    }
}

/// Collects the business message ids a consumer sees.
#[derive(Default, Clone)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Handler for Seen {
    async fn handle(&self, batch: Vec<IncomingMessage>) -> ConsumeVerdict {
        let mut seen = self.0.lock().unwrap();
        seen.extend(
            batch
                .iter()
                .filter_map(|m| m.message_id().map(str::to_owned)),
        );
        ConsumeVerdict::Ack
    }
}

#[test]
fn the_outbox_publisher_claims_once_resends_unknown_with_the_same_id_and_sends_timers() {
    run(Setup::Full, |env| async move {
        seed_sold_out(&env, 40).await?;
        // 40 orders paid: 40 ORDER_PAID rows; 1 canceled now: a release and an event.
        let mut ids = Vec::new();
        for u in 0..40 {
            ids.push(insert_order(&env, u, ChronoDuration::minutes(10)).await?);
        }
        for id in &ids[1..] {
            order::pay(&env.pool, &env.names, id, "p", &seckill_tests::test_actor()).await?;
        }
        order::cancel(&env.pool, &env.names, &ids[0], CancelMode::Now, "test").await?;
        let rows = count(&env, "SELECT count(*) FROM event_outbox").await?;
        assert_eq!(rows, 41);

        let cfg = OutboxConfig {
            batch_max: 16,
            ..OutboxConfig::default()
        };
        // UNKNOWN: every row stays PENDING, pushed back, with its error.
        let unknown = Scripted {
            sent: Default::default(),
            unknown: true,
        };
        let deps = OutboxDeps {
            producer: unknown.clone(),
            pool: env.pool.clone(),
            send_timeout: Duration::from_secs(1),
            stats: stats(),
            orders: None,
        };
        let first = outbox::publish_once(
            &deps,
            &OutboxConfig {
                batch_max: 100,
                ..cfg.clone()
            },
        )
        .await?;
        assert_eq!((first.claimed, first.sent, first.retry), (41, 0, 41));
        assert_eq!(
            count(&env, "SELECT count(*) FROM event_outbox WHERE status = 'PENDING' AND last_error LIKE 'UNKNOWN%' AND next_attempt_at > now()").await?,
            41
        );
        let unknown_ids: HashSet<String> = unknown.message_ids().into_iter().collect();
        assert_eq!(unknown_ids.len(), 41);
        sqlx::query("UPDATE event_outbox SET next_attempt_at = now()")
            .execute(&env.pool)
            .await?;

        // Two instances at once, against a recording producer: every row is
        // sent exactly once between them, with the id the UNKNOWN send carried.
        let ok = Scripted {
            sent: Default::default(),
            unknown: false,
        };
        let deps = OutboxDeps {
            producer: ok.clone(),
            ..deps
        };
        let (a, b) = tokio::join!(
            async {
                let mut n = 0;
                loop {
                    let r = outbox::publish_once(&deps, &cfg).await?;
                    if r.claimed == 0 {
                        break Ok::<_, anyhow::Error>(n);
                    }
                    n += r.sent;
                }
            },
            async {
                let mut n = 0;
                loop {
                    let r = outbox::publish_once(&deps, &cfg).await?;
                    if r.claimed == 0 {
                        break Ok::<_, anyhow::Error>(n);
                    }
                    n += r.sent;
                }
            },
        );
        assert_eq!(a? + b?, 41);
        let sent: Vec<String> = ok.message_ids();
        assert_eq!(sent.len(), 41, "no row sent twice");
        assert_eq!(
            sent.iter().cloned().collect::<HashSet<_>>(),
            unknown_ids,
            "the same message ids"
        );
        assert_eq!(
            count(
                &env,
                "SELECT count(*) FROM event_outbox WHERE status = 'SENT'"
            )
            .await?,
            41
        );

        // The real broker: a timer row arrives no earlier than its deliver_at,
        // with its message_id; an order event arrives at once.
        let order = order::get(&env.pool, &ids[1]).await?.unwrap();
        let deliver_at = Utc::now() + ChronoDuration::seconds(3);
        let timer = MessageId::generate();
        let mut tx = env.pool.begin().await?;
        order::insert_outbox(
            &mut tx,
            &[order::OutboxRow {
                message_id: timer.clone(),
                topic: env.names.topic(TopicKind::OrderTimeout),
                tag: "CANCEL_IF_UNPAID",
                key: order.order_id.to_string(),
                payload: serde_json::to_value(cancel_msg(&order))?,
                deliver_at: Some(deliver_at),
            }],
        )
        .await?;
        tx.commit().await?;
        let producer = RocketProducer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &env.names.producer_group(),
            Duration::from_secs(3),
            1,
        )
        .await?;
        let seen = Seen::default();
        let consumer = RocketConsumer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &ConsumerSpec::new(
                env.names.group(TopicKind::OrderTimeout),
                env.names.topic(TopicKind::OrderTimeout),
            ),
            Arc::new(seen.clone()),
        )
        .await?;
        let deps = OutboxDeps {
            producer: producer.clone(),
            pool: env.pool.clone(),
            send_timeout: Duration::from_secs(3),
            stats: stats(),
            orders: None,
        };
        let r = outbox::publish_once(&deps, &cfg).await?;
        assert_eq!((r.claimed, r.sent), (1, 1));
        // Generous: the broker's timer delivers only ~64 messages/s and this
        // one queues behind any timer backlog on the shared broker.
        let got = eventually(Duration::from_secs(240), "the timer message", || async {
            let seen = seen.0.lock().unwrap().clone();
            Ok(seen.contains(&timer.to_string()).then(Utc::now))
        })
        .await?;
        // Asked for `timer_lead_ms` before it is due (the cancel consumer
        // holds it until then, docs/architecture.md §8.2), and not sooner:
        // a message sent for immediate delivery would be here at once.
        let lead = ChronoDuration::milliseconds(cfg.timer_lead_ms as i64);
        assert!(
            got >= deliver_at - lead - ChronoDuration::milliseconds(50),
            "delivered {got}, due {deliver_at}, asked for {lead} before"
        );
        consumer.shutdown().await;
        producer.shutdown().await;
        Ok(())
    });
}

#[test]
fn twenty_payers_against_twenty_cancellers_on_one_order_100_times_one_winner() {
    run(Setup::Full, |env| async move {
        const ROUNDS: i64 = 100;
        const EACH: usize = 20;
        seed_sold_out(&env, ROUNDS).await?;
        let mut canceled_rounds = 0;
        for round in 0..ROUNDS {
            let id = insert_order(&env, 5_000 + round, ChronoDuration::minutes(10)).await?;
            let barrier = Arc::new(Barrier::new(2 * EACH));
            let mut pays = Vec::new();
            let mut cancels = Vec::new();
            for k in 0..EACH {
                let (pool, names, b, order) = (
                    env.pool.clone(),
                    env.names.clone(),
                    barrier.clone(),
                    id.clone(),
                );
                pays.push(tokio::spawn(async move {
                    b.wait().await;
                    jitter(20).await;
                    order::pay(
                        &pool,
                        &names,
                        &order,
                        &format!("pay_{k}"),
                        &seckill_tests::test_actor(),
                    )
                    .await
                }));
                let (pool, names, b, order) = (
                    env.pool.clone(),
                    env.names.clone(),
                    barrier.clone(),
                    id.clone(),
                );
                cancels.push(tokio::spawn(async move {
                    b.wait().await;
                    jitter(20).await;
                    order::cancel(&pool, &names, &order, CancelMode::Now, "race").await
                }));
            }
            let (mut paid, mut canceled) = (0, 0);
            for p in pays {
                paid += matches!(p.await??, PayOutcome::Paid { .. }) as i64;
            }
            for c in cancels {
                canceled += matches!(c.await??, CancelOutcome::Canceled { .. }) as i64;
            }
            ensure!(
                paid + canceled == 1,
                "round {round}: {paid} payment(s) and {canceled} cancel(s) won; exactly one must"
            );
            canceled_rounds += canceled;
        }
        // The stock came back exactly once per canceled order, and only then.
        assert_eq!(
            count(&env, "SELECT available_stock FROM inventory").await?,
            canceled_rounds
        );
        assert_eq!(
            count(
                &env,
                "SELECT count(*) FROM event_outbox WHERE tag = 'RELEASE_RESERVATION'"
            )
            .await?,
            canceled_rounds
        );
        check_books(&env).await?;
        Ok(())
    });
}
