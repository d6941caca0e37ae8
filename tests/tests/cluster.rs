//! The cluster profile (`./scripts/stack.sh up --cluster`): two brokers,
//! broker-a and broker-b, behind one NameServer, the seckill topics' queues
//! on both, and a Redis Cluster of three masters with a replica each.
//! `scripts/test.sh` starts them after the single-node tests, points the
//! suite at them (`eval "$(./scripts/stack.sh env --cluster)"`) and runs it
//! (`--features cluster`); without them every test here fails, naming the
//! command that starts them.
//!
//! - a flash sale whose messages travel through both brokers sells its
//!   stock exactly once and reconciles;
//! - a dead message in each broker's DLQ is mirrored exactly once: each
//!   broker has its own queue 0, and the mirror keeps an offset per broker
//!   (docs/architecture.md §9.1);
//! - broker-b killed (kill -9, by the pid stack.sh recorded) in the middle
//!   of a burst costs no order, once `stack.sh up --cluster` brings it back;
//! - every Redis script stays in its activity's slot, and batches mixing
//!   activities on three masters are split by slot;
//! - a Redis master killed mid-sale fails over to its replica and costs no
//!   reservation; a shard whose replica stops answering stops waiting for it;
//! - a selling activity's slot moved to another master mid-sale costs no
//!   reservation.
//!
//! One test at a time (`--test-threads 1`): the kill would fail the others.

use anyhow::{Result, ensure};
use seckill_engine::redis_conn::{ClusterNode, NodeRole};
use seckill_engine::{
    ActivityId, ConsumerSpec, OrderConsumer, Producer, ReleaseOutcome, RequestId, ReserveOutcome,
    RocketConsumer, RocketProducer, SkuId, TopicKind, mirror_once, publish::to_outgoing, reconcile,
};
use seckill_tests::{Engine, Setup, TestEnv, eventually, order_create, reserve_request, run};
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
async fn send_orders(
    env: &TestEnv,
    activity: ActivityId,
    sku: SkuId,
    users: std::ops::RangeInclusive<i64>,
) -> Result<()> {
    let topic = env.names.topic(TopicKind::OrderCreate);
    let producer = RocketProducer::start(
        env.rt.clone(),
        &env.cfg.namesrv_addr,
        &env.names.producer_group(),
        Duration::from_secs(3),
        1,
    )
    .await?;
    for user in users {
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
        an_order_each_then_reconciled(&env, activity, stock, Duration::from_secs(60)).await?;
        let on = per_broker(&env, &env.names.topic(TopicKind::OrderCreate)).await?;
        ensure!(
            on.len() >= 2 && on.values().all(|n| *n > 0),
            "the order messages went through {on:?}"
        );
        engine.stop().await
    });
}

