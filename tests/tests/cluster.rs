//! The cluster profile (`./scripts/stack.sh up --cluster`): two brokers,
//! broker-a and broker-b, behind one NameServer, the seckill topics' queues
//! on both. `scripts/test.sh` starts broker-b after the single-node tests and
//! runs this suite (`--features cluster`); without two brokers every test
//! here fails, naming the command that starts the second.
//!
//! - a flash sale whose messages travel through both brokers sells its
//!   stock exactly once and reconciles;
//! - a dead message in each broker's DLQ is mirrored exactly once: each
//!   broker has its own queue 0, and the mirror keeps an offset per broker
//!   (docs/architecture.md §9.1);
//! - broker-b killed (kill -9, by the pid stack.sh recorded) in the middle
//!   of a burst costs no order, once `stack.sh up --cluster` brings it back.
//!
//! One test at a time (`--test-threads 1`): the kill would fail the others.

use anyhow::{Result, ensure};
use seckill_engine::{
    ActivityId, ConsumerSpec, OrderConsumer, Producer, RequestId, RocketConsumer, RocketProducer,
    SkuId, TopicKind, mirror_once, publish::to_outgoing, reconcile,
};
use seckill_tests::{Engine, Setup, TestEnv, eventually, order_create, run};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The brokers the topic's queues live on, with the messages each holds.
async fn per_broker(env: &TestEnv, topic: &str) -> Result<BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for (broker, q) in env.admin.queue_offsets(topic).await? {
        *out.entry(broker).or_default() += q.max - q.min;
    }
    Ok(out)
}

async fn two_brokers(env: &TestEnv) -> Result<()> {
    let brokers = env.admin.brokers().await?;
    ensure!(
        brokers.len() >= 2,
        "the cluster suite needs two brokers, found {brokers:?}: run `./scripts/stack.sh up --cluster`"
    );
    let topic = env.names.topic(TopicKind::OrderCreate);
    let on = per_broker(env, &topic).await?;
    ensure!(on.len() >= 2, "{topic} has queues on {:?} only", on.keys());
    Ok(())
}

/// One order-create message per user, each sent alone: the producer's
/// round robin then spreads them over every queue of both brokers.
async fn send_orders(env: &TestEnv, activity: ActivityId, sku: SkuId, users: i64) -> Result<()> {
    let topic = env.names.topic(TopicKind::OrderCreate);
    let producer = RocketProducer::start(
        env.rt.clone(),
        &env.cfg.namesrv_addr,
        &env.names.producer_group(),
        Duration::from_secs(3),
        1,
    )
    .await?;
    for user in 1..=users {
        let m = order_create(activity, sku, user);
        let r = producer
            .send(to_outgoing(&m, &topic), Duration::from_secs(3))
            .await;
        ensure!(r.is_confirmed(), "{r:?}");
    }
    producer.shutdown().await;
    Ok(())
}

#[test]
fn a_flash_sale_through_two_brokers_sells_its_stock_once() {
    run(Setup::Full, |env| async move {
        two_brokers(&env).await?;
        let (activity, sku, stock, buyers) = (ActivityId(41), SkuId(1), 150, 300);
        env.seed_activity(activity, sku, stock, 300_000).await?;
        // One message per send: a batch goes to one queue, and a few large
        // batches could all land on one broker.
        let mut cfg = env.cfg.clone();
        cfg.publisher.batch_max = 1;
        let engine = Engine::start(&env, cfg).await?;
        let url = format!(
            "http://{}/v1/activities/{}/skus/{}/reservations",
            engine.addr, activity.0, sku.0
        );
        let mut accepted = 0;
        for user in 1..=buyers {
            let r = engine
                .http
                .post(&url)
                .json(&serde_json::json!({"user_id": user, "request_id": RequestId::generate().as_str()}))
                .send()
                .await?;
            accepted += usize::from(r.status() == 202);
        }
        ensure!(accepted == stock as usize, "{accepted} accepted");
        eventually(
            Duration::from_secs(60),
            "an order per accepted reservation",
            || async {
                let n: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
                    .fetch_one(&env.pool)
                    .await?;
                Ok((n == stock).then_some(()))
            },
        )
        .await?;
        let on = per_broker(&env, &env.names.topic(TopicKind::OrderCreate)).await?;
        ensure!(
            on.len() >= 2 && on.values().all(|n| *n > 0),
            "the order messages went through {on:?}"
        );
        let report = reconcile::run(&env.pool, &env.store(), activity).await?;
        ensure!(report.passed(), "{report:#?}");
        engine.stop().await
    });
}

