//! The order path end to end against the real stack: the three failure
//! windows of docs/architecture.md §1, the HTTP ingress contract, and two daemons
//! sharing the work. Each window runs at batch size 1 and at the default.

use anyhow::{Result, ensure};
use seckill_engine::{
    ActivityId, Config, ConsumeVerdict, ConsumerSpec, Handler, IncomingMessage, NewActivity,
    OrderConsumer, Producer, RequestId, Reservation, ReservationId, ReservationStore,
    ReserveOutcome, ReserveRequest, RocketConsumer, RocketProducer, SkuId, TopicKind, TraceId,
    activity, publish::order_message, publish::to_outgoing,
};
use seckill_tests::{Engine, Setup, TestEnv, eventually, reserve_request, run};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const ACTIVITY: ActivityId = ActivityId(42);
const SKU: SkuId = SkuId(7);

fn store(env: &TestEnv) -> ReservationStore {
    env.store()
}

async fn seed(env: &TestEnv, stock: i64, valid_for_ms: i64) -> Result<()> {
    env.seed_activity(ACTIVITY, SKU, stock, valid_for_ms).await
}

fn engine_cfg(env: &TestEnv, batch: usize) -> Config {
    let mut cfg = env.cfg.clone();
    cfg.publisher.batch_max = batch;
    cfg.consumer.batch_max = batch as u32;
    // Tests want the scanner prompt; production waits longer for the first send.
    cfg.scanner.first_retry_after_ms = 500;
    cfg.scanner.interval_ms = 100;
    cfg.scanner.backoff_base_ms = 100;
    cfg.scanner.backoff_max_ms = 1_000;
    // These tests are about the order path, not the governor: on a loaded
    // 2-core CI box a short-validity test activity can look like docs/architecture.md
    // §10.8 last row and close ingress. tests/observe.rs tests that row.
    cfg.governor.admission_control = false;
    cfg
}

/// One order, one ledger row and one inbox row: the business effect
/// happened exactly once (docs/architecture.md §12).
async fn assert_one_business_effect(env: &TestEnv) -> Result<()> {
    assert_eq!(count(env, "SELECT count(*) FROM orders").await?, 1);
    assert_eq!(
        count(env, "SELECT count(*) FROM inventory_ledger").await?,
        1
    );
    assert_eq!(count(env, "SELECT count(*) FROM consumer_inbox").await?, 1);
    Ok(())
}

/// Puts the reservation's order-create message on the broker directly,
/// leaving the reservation itself untouched in Redis.
async fn store_on_broker(env: &TestEnv, r: &Reservation) -> Result<()> {
    let producer = RocketProducer::start(
        env.rt.clone(),
        &env.cfg.namesrv_addr,
        &format!("{}PG_TEST", env.names.prefix()),
        Duration::from_secs(3),
        0,
    )
    .await?;
    let topic = env.names.topic(TopicKind::OrderCreate);
    let m = order_message(r);
    let out = producer
        .send(to_outgoing(&m, &topic), Duration::from_secs(3))
        .await;
    producer.shutdown().await;
    ensure!(out.is_confirmed(), "{out:?}");
    Ok(())
}

async fn outcome_of(env: &TestEnv, rsv: &ReservationId) -> Result<Option<String>> {
    Ok(
        sqlx::query_scalar("SELECT outcome::text FROM reservations WHERE reservation_id = $1")
            .bind(rsv)
            .fetch_optional(&env.pool)
            .await?,
    )
}

async fn count(env: &TestEnv, sql: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(&env.pool).await?)
}

fn request(user: i64, now: i64, valid_for: i64) -> ReserveRequest {
    reserve_request(ACTIVITY, SKU, user, now, valid_for)
}

/// Window 1: the reservation is written, then the process dies before it
/// sends. Nothing but Redis knows; the scanner must send it.
fn window_1(batch: usize) {
    run(Setup::Full, move |env| async move {
        seed(&env, 10, 300_000).await?;
        let now = chrono::Utc::now().timestamp_millis();
        let req = request(1, now, 300_000);
        // Reserved, never offered to a publisher: the "killed before send" state.
        let ReserveOutcome::Reserved(r) = store(&env).reserve(&req, now).await? else {
            anyhow::bail!("not reserved");
        };
        let engine = Engine::start(&env, engine_cfg(&env, batch)).await?;
        let got = eventually(Duration::from_secs(60), "the scanner's order", || async {
            outcome_of(&env, &r.reservation_id).await
        })
        .await?;
        engine.stop().await?;
        assert_eq!(got, "ORDER_CREATED");
        assert_eq!(count(&env, "SELECT count(*) FROM orders").await?, 1);
        let back = store(&env)
            .get(ACTIVITY, &r.reservation_id)
            .await?
            .expect("still in Redis");
        assert_eq!(
            back.message_id, req.message_id,
            "re-sent with the same message_id"
        );
        Ok(())
    });
}