#[test]
fn a_dead_message_in_each_brokers_dlq_is_mirrored_exactly_once() {
    run(Setup::Full, |env| async move {
        two_brokers(&env).await?;
        let (activity, sku) = (ActivityId(42), SkuId(1));
        env.seed_activity(activity, sku, 1_000, 300_000).await?;
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
        // More messages than the topic has queues on one broker, again
        // until both brokers hold some: a producer that found one broker
        // slow (seen once: all 80 went to broker-b) sends to the other, and
        // this test is about a dead message on each.
        let batch = i64::from(kind.queues()) + 16;
        let mut sent = 0;
        loop {
            send_orders(&env, activity, sku, sent + 1..=sent + batch).await?;
            sent += batch;
            let on = per_broker(&env, &topic).await?;
            if on.values().filter(|n| **n > 0).count() >= 2 {
                break;
            }
            ensure!(sent < 4 * batch, "{sent} sent, all through {on:?}");
        }

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

/// The pid `stack.sh` recorded for `name` (`broker-b`, `redis-7001`): the
/// only processes these tests may stop, and only by that pid.
fn stack_pid(name: &str) -> Result<i32> {
    let cache = std::env::var("SECKILL_CACHE_DIR").map_or_else(
        |_| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/seckillctl")
        },
        std::path::PathBuf::from,
    );
    let state = std::env::var("SECKILL_STATE_DIR")
        .map_or_else(|_| cache.join("stack"), std::path::PathBuf::from);
    let file = state.join("started").join(name);
    let text = std::fs::read_to_string(&file).map_err(|e| {
        anyhow::anyhow!(
            "{}: {e}; these tests stop only a {name} that `./scripts/stack.sh up --cluster` started",
            file.display()
        )
    })?;
    Ok(text.trim().parse()?)
}

fn kill_9(pid: i32) -> Result<()> {
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()?;
    ensure!(killed.success(), "kill -9 {pid}");
    Ok(())
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
        let pid = stack_pid("broker-b")?;
        let (activity, sku, stock, buyers) = (ActivityId(43), SkuId(1), 300, 600);
        env.seed_activity(activity, sku, stock, 300_000).await?;
        let engine = Engine::start(&env, env.cfg.clone()).await?;
        let sale = Sale::start(&engine, activity, sku, buyers);
        sale.until_accepted(stock / 3).await?;
        // kill -9 of broker-b, by the pid stack.sh recorded.
        kill_9(pid)?;
        let at_kill = sale.accepted();
        let (sold, _) = sale.finish().await?;
        ensure!(sold == stock, "{sold} accepted of {stock}");
        ensure!(
            at_kill < stock,
            "the burst was over ({at_kill} accepted) before the kill"
        );
        stack_up_cluster().await?;
        an_order_each_then_reconciled(&env, activity, stock, Duration::from_secs(180)).await?;
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
        send_orders(&env, ActivityId(44), SkuId(1), 1..=sent).await?;
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

/// The live masters of the cluster the test's Redis URL names, as the
/// engine reads them (`CLUSTER NODES`), each with its live replicas' ports.
async fn redis_masters(env: &TestEnv) -> Result<Vec<(ClusterNode, Vec<u16>)>> {
    let nodes = env.redis.clone().cluster_nodes().await?.ok_or_else(|| {
        anyhow::anyhow!(
            "these tests need the Redis Cluster: eval \"$(./scripts/stack.sh env --cluster)\" after `./scripts/stack.sh up --cluster`"
        )
    })?;
    let live = |n: &&ClusterNode| !n.failed;
    Ok(nodes
        .iter()
        .filter(live)
        .filter(|n| n.role == NodeRole::Master && !n.slots.is_empty())
        .map(|m| {
            let replicas = nodes
                .iter()
                .filter(live)
                .filter(|r| r.master_id.as_deref() == Some(m.id.as_str()))
                .filter_map(ClusterNode::port)
                .collect();
            (m.clone(), replicas)
        })
        .collect())
}

/// The live master serving `slot`, with its replicas.
async fn master_of(env: &TestEnv, slot: u16) -> Result<(ClusterNode, Vec<u16>)> {
    let masters = redis_masters(env).await?;
    let found = masters.iter().position(|(m, _)| m.owns(slot));
    found
        .map(|i| masters.into_iter().nth(i).expect("found"))
        .ok_or_else(|| anyhow::anyhow!("no live master serves slot {slot}"))
}

async fn slot_of(env: &TestEnv, key: &str) -> Result<u16> {
    Ok(redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(&mut env.redis.clone())
        .await?)
}

/// One activity per master: their keys' hash tags land on each of them.
async fn an_activity_per_master(env: &TestEnv, from: i64) -> Result<Vec<(ActivityId, u16)>> {
    let masters = redis_masters(env).await?;
    ensure!(masters.len() == 3, "3 masters expected: {masters:?}");
    let store = env.store();
    let mut picked: Vec<(ActivityId, u16)> = Vec::new();
    for a in from..from + 500 {
        let activity = ActivityId(a);
        let slot = slot_of(env, &store.keys(activity).epoch()).await?;
        let port = masters
            .iter()
            .find(|(m, _)| m.owns(slot))
            .and_then(|(m, _)| m.port())
            .ok_or_else(|| anyhow::anyhow!("no master owns slot {slot}: {masters:?}"))?;
        if picked.iter().all(|(_, p)| *p != port) {
            picked.push((activity, port));
        }
        if picked.len() == masters.len() {
            return Ok(picked);
        }
    }
    anyhow::bail!("500 activities did not cover the masters {masters:?}")
}

/// On Redis Cluster every script runs in the slot of its activity's hash
/// tag, the keys it builds (claim_due's hashes, found through the pending
/// set) included: Redis refuses a script that touches a key of another
/// slot. A publisher batch mixing activities on three masters is marked
/// sent in one call (a pipeline per slot), and the epochs of activities on
/// three masters are read in one (docs/architecture.md §4.6).
#[test]
fn every_script_stays_in_its_activitys_slot_on_redis_cluster() {
    run(Setup::Full, |env| async move {
        let picked = an_activity_per_master(&env, 61).await?;
        let store = env.store();
        let sku = SkuId(1);
        let now = chrono::Utc::now().timestamp_millis();
        let mut sent = Vec::new();
        let mut later = Vec::new();
        for (activity, _) in &picked {
            env.seed_activity(*activity, sku, 10, 300_000).await?;
            for user in 1..=3 {
                let req = reserve_request(*activity, sku, user, now, 300_000);
                let ReserveOutcome::Reserved(r) = store.reserve(&req, now + 1_000).await? else {
                    anyhow::bail!("user {user} of {activity} was not reserved");
                };
                if user < 3 {
                    sent.push((r.activity_id, r.reservation_id, r.message_id));
                } else {
                    later.push(r);
                }
            }
        }
        let marked = store.mark_sent_many(&sent, "BROKER-1").await?;
        ensure!(marked.iter().all(|m| *m), "{marked:?}");
        let activities: Vec<ActivityId> = picked.iter().map(|(a, _)| *a).collect();
        let epochs = store.epochs(&activities).await?;
        ensure!(epochs.iter().all(Option::is_some), "{epochs:?}");
        for r in later {
            let a = r.activity_id;
            // Due now: the scanner's claim reads the hash it builds a key for.
            let claimed = store
                .claim_due(a, now + 2_000, 10, "scanner-t", 30_000)
                .await?;
            ensure!(
                claimed.len() == 1 && claimed[0].reservation_id == r.reservation_id,
                "{a}: {claimed:?}"
            );
            ensure!(
                store
                    .reschedule(a, &r.reservation_id, &r.message_id, "scanner-t", now, "t")
                    .await?,
                "{a}: reschedule"
            );
            ensure!(
                store
                    .mark_send_failed(a, &r.reservation_id, &r.message_id, "t")
                    .await?,
                "{a}: mark_send_failed"
            );
            ensure!(
                store.release(a, &r.reservation_id).await? == ReleaseOutcome::Released,
                "{a}: release"
            );
            ensure!(store.stock(a, sku).await? == Some(8), "{a}: stock");
            ensure!(store.live_reservations(a).await? == 2, "{a}: live");
            ensure!(store.pending_count(a).await? == 0, "{a}: pending");
        }
        Ok(())
    });
}

/// A Redis master killed (kill -9, by the pid stack.sh recorded) in the
/// middle of a sale: its replica takes over within seconds, and no
/// reservation is lost. Each one answered was acknowledged by the replica
/// first (WAIT, docs/architecture.md §4.6); a buyer whose answer was lost
/// asks again with the same request id and gets the same reservation back
/// or a new one, never two. Afterwards `stack.sh up --cluster` brings the
/// old master back as a replica.
#[test]
fn a_redis_master_failing_over_mid_sale_costs_no_reservation() {
    run(Setup::Full, |env| async move {
        let (activity, sku, stock, buyers) = (ActivityId(45), SkuId(1), 300, 600);
        let slot = slot_of(&env, &env.store().keys(activity).epoch()).await?;
        let (master, _) = master_of(&env, slot).await?;
        let port = master.port().ok_or_else(|| anyhow::anyhow!("{master:?}"))?;
        let pid = stack_pid(&format!("redis-{port}"))?;
        env.seed_activity(activity, sku, stock, 300_000).await?;
        let mut cfg = env.cfg.clone();
        cfg.redis.wait_replicas = 1;
        let engine = Engine::start(&env, cfg).await?;
        let sale = Sale::start(&engine, activity, sku, buyers);
        sale.until_accepted(stock / 3).await?;
        let t0 = std::time::Instant::now();
        kill_9(pid)?;
        let at_kill = sale.accepted();
        let (sold, retried) = sale.finish().await?;
        let burst_done = t0.elapsed();
        ensure!(
            at_kill < stock,
            "the sale was over ({at_kill} accepted) before the kill"
        );
        ensure!(sold == stock, "{sold} accepted of {stock}");
        let (promoted, _) = master_of(&env, slot).await?;
        ensure!(
            promoted.port() != Some(port),
            "slot {slot} is still served by {port}: {promoted:?}"
        );
        an_order_each_then_reconciled(&env, activity, stock, Duration::from_secs(120)).await?;
        engine.stop().await?;
        eprintln!(
            "failover of redis {port} mid-sale: {sold} sold, {retried} requests asked again; the sale ended {burst_done:?} after the kill, reconciled after {:?}",
            t0.elapsed()
        );
        // The old master comes back as its successor's replica.
        stack_up_cluster().await
    });
}

/// With its shard's replica stopped (SIGSTOP, by the pid stack.sh
/// recorded, for well under the node timeout), a reservation waits its
/// `wait_timeout_ms`, is answered anyway and counted; the next ones do not
/// wait at all, so a dead replica does not stall the sale; once the replica
/// answers again, a probe finds it and reservations wait again
/// (docs/architecture.md §4.6).
#[test]
fn a_shard_short_of_its_replica_stops_waiting_and_counts_until_it_is_back() {
    run(Setup::Full, |env| async move {
        use seckill_engine::{AckState, ReplicaWait};
        let (activity, sku) = (ActivityId(46), SkuId(1));
        let slot = slot_of(&env, &env.store().keys(activity).epoch()).await?;
        let (master, replicas) = master_of(&env, slot).await?;
        let [replica] = replicas[..] else {
            anyhow::bail!("one replica of {} expected: {replicas:?}", master.addr);
        };
        let pid = stack_pid(&format!("redis-{replica}"))?.to_string();
        env.seed_activity(activity, sku, 1_000, 300_000).await?;
        let store = env.store().with_replica_wait(ReplicaWait {
            replicas: 1,
            timeout_ms: 100,
        });
        let now = chrono::Utc::now().timestamp_millis();
        let reserve = |user: i64| {
            let store = store.clone();
            async move {
                let req = reserve_request(activity, sku, user, now, 300_000);
                match store.reserve(&req, now + 60_000).await? {
                    ReserveOutcome::Reserved(_) => Ok(()),
                    other => Err(anyhow::anyhow!("user {user}: {other:?}")),
                }
            }
        };
        reserve(1).await?;
        ensure!(store.unreplicated() == 0 && store.replica_state(activity) == AckState::Healthy);

        let stopped = std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()?;
        ensure!(stopped.success(), "kill -STOP {pid}");
        let short = async {
            reserve(2).await?;
            let after_short = store.replica_state(activity);
            reserve(3).await?;
            Ok::<_, anyhow::Error>(after_short)
        }
        .await;
        let resumed = std::process::Command::new("kill")
            .args(["-CONT", &pid])
            .status()?;
        ensure!(resumed.success(), "kill -CONT {pid}");
        let after_short = short?;
        ensure!(
            matches!(after_short, AckState::Degraded { .. }),
            "after a short wait: {after_short:?}"
        );
        ensure!(
            store.unreplicated() == 2,
            "{} counted",
            store.unreplicated()
        );

        // The replica is back: within a probe or two the shard is healthy,
        // and the reservations made meanwhile are all there.
        let mut user = 3;
        eventually(Duration::from_secs(10), "the shard waits again", || {
            user += 1;
            let reserve = reserve(user);
            async {
                reserve.await?;
                Ok((store.replica_state(activity) == AckState::Healthy).then_some(()))
            }
        })
        .await?;
        ensure!(
            store.live_reservations(activity).await? == user as u64,
            "{} live for {user} reserved",
            store.live_reservations(activity).await?
        );
        Ok(())
    });
}

/// Buyers of a sale through the engine's HTTP API, four at a time, 10 ms
/// apart each: a burst of a few seconds, so a fault injected after the
/// first third lands in its middle. A buyer asks until answered, with one
/// request id: a 5xx or a broken connection says nothing of whether the
/// reservation was made.
struct Sale {
    accepted: Arc<std::sync::atomic::AtomicI64>,
    retried: Arc<std::sync::atomic::AtomicI64>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl Sale {
    fn start(engine: &Engine, activity: ActivityId, sku: SkuId, buyers: i64) -> Sale {
        use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
        let url = format!(
            "http://{}/v1/activities/{}/skus/{}/reservations",
            engine.addr, activity.0, sku.0
        );
        let accepted = Arc::new(AtomicI64::new(0));
        let retried = Arc::new(AtomicI64::new(0));
        let next = Arc::new(AtomicI64::new(1));
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let (http, url, next) = (engine.http.clone(), url.clone(), next.clone());
            let (accepted, retried) = (accepted.clone(), retried.clone());
            workers.spawn(async move {
                loop {
                    let user = next.fetch_add(1, Relaxed);
                    if user > buyers {
                        return Ok::<(), anyhow::Error>(());
                    }
                    let body = serde_json::json!({"user_id": user, "request_id": RequestId::generate().as_str()});
                    let deadline = std::time::Instant::now() + Duration::from_secs(60);
                    loop {
                        match http.post(&url).json(&body).send().await {
                            Ok(r) if r.status() == 202 => {
                                accepted.fetch_add(1, Relaxed);
                                break;
                            }
                            Ok(r) if r.status().is_client_error() => break,
                            _ => {
                                retried.fetch_add(1, Relaxed);
                                ensure!(
                                    std::time::Instant::now() < deadline,
                                    "user {user} got no answer in 60 s"
                                );
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            });
        }
        let task = tokio::spawn(async move {
            while let Some(done) = workers.join_next().await {
                done??;
            }
            Ok(())
        });
        Sale {
            accepted,
            retried,
            task,
        }
    }

    fn accepted(&self) -> i64 {
        self.accepted.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn until_accepted(&self, n: i64) -> Result<()> {
        eventually(Duration::from_secs(30), "reservations accepted", || async {
            Ok((self.accepted() >= n).then_some(()))
        })
        .await
    }

    /// Waits for every buyer: (accepted, requests asked again).
    async fn finish(self) -> Result<(i64, i64)> {
        let Sale {
            accepted,
            retried,
            task,
        } = self;
        task.await??;
        Ok((
            accepted.load(std::sync::atomic::Ordering::Relaxed),
            retried.load(std::sync::atomic::Ordering::Relaxed),
        ))
    }
}

async fn node(port: u16) -> Result<redis::aio::MultiplexedConnection> {
    Ok(redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
        .get_multiplexed_async_connection()
        .await?)
}

/// Moves `slot` from `src` to `dst` as `redis-cli --cluster reshard` does:
/// importing and migrating, the keys 20 at a time, then the new owner
/// told to every master. Returns how many keys moved.
async fn move_slot(
    masters: &[(ClusterNode, Vec<u16>)],
    slot: u16,
    src: &ClusterNode,
    dst: &ClusterNode,
) -> Result<usize> {
    let port = |n: &ClusterNode| n.port().ok_or_else(|| anyhow::anyhow!("{n:?}"));
    let (mut s, mut d) = (node(port(src)?).await?, node(port(dst)?).await?);
    let setslot = |how: &str, id: &str| {
        let mut c = redis::cmd("CLUSTER");
        c.arg("SETSLOT").arg(slot).arg(how).arg(id);
        c
    };
    let () = setslot("IMPORTING", &src.id).query_async(&mut d).await?;
    let () = setslot("MIGRATING", &dst.id).query_async(&mut s).await?;
    let mut moved = 0;
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(20)
            .query_async(&mut s)
            .await?;
        if keys.is_empty() {
            break;
        }
        let () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(port(dst)?)
            .arg("")
            .arg(0)
            .arg(5_000)
            .arg("KEYS")
            .arg(&keys)
            .query_async(&mut s)
            .await?;
        moved += keys.len();
    }
    let () = setslot("NODE", &dst.id).query_async(&mut d).await?;
    let () = setslot("NODE", &dst.id).query_async(&mut s).await?;
    for (m, _) in masters
        .iter()
        .filter(|(m, _)| m.id != src.id && m.id != dst.id)
    {
        let () = setslot("NODE", &dst.id)
            .query_async(&mut node(port(m)?).await?)
            .await?;
    }
    Ok(moved)
}

/// The slot of a selling activity moved to another master in the middle
/// of the sale (a resharding): while its keys are half moved, Redis answers
/// ASK or TRYAGAIN, then MOVED; the client follows them, also inside the
/// reserve pipeline (docs/architecture.md §4.6), and no reservation is lost
/// or made twice.
#[test]
fn a_slot_moved_mid_sale_costs_no_reservation() {
    run(Setup::Full, |env| async move {
        let (activity, sku, stock, buyers) = (ActivityId(47), SkuId(1), 300, 600);
        let slot = slot_of(&env, &env.store().keys(activity).epoch()).await?;
        let masters = redis_masters(&env).await?;
        let (src, _) = master_of(&env, slot).await?;
        let dst = masters
            .iter()
            .map(|(m, _)| m)
            .find(|m| m.id != src.id)
            .ok_or_else(|| anyhow::anyhow!("a second master: {masters:?}"))?
            .clone();
        env.seed_activity(activity, sku, stock, 300_000).await?;
        let mut cfg = env.cfg.clone();
        cfg.redis.wait_replicas = 1;
        let engine = Engine::start(&env, cfg).await?;
        let sale = Sale::start(&engine, activity, sku, buyers);
        sale.until_accepted(stock / 3).await?;
        let moved = move_slot(&masters, slot, &src, &dst).await?;
        let at_move = sale.accepted();
        let (sold, retried) = sale.finish().await?;
        ensure!(moved > 0, "no key of slot {slot} moved");
        ensure!(
            at_move < stock,
            "the sale was over ({at_move} accepted) before the slot moved"
        );
        ensure!(sold == stock, "{sold} accepted of {stock}");
        let (owner, _) = master_of(&env, slot).await?;
        ensure!(owner.id == dst.id, "slot {slot} is on {}", owner.addr);
        an_order_each_then_reconciled(&env, activity, stock, Duration::from_secs(120)).await?;
        eprintln!(
            "slot {slot} moved from {} to {} mid-sale ({moved} keys): {sold} sold, {retried} requests asked again",
            src.addr, dst.addr
        );
        engine.stop().await
    });
}

/// Waits until there is an order per unit of `stock` sold, then checks the
/// sale's invariants (docs/architecture.md §12).
async fn an_order_each_then_reconciled(
    env: &TestEnv,
    activity: ActivityId,
    stock: i64,
    limit: Duration,
) -> Result<()> {
    eventually(limit, "an order per accepted reservation", || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
            .fetch_one(&env.pool)
            .await?;
        Ok((n == stock).then_some(()))
    })
    .await?;
    let report = reconcile::run(&env.pool, &env.store(), activity).await?;
    ensure!(report.passed(), "{report:#?}");
    Ok(())
}
