//! What the real broker does with the adapter (issue: foundation, item 5).
//! Each test uses its own topic and group prefix on the shared broker.

use anyhow::{Result, ensure};
use seckill_engine::{
    ConsumeVerdict, ConsumerSpec, Handler, IncomingMessage, MessageId, OutgoingMessage,
    PROP_MESSAGE_ID, Producer, ReservationId, RocketConsumer, RocketProducer, SendOutcome,
    StartFrom, TopicKind, TopicSpec, TopicType, dlq_topic,
};
use seckill_tests::{Setup, TestEnv, eventually, run};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Hands every message it sees to the test, then answers with a fixed verdict.
struct Collector {
    tx: mpsc::UnboundedSender<(u64, IncomingMessage)>,
    verdict: ConsumeVerdict,
}

impl Handler for Collector {
    async fn handle(&self, batch: Vec<IncomingMessage>) -> ConsumeVerdict {
        let at = now_ms();
        for m in batch {
            let _ = self.tx.send((at, m));
        }
        self.verdict
    }
}

async fn producer(env: &TestEnv) -> Result<RocketProducer> {
    Ok(RocketProducer::start(
        env.rt.clone(),
        &env.cfg.namesrv_addr,
        &env.names.producer_group(),
        Duration::from_secs(3),
        2,
    )
    .await?)
}

fn order_message(topic: &str) -> (OutgoingMessage, MessageId, ReservationId) {
    let message_id = MessageId::generate();
    let reservation_id = ReservationId::generate();
    let msg = OutgoingMessage {
        topic: topic.to_owned(),
        tag: "CREATE_ORDER".into(),
        keys: vec![reservation_id.to_string()],
        properties: vec![(PROP_MESSAGE_ID.into(), message_id.to_string())],
        body: format!("{{\"message_id\":\"{message_id}\"}}").into_bytes(),
        deliver_time_ms: None,
    };
    (msg, message_id, reservation_id)
}

async fn collect(
    rx: &mut mpsc::UnboundedReceiver<(u64, IncomingMessage)>,
    n: usize,
    limit: Duration,
) -> Result<Vec<(u64, IncomingMessage)>> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    while got.len() < n {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(m)) => got.push(m),
            Ok(None) => anyhow::bail!("collector closed"),
            Err(_) => anyhow::bail!("received {} of {n} messages within {limit:?}", got.len()),
        }
    }
    Ok(got)
}

#[test]
fn message_id_property_and_key_survive_single_and_batch_sends() {
    run(Setup::Full, |env| async move {
        let topic = env.names.topic(TopicKind::OrderCreate);
        let p = producer(&env).await?;
        let mut sent: HashMap<String, String> = HashMap::new();

        let (msg, mid, rid) = order_message(&topic);
        let out = p.send(msg, Duration::from_secs(3)).await;
        ensure!(out.is_confirmed(), "single send: {out:?}");
        sent.insert(mid.to_string(), rid.to_string());

        let mut batch = Vec::new();
        for _ in 0..32 {
            let (msg, mid, rid) = order_message(&topic);
            sent.insert(mid.to_string(), rid.to_string());
            batch.push(msg);
        }
        let out = p.send_batch(batch, Duration::from_secs(3)).await;
        ensure!(out.is_confirmed(), "batch send: {out:?}");

        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut spec = ConsumerSpec::new(env.names.group(TopicKind::OrderCreate), topic.clone());
        spec.batch_max = 8;
        let consumer = RocketConsumer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &spec,
            Arc::new(Collector {
                tx,
                verdict: ConsumeVerdict::Ack,
            }),
        )
        .await?;
        let got = collect(&mut rx, sent.len(), Duration::from_secs(60)).await?;
        consumer.shutdown().await;
        p.shutdown().await;

        for (_, m) in got {
            let mid = m.message_id().expect("message_id property").to_owned();
            let want = sent
                .get(&mid)
                .unwrap_or_else(|| panic!("unexpected message_id {mid}"));
            assert_eq!(m.keys.first(), Some(want), "key of {mid}");
            assert_eq!(m.tag.as_deref(), Some("CREATE_ORDER"));
            assert_eq!(m.reconsume_times, 0);
        }
        Ok(())
    });
}