#[test]
fn window_1_killed_before_send_is_sent_by_the_scanner_batch_1() {
    window_1(1);
}

#[test]
fn window_1_killed_before_send_is_sent_by_the_scanner_batch_default() {
    window_1(Config::default().publisher.batch_max);
}

/// Window 2: the broker stored the message but the producer was told
/// UNKNOWN, so the reservation stayed pending; the scanner re-sends the same
/// message_id and the inbox absorbs the duplicate.
fn window_2(batch: usize) {
    run(Setup::Full, move |env| async move {
        seed(&env, 10, 300_000).await?;
        let now = chrono::Utc::now().timestamp_millis();
        let ReserveOutcome::Reserved(r) =
            store(&env).reserve(&request(2, now, 300_000), now).await?
        else {
            anyhow::bail!("not reserved");
        };
        // The broker stores it; the reservation is left MQ_PENDING, as after UNKNOWN.
        let topic = env.names.topic(TopicKind::OrderCreate);
        store_on_broker(&env, &r).await?;

        let engine = Engine::start(&env, engine_cfg(&env, batch)).await?;
        eventually(Duration::from_secs(60), "the order", || async {
            outcome_of(&env, &r.reservation_id).await
        })
        .await?;
        // Both copies reach the consumer; wait until the scanner has re-sent and the
        // reservation is marked sent, so the duplicate delivery has happened or is queued.
        eventually(Duration::from_secs(60), "the re-send confirmed", || async {
            let back = store(&env).get(ACTIVITY, &r.reservation_id).await?;
            Ok(back
                .filter(|b| b.mq_status.as_str() == "MQ_SENT")
                .map(|_| ()))
        })
        .await?;
        eventually(
            Duration::from_secs(60),
            "the duplicate consumed",
            || async {
                let lag = env
                    .admin
                    .lag(&topic, &env.names.group(TopicKind::OrderCreate))
                    .await?;
                Ok((lag.messages == 0).then_some(()))
            },
        )
        .await?;
        engine.stop().await?;
        assert_one_business_effect(&env).await?;
        Ok(())
    });
}

#[test]
fn window_2_unknown_outcome_resent_with_the_same_id_gives_one_order_batch_1() {
    window_2(1);
}

#[test]
fn window_2_unknown_outcome_resent_with_the_same_id_gives_one_order_batch_default() {
    window_2(Config::default().publisher.batch_max);
}

/// Window 3: the transaction commits, then the consumer dies before ACK.
/// Modelled by a handler that runs the real consumer and then withholds the
/// ACK once: the broker redelivers and the inbox makes it a no-op.
struct CrashBeforeAck {
    inner: OrderConsumer,
    calls: AtomicUsize,
}

impl Handler for CrashBeforeAck {
    async fn handle(&self, batch: Vec<IncomingMessage>) -> ConsumeVerdict {
        let verdict = self.inner.handle(batch).await;
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            return ConsumeVerdict::Retry;
        }
        verdict
    }
}

fn window_3(batch: u32) {
    run(Setup::Full, move |env| async move {
        seed(&env, 10, 300_000).await?;
        let now = chrono::Utc::now().timestamp_millis();
        let ReserveOutcome::Reserved(r) =
            store(&env).reserve(&request(3, now, 300_000), now).await?
        else {
            anyhow::bail!("not reserved");
        };
        let topic = env.names.topic(TopicKind::OrderCreate);
        store_on_broker(&env, &r).await?;

        let handler = Arc::new(CrashBeforeAck {
            inner: OrderConsumer::new(env.pool.clone(), env.names.clone()),
            calls: AtomicUsize::new(0),
        });
        let mut spec = ConsumerSpec::new(env.names.group(TopicKind::OrderCreate), topic);
        spec.batch_max = batch;
        let consumer = RocketConsumer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &spec,
            handler.clone(),
        )
        .await?;
        eventually(Duration::from_secs(90), "the redelivery", || async {
            Ok((handler.calls.load(Ordering::SeqCst) >= 2).then_some(()))
        })
        .await?;
        consumer.shutdown().await;
        assert_eq!(
            outcome_of(&env, &r.reservation_id).await?.as_deref(),
            Some("ORDER_CREATED")
        );
        assert_one_business_effect(&env).await?;
        Ok(())
    });
}