#[test]
fn a_dead_message_in_each_brokers_dlq_is_mirrored_exactly_once() {
    run(Setup::Full, |env| async move {
        two_brokers(&env).await?;
        let (activity, sku) = (ActivityId(42), SkuId(1));
        env.seed_activity(activity, sku, 100, 300_000).await?;
        // Every order of this test's database is refused: each message dies.
        sqlx::raw_sql(
            "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'poison: order of user % refused', NEW.user_id; END $$;
             CREATE TRIGGER poison BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION poison();",
        )
        .execute(&env.pool)
        .await?;
        let kind = TopicKind::OrderCreate;
        let (topic, group) = (env.names.topic(kind), env.names.group(kind));
        env.admin.ensure_group(&group, 1).await?;
        let mut spec = ConsumerSpec::new(group.clone(), topic.clone());
        spec.max_reconsume_times = 1;
        let consumer = RocketConsumer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &spec,
            Arc::new(OrderConsumer::new(env.pool.clone(), env.names.clone())),
        )
        .await?;
        // More messages than the topic has queues on one broker.
        let sent = i64::from(kind.queues()) + 16;
        send_orders(&env, activity, sku, sent).await?;
        let on = per_broker(&env, &topic).await?;
        ensure!(
            on.values().filter(|n| **n > 0).count() >= 2,
            "sent through {on:?}"
        );

        // Every pass's count added up: a message mirrored twice shows.
        let mut mirrored = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        while mirrored < sent as usize {
            ensure!(
                std::time::Instant::now() < deadline,
                "only {mirrored} of {sent} dead messages mirrored in 180 s"
            );
            mirrored += mirror_once(&env.admin, &env.pool, &env.names)
                .await?
                .mirrored;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        consumer.shutdown().await;
        let again = mirror_once(&env.admin, &env.pool, &env.names).await?;
        ensure!(
            mirrored == sent as usize && again.mirrored == 0,
            "mirrored {mirrored} for {sent} dead, then {} more",
            again.mirrored
        );
        let by_broker: Vec<(String, i64)> = sqlx::query_as(
            "SELECT dlq_broker, count(*) FROM dlq_messages WHERE consumer_group = $1 GROUP BY 1 ORDER BY 1",
        )
        .bind(&group)
        .fetch_all(&env.pool)
        .await?;
        ensure!(
            by_broker.len() >= 2 && by_broker.iter().map(|(_, n)| n).sum::<i64>() == sent,
            "dead copies per broker: {by_broker:?}"
        );
        let offsets: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT broker_name FROM dlq_mirror_offsets WHERE consumer_group = $1 ORDER BY 1",
        )
        .bind(&group)
        .fetch_all(&env.pool)
        .await?;
        ensure!(
            offsets == by_broker.iter().map(|(b, _)| b.clone()).collect::<Vec<_>>(),
            "offsets kept for {offsets:?}"
        );
        Ok(())
    });
}

/// The pid `stack.sh` recorded for broker-b: the only process this test may
/// stop, and only by that pid.
fn broker_b_pid() -> Result<i32> {
    let cache = std::env::var("SECKILL_CACHE_DIR").map_or_else(
        |_| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/seckillctl")
        },
        std::path::PathBuf::from,
    );
    let state = std::env::var("SECKILL_STATE_DIR")
        .map_or_else(|_| cache.join("stack"), std::path::PathBuf::from);
    let file = state.join("started/broker-b");
    let text = std::fs::read_to_string(&file).map_err(|e| {
        anyhow::anyhow!(
            "{}: {e}; this test stops only a broker-b that `./scripts/stack.sh up --cluster` started",
            file.display()
        )
    })?;
    Ok(text.trim().parse()?)
}