#[test]
fn reconsume_later_until_the_limit_moves_the_message_to_the_dlq() {
    run(Setup::Full, |env| async move {
        let kind = TopicKind::InventoryCompensate;
        let (topic, group) = (env.names.topic(kind), env.names.group(kind));
        env.admin.ensure_group(&group, 1).await?;
        let p = producer(&env).await?;
        let (msg, mid, rid) = order_message(&topic);
        ensure!(p.send(msg, Duration::from_secs(3)).await.is_confirmed());

        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut spec = ConsumerSpec::new(group.clone(), topic.clone());
        spec.max_reconsume_times = 1;
        let consumer = RocketConsumer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &spec,
            Arc::new(Collector {
                tx,
                verdict: ConsumeVerdict::Retry,
            }),
        )
        .await?;
        // First delivery, then one retry (reconsume_times 1), then the DLQ.
        let deliveries = collect(&mut rx, 2, Duration::from_secs(90)).await?;
        assert_eq!(deliveries[0].1.reconsume_times, 0);
        assert_eq!(deliveries[1].1.reconsume_times, 1);
        assert_eq!(deliveries[1].1.message_id(), Some(mid.as_str()));

        let dlq = dlq_topic(&group);
        let dead = eventually(
            Duration::from_secs(90),
            "the message in the DLQ",
            || async {
                for (broker, q) in env.admin.queue_offsets(&dlq).await.unwrap_or_default() {
                    if q.max > q.min {
                        let pulled = env.admin.pull(&broker, &dlq, q.queue_id, q.min, 32).await?;
                        if let Some(m) = pulled.messages.into_iter().next() {
                            return Ok(Some(m));
                        }
                    }
                }
                Ok(None)
            },
        )
        .await?;
        consumer.shutdown().await;
        p.shutdown().await;
        assert_eq!(
            dead.message_id(),
            Some(mid.as_str()),
            "business id kept in the DLQ"
        );
        assert_eq!(
            dead.keys.first().map(String::as_str),
            Some(rid.as_str()),
            "key kept in the DLQ"
        );
        assert_eq!(
            dead.property("RETRY_TOPIC"),
            Some(topic.as_str()),
            "original topic recorded"
        );
        assert!(!dead.body.is_empty());
        // No more deliveries once it is dead.
        assert!(rx.try_recv().is_err());
        Ok(())
    });
}

#[test]
fn a_delayed_message_is_not_delivered_before_its_time() {
    run(Setup::Full, |env| async move {
        let kind = TopicKind::OrderTimeout;
        let (topic, group) = (env.names.topic(kind), env.names.group(kind));
        let p = producer(&env).await?;

        let (tx, mut rx) = mpsc::unbounded_channel();
        let consumer = RocketConsumer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &ConsumerSpec::new(group, topic.clone()),
            Arc::new(Collector {
                tx,
                verdict: ConsumeVerdict::Ack,
            }),
        )
        .await?;

        let deliver_at = now_ms() + 5_000;
        let (mut msg, mid, _) = order_message(&topic);
        msg.tag = "CANCEL_IF_UNPAID".into();
        msg.deliver_time_ms = Some(deliver_at);
        let out = p.send(msg, Duration::from_secs(3)).await;
        ensure!(out.is_confirmed(), "{out:?}");

        let got = collect(&mut rx, 1, Duration::from_secs(30)).await?;
        consumer.shutdown().await;
        p.shutdown().await;
        let (arrived, m) = &got[0];
        assert_eq!(m.message_id(), Some(mid.as_str()));
        assert!(
            *arrived >= deliver_at,
            "delivered {} ms before its time",
            deliver_at - arrived
        );
        assert!(
            *arrived < deliver_at + 10_000,
            "delivered {} ms late",
            arrived - deliver_at
        );
        Ok(())
    });
}