#[test]
fn window_3_commit_then_crash_before_ack_hits_the_inbox_batch_1() {
    window_3(1);
}

#[test]
fn window_3_commit_then_crash_before_ack_hits_the_inbox_batch_default() {
    window_3(Config::default().consumer.batch_max);
}

#[test]
fn an_expired_reservation_is_rejected_once_with_one_compensation() {
    run(Setup::Full, |env| async move {
        seed(&env, 10, 300_000).await?;
        // Reserved a minute ago with a validity that has already run out:
        // the scanner still sends it, and the consumer must reject it.
        let now = chrono::Utc::now().timestamp_millis();
        let req = request(4, now - 60_000, 1_000);
        let ReserveOutcome::Reserved(r) = store(&env).reserve(&req, now).await? else {
            anyhow::bail!("not reserved");
        };
        let engine = Engine::start(&env, engine_cfg(&env, 32)).await?;
        let got = eventually(Duration::from_secs(60), "the rejection", || async {
            outcome_of(&env, &r.reservation_id).await
        })
        .await?;
        engine.stop().await?;
        assert_eq!(got, "REJECTED_EXPIRED");
        assert_eq!(count(&env, "SELECT count(*) FROM orders").await?, 0);
        assert_eq!(
            count(&env, "SELECT count(*) FROM compensation_tasks").await?,
            1
        );
        assert_eq!(
            count(
                &env,
                "SELECT count(*) FROM event_outbox WHERE tag = 'RELEASE_RESERVATION'"
            )
            .await?,
            1
        );
        assert_eq!(
            count(&env, "SELECT available_stock FROM inventory").await?,
            10
        );
        Ok(())
    });
}

async fn post(
    engine: &Engine,
    activity: &str,
    body: serde_json::Value,
) -> Result<(u16, serde_json::Value)> {
    post_traced(engine, activity, body, None).await
}

async fn post_traced(
    engine: &Engine,
    activity: &str,
    body: serde_json::Value,
    traceparent: Option<&str>,
) -> Result<(u16, serde_json::Value)> {
    let mut req = engine
        .http
        .post(format!(
            "http://{}/v1/activities/{activity}/skus/{}/reservations",
            engine.addr, SKU.0
        ))
        .json(&body);
    if let Some(h) = traceparent {
        req = req.header("traceparent", h);
    }
    let r = req.send().await?;
    let code = r.status().as_u16();
    Ok((code, r.json().await.unwrap_or_default()))
}

