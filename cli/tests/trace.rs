//! `seckillctl trace` (docs/architecture.md §11.6): one reservation's story
//! across Redis, the broker's traces in PostgreSQL and PostgreSQL itself,
//! with a verdict and its exit code, for an ordinary order, a canceled one
//! and a rejected one, found by each kind of id.

use anyhow::{Context, Result, ensure};
use seckill_engine::{
    ActivityId, OrderId, Producer, RequestId, ReserveOutcome, RocketProducer, SkuId, TopicKind,
    publish::order_message, publish::to_outgoing,
};
use seckill_tests::{Engine, Setup, TestEnv, eventually, reserve_request, run, test_actor};
use std::time::Duration;

const ACTIVITY: ActivityId = ActivityId(77);
const SKU: SkuId = SkuId(3);

/// `seckillctl trace ID -o json` against this test's stores: exit code and
/// the story (`Null` when stdout is not JSON).
async fn trace(env: &TestEnv, id: &str) -> Result<(i32, serde_json::Value)> {
    let conf = std::env::temp_dir().join(format!("seckill-trace-{}.toml", env.token));
    let out = env
        .seckillctl(env!("CARGO_BIN_EXE_seckillctl"), &conf)?
        .args(["trace", id, "-o", "json"])
        .output()
        .await?;
    let json = serde_json::from_slice(&out.stdout).unwrap_or_default();
    Ok((out.status.code().unwrap_or(-1), json))
}

fn events(story: &serde_json::Value) -> Vec<String> {
    story["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            format!(
                "{} {}",
                l["source"].as_str().unwrap_or("?"),
                l["event"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

async fn reserve(engine: &Engine, user: i64) -> Result<serde_json::Value> {
    let (code, body) = engine.reserve(ACTIVITY, SKU, user).await?;
    ensure!(code == 202, "reservation of {user}: {code} {body}");
    Ok(body)
}

/// An order, then its cancel: each id finds the story, and the verdict
/// follows the order from CREATED to CANCELED with its stock back.
#[test]
fn an_ordinary_order_then_its_cancel() {
    run(Setup::Full, |env| async move {
        env.seed_activity(ACTIVITY, SKU, 10, 300_000).await?;
        let engine = Engine::start(&env, env.cfg.clone()).await?;
        let queued = reserve(&engine, 1).await?;
        let rsv = queued["reservation_id"].as_str().context("rsv")?.to_owned();
        let order = queued["order_id"].as_str().context("order")?.to_owned();
        let story = eventually(Duration::from_secs(60), "the order", || async {
            let (code, story) = trace(&env, &rsv).await?;
            Ok(
                (code == 0 && events(&story).contains(&"postgresql order created".to_owned()))
                    .then_some(story),
            )
        })
        .await?;
        ensure!(story["verdict"] == "CONSISTENT", "{story:#}");
        ensure!(story["trace_id"] == queued["trace_id"], "{story:#}");
        let seen = events(&story);
        for want in [
            "postgresql reserved",
            "postgresql decided",
            "postgresql ledger",
            "postgresql consumed",
            "redis reservation",
            "broker stored",
        ] {
            ensure!(seen.iter().any(|e| e == want), "no {want:?} in {seen:?}");
        }
        // Every kind of id tells the same story.
        for id in [&order, queued["message_id"].as_str().context("message")?] {
            let (code, other) = trace(&env, id).await?;
            ensure!(
                code == 0 && other["reservation_id"] == rsv.as_str(),
                "{id}: {code} {other:#}"
            );
        }

        let id: OrderId = order.parse()?;
        seckill_engine::order::cancel_by(&env.pool, &env.names, &id, "trace test", &test_actor())
            .await?;
        let story = eventually(Duration::from_secs(60), "the stock back", || async {
            let (code, story) = trace(&env, &rsv).await?;
            Ok(
                (code == 0 && events(&story).contains(&"postgresql stock released".to_owned()))
                    .then_some(story),
            )
        })
        .await?;
        ensure!(story["verdict"] == "CONSISTENT", "{story:#}");
        ensure!(
            story["reason"]
                .as_str()
                .is_some_and(|r| r.contains("canceled")),
            "{story:#}"
        );
        ensure!(
            events(&story).contains(&"postgresql order canceled".to_owned()),
            "{story:#}"
        );
        engine.stop().await?;
        Ok(())
    });
}

/// A message that arrives past its reservation's validity is rejected and
/// compensated: CONSISTENT once the stock is back. Until the engine is
/// started, Redis alone holds the reservation: IN FLIGHT, exit 1.
#[test]
fn a_rejected_reservation_and_one_still_in_flight() {
    run(Setup::Full, |env| async move {
        env.seed_activity(ACTIVITY, SKU, 10, 300_000).await?;
        let now = chrono::Utc::now().timestamp_millis();
        let req = reserve_request(ACTIVITY, SKU, 5, now, 300_000);
        let ReserveOutcome::Reserved(r) = env.store().reserve(&req, now + 600_000).await? else {
            anyhow::bail!("not reserved");
        };
        let rsv = r.reservation_id.to_string();
        let (code, story) = trace(&env, &rsv).await?;
        ensure!(
            code == 1 && story["verdict"] == "IN_FLIGHT",
            "{code} {story:#}"
        );

        // Its message, already past validity when it is consumed.
        let mut msg = order_message(&r);
        msg.reservation_valid_until = chrono::Utc::now() - chrono::Duration::seconds(1);
        let producer = RocketProducer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &format!("{}PG_TRACE", env.names.prefix()),
            Duration::from_secs(3),
            0,
        )
        .await?;
        let sent = producer
            .send(
                to_outgoing(&msg, &env.names.topic(TopicKind::OrderCreate)),
                Duration::from_secs(3),
            )
            .await;
        producer.shutdown().await;
        ensure!(sent.is_confirmed(), "{sent:?}");
        let engine = Engine::start(&env, env.cfg.clone()).await?;
        let story = eventually(Duration::from_secs(60), "the rejection settled", || async {
            let (code, story) = trace(&env, &rsv).await?;
            Ok((code == 0 && story["verdict"] == "CONSISTENT").then_some(story))
        })
        .await?;
        ensure!(
            story["reason"]
                .as_str()
                .is_some_and(|r| r.contains("REJECTED_EXPIRED")),
            "{story:#}"
        );
        ensure!(
            events(&story).contains(&"postgresql compensation".to_owned()),
            "{story:#}"
        );
        engine.stop().await?;
        Ok(())
    });
}

/// An id of no known kind, or of none the stores hold: a usage error.
#[test]
fn an_unknown_id_is_a_usage_error() {
    run(Setup::Full, |env| async move {
        let (code, _) = trace(&env, "nope").await?;
        ensure!(code == 64, "bad id: exit {code}");
        let (code, _) = trace(&env, &RequestId::generate().to_string()).await?;
        ensure!(code == 64, "unknown request id: exit {code}");
        Ok(())
    });
}