#[test]
fn admin_reads_lag_in_messages_and_seconds_for_a_stopped_consumer() {
    run(Setup::Full, |env| async move {
        let kind = TopicKind::OrderEvent;
        let (topic, group) = (env.names.topic(kind), env.names.group(kind));
        let p = producer(&env).await?;

        // Consume one message so the group has committed offsets, then stop.
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut spec = ConsumerSpec::new(group.clone(), topic.clone());
        spec.start_from = StartFrom::First;
        let consumer = RocketConsumer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &spec,
            Arc::new(Collector {
                tx,
                verdict: ConsumeVerdict::Ack,
            }),
        )
        .await?;
        let (warm, _, _) = order_message(&topic);
        ensure!(p.send(warm, Duration::from_secs(3)).await.is_confirmed());
        collect(&mut rx, 1, Duration::from_secs(60)).await?;
        // The collector sees the message before its verdict is returned, so
        // wait for the broker to hold the committed offset before stopping.
        let lag = eventually(
            Duration::from_secs(30),
            "zero lag after the warm-up",
            || async {
                let lag = env.admin.lag(&topic, &group).await?;
                Ok((lag.messages == 0).then_some(lag))
            },
        )
        .await?;
        assert_eq!(lag.seconds, 0.0);
        consumer.shutdown().await;

        // A backlog of known size and age.
        let sent_at = now_ms();
        let mut batch = Vec::new();
        for _ in 0..200 {
            batch.push(order_message(&topic).0);
        }
        for chunk in batch.chunks(32) {
            ensure!(
                p.send_batch(chunk.to_vec(), Duration::from_secs(3))
                    .await
                    .is_confirmed()
            );
        }
        tokio::time::sleep(Duration::from_secs(3)).await; // age the backlog by a known amount
        let lag = env.admin.lag(&topic, &group).await?;
        let age = (now_ms() - sent_at) as f64 / 1000.0;
        p.shutdown().await;
        assert_eq!(lag.messages, 200, "{lag:?}");
        assert!(
            (lag.seconds - age).abs() <= 1.0,
            "lag {lag:?} vs backlog age {age:.2} s"
        );
        Ok(())
    });
}

/// Async SQL from the synchronous listener: every message inserts a row.
struct SqlWriter {
    pool: sqlx::PgPool,
    done: Arc<AtomicUsize>,
}

impl Handler for SqlWriter {
    async fn handle(&self, batch: Vec<IncomingMessage>) -> ConsumeVerdict {
        for m in batch {
            let r = sqlx::query("INSERT INTO seen (message_id) VALUES ($1) ON CONFLICT DO NOTHING")
                .bind(m.message_id().unwrap_or_default())
                .execute(&self.pool)
                .await;
            if r.is_err() {
                return ConsumeVerdict::Retry;
            }
            self.done.fetch_add(1, Ordering::Relaxed);
        }
        ConsumeVerdict::Ack
    }
}

#[test]
fn the_synchronous_listener_runs_async_sql_under_load_without_deadlock() {
    run(Setup::Full, |env| async move {
        sqlx::query("CREATE TABLE seen (message_id TEXT PRIMARY KEY)")
            .execute(&env.pool)
            .await?;
        let topic = format!("{}LOAD", env.names.prefix());
        env.admin
            .ensure_topic(&TopicSpec {
                name: topic.clone(),
                queues: 16,
                topic_type: TopicType::Normal,
            })
            .await?;
        let group = format!("{}CG_LOAD", env.names.prefix());
        env.admin.ensure_group(&group, 3).await?;
        eventually(Duration::from_secs(30), "route", || async {
            Ok(env.admin.has_route(&topic).await?.then_some(()))
        })
        .await?;

        let p = producer(&env).await?;
        let n = 2_000;
        let msgs: Vec<OutgoingMessage> = (0..n).map(|_| order_message(&topic).0).collect();
        for chunk in msgs.chunks(32) {
            let out = p.send_batch(chunk.to_vec(), Duration::from_secs(3)).await;
            ensure!(matches!(out, SendOutcome::Confirmed(_)), "{out:?}");
        }

        let done = Arc::new(AtomicUsize::new(0));
        let mut spec = ConsumerSpec::new(group, topic);
        // More listener threads than the pool has connections: they must queue, not deadlock.
        spec.threads = 16;
        let consumer = RocketConsumer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &spec,
            Arc::new(SqlWriter {
                pool: env.pool.clone(),
                done: done.clone(),
            }),
        )
        .await?;
        eventually(Duration::from_secs(90), "every message written", || async {
            let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM seen")
                .fetch_one(&env.pool)
                .await?;
            Ok((rows == n as i64).then_some(()))
        })
        .await?;
        consumer.shutdown().await;
        p.shutdown().await;
        assert!(done.load(Ordering::Relaxed) >= n);
        Ok(())
    });
}