#[test]
fn ingress_contract_queued_sold_out_duplicate_idempotent_and_malformed() {
    run(Setup::Full, |env| async move {
        seed(&env, 1, 300_000).await?;
        let engine = Engine::start(&env, engine_cfg(&env, 32)).await?;
        let a = ACTIVITY.0.to_string();
        let req = RequestId::generate();

        // Malformed requests: 4xx with a reason, nothing written.
        for (activity, body) in [
            (
                "x",
                serde_json::json!({"user_id": 1, "request_id": req.as_str()}),
            ),
            (
                a.as_str(),
                serde_json::json!({"user_id": -1, "request_id": req.as_str()}),
            ),
            (
                a.as_str(),
                serde_json::json!({"user_id": 1, "request_id": "nope"}),
            ),
            (a.as_str(), serde_json::json!({"user_id": 1})),
            (
                a.as_str(),
                serde_json::json!({"user_id": 1, "request_id": req.as_str(), "extra": true}),
            ),
        ] {
            let (code, body) = post(&engine, activity, body).await?;
            assert_eq!(code, 400, "{body}");
            assert!(
                body["reason"].as_str().is_some_and(|r| !r.is_empty()),
                "{body}"
            );
        }
        assert_eq!(
            store(&env).stock(ACTIVITY, SKU).await?,
            Some(1),
            "malformed requests wrote nothing"
        );

        let (code, first) = post(
            &engine,
            &a,
            serde_json::json!({"user_id": 1, "request_id": req.as_str()}),
        )
        .await?;
        assert_eq!(code, 202, "{first}");
        assert_eq!(first["status"], "QUEUED");
        // The same request_id returns the same reservation.
        let (code, again) = post(
            &engine,
            &a,
            serde_json::json!({"user_id": 1, "request_id": req.as_str()}),
        )
        .await?;
        assert_eq!(code, 202);
        assert_eq!(again["reservation_id"], first["reservation_id"]);
        assert_eq!(again["message_id"], first["message_id"]);
        // Another user reusing the request_id is refused, not handed the reservation.
        let (code, stolen) = post(
            &engine,
            &a,
            serde_json::json!({"user_id": 2, "request_id": req.as_str()}),
        )
        .await?;
        assert_eq!(
            (code, stolen["error"].as_str()),
            (409, Some("REQUEST_ID_CONFLICT")),
            "{stolen}"
        );
        assert!(stolen.get("reservation_id").is_none());
        let other = RequestId::generate();
        let (code, dup) = post(
            &engine,
            &a,
            serde_json::json!({"user_id": 1, "request_id": other.as_str()}),
        )
        .await?;
        assert_eq!(
            (code, dup["error"].as_str()),
            (409, Some("SOLD_OUT")),
            "stock 1 is gone first"
        );
        let (code, _) = post(
            &engine,
            "999",
            serde_json::json!({"user_id": 2, "request_id": other.as_str()}),
        )
        .await?;
        assert_eq!(code, 404);

        let rsv = first["reservation_id"].as_str().unwrap().to_owned();
        let url = format!("http://{}/v1/reservations/{rsv}", engine.addr);
        let status = eventually(Duration::from_secs(60), "ORDER_CREATED", || async {
            let v: serde_json::Value = engine.http.get(&url).send().await?.json().await?;
            Ok((v["status"] == "ORDER_CREATED").then_some(v))
        })
        .await?;
        assert_eq!(status["reservation_id"], rsv.as_str());
        engine.stop().await?;
        Ok(())
    });
}

#[test]
fn a_duplicate_user_is_refused_at_ingress() {
    run(Setup::Full, |env| async move {
        seed(&env, 5, 300_000).await?;
        let engine = Engine::start(&env, engine_cfg(&env, 32)).await?;
        let a = ACTIVITY.0.to_string();
        let (code, _) = post(
            &engine,
            &a,
            serde_json::json!({"user_id": 9, "request_id": RequestId::generate().as_str()}),
        )
        .await?;
        assert_eq!(code, 202);
        let (code, body) = post(
            &engine,
            &a,
            serde_json::json!({"user_id": 9, "request_id": RequestId::generate().as_str()}),
        )
        .await?;
        assert_eq!(
            (code, body["error"].as_str()),
            (409, Some("DUPLICATE_USER"))
        );
        engine.stop().await?;
        Ok(())
    });
}

#[test]
fn two_daemons_share_the_work_without_duplicating_it() {
    run(Setup::Full, |env| async move {
        let n = 200;
        seed(&env, n, 300_000).await?;
        let e1 = Engine::start(&env, engine_cfg(&env, 32)).await?;
        let e2 = Engine::start(&env, engine_cfg(&env, 32)).await?;
        let a = ACTIVITY.0.to_string();
        let mut rsvs = Vec::new();
        for user in 0..n {
            let e = if user % 2 == 0 { &e1 } else { &e2 };
            let (code, body) = post(e, &a, serde_json::json!({"user_id": user + 1, "request_id": RequestId::generate().as_str()})).await?;
            assert_eq!(code, 202, "{body}");
            rsvs.push(body["reservation_id"].as_str().unwrap().to_owned());
        }
        eventually(
            Duration::from_secs(90),
            "every reservation decided",
            || async {
                Ok((count(&env, "SELECT count(*) FROM reservations").await? == n).then_some(()))
            },
        )
        .await?;
        e1.stop().await?;
        e2.stop().await?;
        assert_eq!(count(&env, "SELECT count(*) FROM orders").await?, n);
        assert_eq!(
            count(&env, "SELECT count(*) FROM inventory_ledger").await?,
            n
        );
        assert_eq!(
            count(&env, "SELECT available_stock FROM inventory").await?,
            0
        );
        Ok(())
    });
}