/// `./scripts/stack.sh up --cluster`: starts broker-b again (and checks
/// everything else is up), as on-call would.
async fn stack_up_cluster() -> Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut cmd = tokio::process::Command::new(root.join("scripts/stack.sh"));
    cmd.args(["up", "--cluster"]);
    if let Ok(dir) = std::env::var("CARGO_TARGET_DIR") {
        let bin = std::path::Path::new(&dir).join("debug/seckillctl");
        if bin.exists() {
            cmd.env("SECKILLCTL", bin);
        }
    }
    let out = cmd.output().await?;
    ensure!(
        out.status.success(),
        "stack.sh up --cluster: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Killing one broker of the two mid-burst costs no order: sends fail over
/// to the other broker's queues or wait in Redis for the scanner, and what
/// the dead broker had stored is consumed once it returns.
#[test]
fn one_broker_killed_mid_burst_costs_no_order() {
    run(Setup::Full, |env| async move {
        two_brokers(&env).await?;
        let pid = broker_b_pid()?;
        let (activity, sku, stock, buyers) = (ActivityId(43), SkuId(1), 300, 600);
        env.seed_activity(activity, sku, stock, 300_000).await?;
        let engine = Engine::start(&env, env.cfg.clone()).await?;
        let url = format!(
            "http://{}/v1/activities/{}/skus/{}/reservations",
            engine.addr, activity.0, sku.0
        );
        let accepted = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let burst = {
            let (http, url, accepted) = (engine.http.clone(), url.clone(), accepted.clone());
            tokio::spawn(async move {
                let next = Arc::new(std::sync::atomic::AtomicI64::new(1));
                let mut workers = tokio::task::JoinSet::new();
                // Two buyers at a time, 10 ms apart: a burst of about 3 s,
                // so the kill lands in its middle.
                for _ in 0..2 {
                    let (http, url, accepted, next) =
                        (http.clone(), url.clone(), accepted.clone(), next.clone());
                    workers.spawn(async move {
                        loop {
                            let user = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if user > buyers {
                                return;
                            }
                            let body = serde_json::json!({"user_id": user, "request_id": RequestId::generate().as_str()});
                            if let Ok(r) = http.post(&url).json(&body).send().await
                                && r.status() == 202
                            {
                                accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    });
                }
                while workers.join_next().await.is_some() {}
            })
        };
        eventually(
            Duration::from_secs(30),
            "a third of the stock reserved",
            || async {
                Ok(
                    (accepted.load(std::sync::atomic::Ordering::Relaxed) >= stock / 3)
                        .then_some(()),
                )
            },
        )
        .await?;
        // kill -9 of broker-b, by the pid stack.sh recorded.
        let killed = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()?;
        ensure!(killed.success(), "kill -9 {pid}");
        let at_kill = accepted.load(std::sync::atomic::Ordering::Relaxed);
        burst.await?;
        let sold = accepted.load(std::sync::atomic::Ordering::Relaxed);
        ensure!(sold == stock, "{sold} accepted of {stock}");
        ensure!(
            at_kill < stock,
            "the burst was over ({at_kill} accepted) before the kill"
        );
        stack_up_cluster().await?;
        eventually(
            Duration::from_secs(180),
            "an order per accepted reservation",
            || async {
                let n: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
                    .fetch_one(&env.pool)
                    .await?;
                Ok((n == stock).then_some(()))
            },
        )
        .await?;
        let report = reconcile::run(&env.pool, &env.store(), activity).await?;
        ensure!(report.passed(), "{report:#?}");
        engine.stop().await
    });
}

/// A consumer that takes its messages and answers nothing until released:
/// what it holds stays unconsumed, so the lag can be read.
struct Held(tokio::sync::watch::Receiver<bool>);

impl seckill_engine::Handler for Held {
    async fn handle(
        &self,
        _: Vec<seckill_engine::IncomingMessage>,
    ) -> seckill_engine::ConsumeVerdict {
        let mut released = self.0.clone();
        let _ = released.wait_for(|r| *r).await;
        seckill_engine::ConsumeVerdict::Ack
    }
}

/// The backlog broker by broker (`backlog --by-broker`): each broker's
/// part is its own, and the parts add up to the group's lag.
#[test]
fn the_lag_is_split_by_broker_and_the_parts_add_up() {
    run(Setup::Full, |env| async move {
        two_brokers(&env).await?;
        let kind = TopicKind::OrderCreate;
        let (topic, group) = (env.names.topic(kind), env.names.group(kind));
        let (release, held) = tokio::sync::watch::channel(false);
        let consumer = RocketConsumer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &ConsumerSpec::new(group.clone(), topic.clone()),
            Arc::new(Held(held)),
        )
        .await?;
        let sent = i64::from(kind.queues()) + 16;
        send_orders(&env, ActivityId(44), SkuId(1), sent).await?;
        let lag = eventually(
            Duration::from_secs(30),
            "the whole send counted as lag",
            || async {
                let d = env.admin.lag_detail(&topic, &group, 1, 8).await?;
                Ok((d.messages == sent).then_some(d))
            },
        )
        .await?;
        ensure!(
            lag.per_broker.len() >= 2 && lag.per_broker.iter().all(|b| b.messages > 0),
            "{:?}",
            lag.per_broker
        );
        ensure!(
            lag.per_broker.iter().map(|b| b.messages).sum::<i64>() == lag.messages,
            "{:?} against {}",
            lag.per_broker,
            lag.messages
        );
        ensure!(
            lag.per_broker
                .iter()
                .any(|b| (b.seconds - lag.seconds).abs() < 1e-9),
            "the group's wait is its longest broker's: {:?} against {}",
            lag.per_broker,
            lag.seconds
        );
        release.send(true)?;
        consumer.shutdown().await;
        Ok(())
    });
}