#[test]
fn reseeding_is_refused_while_reservations_are_live_or_the_window_is_absurd() {
    run(Setup::Full, |env| async move {
        seed(&env, 10, 300_000).await?;
        let again = NewActivity {
            activity: ACTIVITY,
            sku: SKU,
            stock: 20,
            valid_for_ms: 300_000,
            pay_within_ms: 900_000,
            force: false,
        };
        let err = activity::create(&env.pool, &store(&env), &again)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("--force"), "{err}");

        let now = chrono::Utc::now().timestamp_millis();
        store(&env)
            .reserve(&request(5, now, 300_000), now + 60_000)
            .await?;
        let forced = NewActivity {
            force: true,
            ..again.clone()
        };
        let err = activity::create(&env.pool, &store(&env), &forced)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("live reservation"), "{err}");
        assert_eq!(
            store(&env).stock(ACTIVITY, SKU).await?,
            Some(9),
            "nothing was overwritten"
        );

        let absurd = NewActivity {
            activity: ActivityId(43),
            valid_for_ms: i64::MAX,
            ..again
        };
        let err = activity::create(&env.pool, &store(&env), &absurd)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("--valid-for"), "{err}");
        Ok(())
    });
}

#[test]
fn shutdown_flushes_the_publisher_before_stopping_the_producer() {
    run(Setup::Full, |env| async move {
        seed(&env, 100, 300_000).await?;
        let mut cfg = engine_cfg(&env, 32);
        // Keep the scanner out of it: only the publisher's flush can send these.
        cfg.scanner.first_retry_after_ms = 600_000;
        // And hold the batch open, so everything is still queued at shutdown.
        cfg.publisher.batch_max = 1_000;
        cfg.publisher.linger_ms = 600_000;
        let engine = Engine::start(&env, cfg).await?;
        let a = ACTIVITY.0.to_string();
        let mut rsvs = Vec::new();
        for user in 1..=50 {
            let (code, body) = post(
                &engine,
                &a,
                serde_json::json!({"user_id": user, "request_id": RequestId::generate().as_str()}),
            )
            .await?;
            assert_eq!(code, 202, "{body}");
            rsvs.push(ReservationId::parse(
                body["reservation_id"].as_str().unwrap(),
            )?);
        }
        for id in &rsvs {
            let r = store(&env).get(ACTIVITY, id).await?.expect("reservation");
            assert_eq!(r.mq_status.as_str(), "MQ_PENDING", "{id} is still queued");
        }
        engine.stop().await?;
        for id in rsvs {
            let r = store(&env).get(ACTIVITY, &id).await?.expect("reservation");
            assert_eq!(r.mq_status.as_str(), "MQ_SENT", "{id} was not flushed");
        }
        Ok(())
    });
}

#[test]
fn reconcile_passes_after_a_sale_and_names_the_counterexample_when_broken() {
    run(Setup::Full, |env| async move {
        seed(&env, 3, 300_000).await?;
        let engine = Engine::start(&env, engine_cfg(&env, 32)).await?;
        let a = ACTIVITY.0.to_string();
        for user in 1..=5 {
            post(
                &engine,
                &a,
                serde_json::json!({"user_id": user, "request_id": RequestId::generate().as_str()}),
            )
            .await?;
        }
        eventually(Duration::from_secs(60), "three orders", || async {
            Ok((count(&env, "SELECT count(*) FROM orders").await? == 3).then_some(()))
        })
        .await?;
        engine.stop().await?;
        let report = seckill_engine::reconcile::run(&env.pool, &store(&env), ACTIVITY).await?;
        assert!(report.passed(), "{report:#?}");

        // Break PostgreSQL conservation by hand: one unit appears from nowhere.
        sqlx::query("UPDATE inventory SET available_stock = available_stock + 1")
            .execute(&env.pool)
            .await?;
        let report = seckill_engine::reconcile::run(&env.pool, &store(&env), ACTIVITY).await?;
        assert!(!report.passed());
        let failed: Vec<_> = report
            .checks
            .iter()
            .filter(|c| !c.counterexamples.is_empty())
            .collect();
        assert_eq!(failed.len(), 1, "{failed:#?}");
        assert!(failed[0].invariant.contains("PostgreSQL conservation"));
        assert!(failed[0].counterexamples[0].contains(&format!("sku {}", SKU.0)));
        Ok(())
    });
}

/// Issue: cancel/compensation, the mixed run. Some orders are paid, the
/// rest run out their pay window: the delayed cancel or, should the
/// broker's timer lag (it follows any earlier timer backlog on the shared
/// broker), the sweep cancels them exactly once, the compensation gives their Redis stock back, the
/// projection shows PAID and CANCELED, and both conservation invariants
/// hold at the end.
#[test]
fn a_mixed_run_pays_some_cancels_the_rest_and_both_books_balance() {
    run(Setup::Full, |env| async move {
        const STOCK: i64 = 12;
        const PAY_WITHIN_MS: i64 = 8_000;
        activity::create(
            &env.pool,
            &store(&env),
            &NewActivity {
                activity: ACTIVITY,
                sku: SKU,
                stock: STOCK,
                valid_for_ms: 300_000,
                pay_within_ms: PAY_WITHIN_MS,
                force: false,
            },
        )
        .await?;
        let engine = Engine::start(&env, engine_cfg(&env, 32)).await?;
        let a = ACTIVITY.0.to_string();
        let mut queued = Vec::new();
        for user in 1..=15 {
            let (code, body) = post(
                &engine,
                &a,
                serde_json::json!({"user_id": user, "request_id": RequestId::generate().as_str()}),
            )
            .await?;
            if code == 202 {
                queued.push((
                    body["reservation_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    body["order_id"].as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
        assert_eq!(queued.len() as i64, STOCK);
        eventually(Duration::from_secs(60), "every order created", || async {
            Ok((count(&env, "SELECT count(*) FROM orders").await? == STOCK).then_some(()))
        })
        .await?;

        let http = engine.http.clone();
        let (to_pay, to_lapse) = queued.split_at(queued.len() / 2);
        for (_, order) in to_pay {
            let r = http
                .post(format!("http://{}/v1/orders/{order}/pay", engine.addr))
                .json(&serde_json::json!({"payment_id": format!("pay-{order}")}))
                .send()
                .await?;
            assert_eq!(r.status().as_u16(), 200);
            let body: serde_json::Value = r.json().await?;
            assert_eq!(body["outcome"], "PAID", "{body}");
        }
        let lapsed = to_lapse.len() as i64;
        eventually(
            Duration::from_secs(90),
            "unpaid orders canceled and their stock released in Redis",
            || async {
                let canceled = count(
                    &env,
                    "SELECT count(*) FROM orders WHERE status = 'CANCELED'",
                )
                .await?;
                let released = count(
                    &env,
                    "SELECT count(*) FROM compensation_tasks WHERE status = 'RELEASED'",
                )
                .await?;
                Ok((canceled == lapsed && released == lapsed).then_some(()))
            },
        )
        .await?;
        let status = |rsv: String| {
            let url = format!("http://{}/v1/reservations/{rsv}", engine.addr);
            let http = engine.http.clone();
            async move {
                let body: serde_json::Value = http.get(&url).send().await?.json().await?;
                Ok::<_, anyhow::Error>(body["status"].as_str().unwrap_or_default().to_owned())
            }
        };
        eventually(
            Duration::from_secs(30),
            "the projection shows PAID and CANCELED",
            || async {
                let paid = status(to_pay[0].0.clone()).await?;
                let canceled = status(to_lapse[0].0.clone()).await?;
                Ok((paid == "PAID" && canceled == "CANCELED").then_some(()))
            },
        )
        .await?;
        let stats: serde_json::Value = engine
            .http
            .get(format!("http://{}/v1/stats", engine.addr))
            .send()
            .await?
            .json()
            .await?;
        assert_eq!(stats["lifecycle"]["canceled"], lapsed, "{stats}");
        assert_eq!(
            stats["lifecycle"]["sweep_canceled"], 0,
            "the messages did it: {stats}"
        );
        engine.stop().await?;

        let s = store(&env);
        assert_eq!(s.stock(ACTIVITY, SKU).await?, Some(lapsed));
        assert_eq!(s.live_reservations(ACTIVITY).await? as i64, STOCK - lapsed);
        assert_eq!(
            count(&env, "SELECT available_stock FROM inventory").await?,
            lapsed
        );
        let report = seckill_engine::reconcile::run(&env.pool, &s, ACTIVITY).await?;
        assert!(report.passed(), "{report:#?}");
        Ok(())
    });
}

/// docs/architecture.md §11.5: one W3C trace per reservation. A valid
/// incoming `traceparent` is honoured, an invalid one ignored (the trace is
/// the reservation id's), and every send of the message, the scanner's
/// included, carries that trace in its property and body.
#[test]
fn one_trace_per_reservation_from_the_header_or_the_id() {
    run(Setup::Full, |env| async move {
        seed(&env, 4, 300_000).await?;
        let engine = Engine::start(&env, engine_cfg(&env, 32)).await?;
        let a = ACTIVITY.0.to_string();
        let honoured = "4bf92f3577b34da6a3ce929d0e0e4736";
        let mut want = std::collections::BTreeMap::new();
        for (user, header) in [
            (1, Some(format!("00-{honoured}-00f067aa0ba902b7-01"))),
            (2, None),
            (3, Some("00-not-a-trace-01".to_owned())),
        ] {
            let body =
                serde_json::json!({"user_id": user, "request_id": RequestId::generate().as_str()});
            let (code, body) = post_traced(&engine, &a, body, header.as_deref()).await?;
            ensure!(code == 202, "user {user}: {body}");
            let rsv: ReservationId = body["reservation_id"].as_str().unwrap_or("").parse()?;
            let trace = if user == 1 {
                honoured.to_owned()
            } else {
                TraceId::of_reservation(&rsv).to_string()
            };
            ensure!(body["trace_id"] == trace.as_str(), "user {user}: {body}");
            want.insert(rsv.to_string(), trace);
        }
        // Reserved and never offered to the publisher: the scanner sends
        // it, with the trace the reservation was stored with.
        let now = chrono::Utc::now().timestamp_millis();
        let mut req = reserve_request(ACTIVITY, SKU, 4, now, 300_000);
        req.trace_id = TraceId::parse("0af7651916cd43dd8448eb211c80319c").expect("a trace id");
        let ReserveOutcome::Reserved(r) = store(&env).reserve(&req, now).await? else {
            anyhow::bail!("not reserved");
        };
        want.insert(r.reservation_id.to_string(), req.trace_id.to_string());

        // Every send carries the trace, in the property and the body; the
        // outbox carries it on to each order's ORDER_CREATED event (§11.5).
        for (kind, what) in [
            (TopicKind::OrderCreate, "order messages"),
            (TopicKind::OrderEvent, "order events"),
        ] {
            let topic = env.names.topic(kind);
            let seen = eventually(Duration::from_secs(60), what, || async {
                let seen = traces_on(&env, &topic).await?;
                Ok((seen.len() >= 4).then_some(seen))
            })
            .await?;
            for (rsv, trace) in &want {
                let (in_body, prop) = seen.get(rsv).cloned().unwrap_or_default();
                if kind == TopicKind::OrderCreate {
                    ensure!(
                        in_body == trace.as_str(),
                        "{rsv}: body trace {in_body}, want {trace}"
                    );
                }
                ensure!(
                    prop.starts_with(&format!("00-{trace}-")),
                    "{what} of {rsv}: traceparent {prop:?}, want trace {trace}"
                );
            }
        }
        engine.stop().await?;
        Ok(())
    });
}

/// Every message of `topic`, by the reservation it is about: the body's
/// trace id, if it has one, and the `traceparent` property.
async fn traces_on(
    env: &TestEnv,
    topic: &str,
) -> Result<std::collections::BTreeMap<String, (serde_json::Value, String)>> {
    let mut seen = std::collections::BTreeMap::new();
    for (broker, q) in env.admin.queue_offsets(topic).await? {
        if q.max > q.min {
            let pulled = env
                .admin
                .pull(&broker, topic, q.queue_id, q.min, (q.max - q.min) as i32)
                .await?;
            for m in pulled.messages {
                let body: serde_json::Value = serde_json::from_slice(&m.body)?;
                let key = body["reservation_id"].as_str().unwrap_or("").to_owned();
                let prop = m.property("traceparent").unwrap_or("").to_owned();
                seen.insert(key, (body["trace"]["trace_id"].clone(), prop));
            }
        }
    }
    Ok(seen)
}
