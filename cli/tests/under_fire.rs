//! A sale under fire (docs/architecture.md §3.3, §7.3, §13.2): a flash sale
//! runs while 10,000 malformed reservation requests and 1,000 malformed
//! broker messages arrive beside it. Every bad request is refused with a
//! 4xx and reserves nothing; every bad message is quarantined exactly once
//! with its reason, and `seckillctl quarantine` lists, shows and discards
//! them; the sale still ends with orders equal to stock and a clean
//! reconcile.
//!
//! The garbage comes from proptest strategies run with a fixed seed, so a
//! failure replays.

use anyhow::ensure;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as PropConfig, RngAlgorithm, TestRng, TestRunner};
use seckill_engine::message::OrderCreateRequested;
use seckill_engine::{
    ActivityId, Producer, RequestId, RocketProducer, Role, SkuId, TopicKind, publish::to_outgoing,
    reconcile,
};
use seckill_tests::{Engine, Setup, TestEnv, client_with, eventually, run};
use secrecy::ExposeSecret;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const ACTIVITY: ActivityId = ActivityId(33);
const SKU: SkuId = SkuId(1);
const STOCK: i64 = 200;
const BUYERS: i64 = 400;
const BAD_REQUESTS: usize = 10_000;
const BAD_MESSAGES: usize = 1_000;

/// One malformed reservation request: where it goes, what it carries.
#[derive(Debug, Clone)]
struct BadRequest {
    path: String,
    body: Vec<u8>,
    content_type: Option<&'static str>,
    junk_header: usize,
    with_token: bool,
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        any::<u64>().prop_map(|n| serde_json::json!(n)),
        "\\PC{0,24}".prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::btree_map("\\PC{0,10}", inner, 0..6)
                .prop_map(|m| { serde_json::Value::Object(m.into_iter().collect()) }),
        ]
    })
}

/// The request body fields a client can get wrong, one at a time.
fn bad_body() -> impl Strategy<Value = Vec<u8>> {
    let rid = || RequestId::generate().to_string();
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        any::<i64>()
            .prop_filter("not a valid user", |u| *u <= 0)
            .prop_map(move |u| serde_json::to_vec(
                &serde_json::json!({"user_id": u, "request_id": rid()})
            )
            .unwrap()),
        "\\PC{0,30}".prop_map(move |u| serde_json::to_vec(
            &serde_json::json!({"user_id": u, "request_id": rid()})
        )
        .unwrap()),
        "\\PC{0,40}".prop_map(|r| serde_json::to_vec(
            &serde_json::json!({"user_id": 5, "request_id": r})
        )
        .unwrap()),
        Just(b"{\"user_id\": 99999999999999999999999, \"request_id\": \"x\"}".to_vec()),
        Just(b"{\"user_id\": 1, \"user_id\": 2}".to_vec()),
        Just(format!("{}1{}", "[".repeat(300), "]".repeat(300)).into_bytes()),
    ]
}

fn bad_path() -> impl Strategy<Value = String> {
    let segment = prop_oneof![
        Just("33".to_owned()),
        Just("-1".to_owned()),
        Just("0".to_owned()),
        Just("99999999999999999999".to_owned()),
        Just("..%2F..%2Fetc".to_owned()),
        Just("%00".to_owned()),
        "[a-zé漢0-9]{1,12}",
    ];
    (segment.clone(), segment)
        .prop_map(|(a, s)| format!("/v1/activities/{a}/skus/{s}/reservations"))
}

fn bad_request() -> impl Strategy<Value = BadRequest> {
    let good_path = format!("/v1/activities/{}/skus/{}/reservations", ACTIVITY.0, SKU.0);
    (
        prop_oneof![4 => Just(good_path), 1 => bad_path()],
        bad_body(),
        prop_oneof![8 => Just(Some("application/json")), 1 => Just(None), 1 => Just(Some("text/plain"))],
        prop_oneof![98 => Just(0usize), 1 => Just(20 * 1024), 1 => Just(1)],
        prop_oneof![19 => Just(true), 1 => Just(false)],
        prop_oneof![99 => Just(0usize), 1 => Just(100 * 1024)],
    )
        .prop_map(|(path, mut body, content_type, junk_header, with_token, pad)| {
            if pad > 0 {
                body = vec![b' '; pad];
            }
            BadRequest {
                path,
                body,
                content_type,
                junk_header,
                with_token,
            }
        })
}

/// `n` values of `s` from a fixed seed.
fn sample<T: std::fmt::Debug>(s: impl Strategy<Value = T>, n: usize, seed: u8) -> Vec<T> {
    let mut runner = TestRunner::new_with_rng(
        PropConfig::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    );
    (0..n)
        .map(|_| s.new_tree(&mut runner).expect("a value").current())
        .collect()
}

/// A valid order-create body of this activity, as JSON to break.
fn order_body(user: i64) -> serde_json::Value {
    serde_json::to_value(seckill_tests::order_create(ACTIVITY, SKU, user)).unwrap()
}

/// The `i`-th bad message: its body, and the reason it must be quarantined with.
fn bad_message(i: usize) -> (Vec<u8>, &'static str) {
    let mut v = order_body(1_000_000 + i as i64);
    let o = v.as_object_mut().unwrap();
    let body = |v: &serde_json::Value| serde_json::to_vec(v).unwrap();
    match i % 7 {
        0 => (format!("{{not json {i}").into_bytes(), "BAD_JSON"),
        1 => {
            o.insert("schema_version".into(), 2.into());
            (body(&v), "UNSUPPORTED_SCHEMA")
        }
        2 => {
            o.remove("reservation_id");
            (body(&v), "MISSING_FIELD")
        }
        3 if i % 100 == 3 => {
            // Oversized: half a megabyte, well past anything a producer sends.
            o.insert("padding".into(), "x".repeat(512 * 1024).into());
            (body(&v), "INVALID_FIELD")
        }
        3 | 4 => {
            o.insert("message_id".into(), "evt_not-a-ulid".into());
            (body(&v), "INVALID_FIELD")
        }
        5 => {
            o.insert("user_id".into(), (-7).into());
            (body(&v), "INVALID_FIELD")
        }
        _ => {
            o.insert("activity_id".into(), "thirty-three".into());
            (body(&v), "INVALID_FIELD")
        }
    }
}

async fn ctl(env: &TestEnv, engine: &Engine, token: &str, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_seckillctl"))
        .args(args)
        .env_remove("SECKILL_CONFIG")
        .env("SECKILL_DATABASE_URL", env.cfg.database_url.expose_secret())
        .env("SECKILL_REDIS_URL", env.cfg.redis_url.expose_secret())
        .env("SECKILL_NAMESRV_ADDR", &env.cfg.namesrv_addr)
        .env("SECKILL_TOPIC_PREFIX", &env.cfg.topic_prefix)
        .env("SECKILL_ENGINE_URL", format!("http://{}", engine.addr))
        .env("SECKILL_TOKEN", token)
        .output()
        .await
        .expect("run seckillctl")
}

#[test]
fn a_sale_under_a_flood_of_garbage_sells_the_stock_once_and_quarantines_each_bad_message_once() {
    run(Setup::Full, |env| async move {
        env.seed_activity(ACTIVITY, SKU, STOCK, 300_000).await?;
        let engine = Engine::start(&env, env.cfg.clone()).await?;
        let base = format!("http://{}", engine.addr);
        let ingress = client_with(&env.issue_token("fire-ingress", Role::Ingress).await?);
        let anonymous = reqwest::Client::new();

        // The sale: every buyer once, 16 at a time.
        let buyers = {
            let (http, url) = (
                ingress.clone(),
                format!(
                    "{base}/v1/activities/{}/skus/{}/reservations",
                    ACTIVITY.0, SKU.0
                ),
            );
            tokio::spawn(async move {
                let next = Arc::new(AtomicUsize::new(1));
                let mut workers = tokio::task::JoinSet::new();
                for _ in 0..16 {
                    let (http, url, next) = (http.clone(), url.clone(), next.clone());
                    workers.spawn(async move {
                        let mut statuses = BTreeMap::<u16, usize>::new();
                        loop {
                            let user = next.fetch_add(1, Ordering::Relaxed) as i64;
                            if user > BUYERS {
                                return statuses;
                            }
                            let body = serde_json::json!({"user_id": user, "request_id": RequestId::generate().as_str()});
                            let status = match http.post(&url).json(&body).send().await {
                                Ok(r) => r.status().as_u16(),
                                Err(_) => 0,
                            };
                            *statuses.entry(status).or_default() += 1;
                        }
                    });
                }
                let mut all = BTreeMap::<u16, usize>::new();
                while let Some(Ok(s)) = workers.join_next().await {
                    for (k, v) in s {
                        *all.entry(k).or_default() += v;
                    }
                }
                all
            })
        };

        // The HTTP garbage, 32 at a time.
        let garbage = Arc::new(sample(bad_request(), BAD_REQUESTS, 19));
        let flood = {
            let (ingress, anonymous, base, garbage) = (
                ingress.clone(),
                anonymous.clone(),
                base.clone(),
                garbage.clone(),
            );
            tokio::spawn(async move {
                let next = Arc::new(AtomicUsize::new(0));
                let mut workers = tokio::task::JoinSet::new();
                for _ in 0..32 {
                    let (ingress, anonymous, base, garbage, next) = (
                        ingress.clone(),
                        anonymous.clone(),
                        base.clone(),
                        garbage.clone(),
                        next.clone(),
                    );
                    workers.spawn(async move {
                        let mut statuses = BTreeMap::<u16, usize>::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(r) = garbage.get(i) else {
                                return statuses;
                            };
                            let http = if r.with_token { &ingress } else { &anonymous };
                            let mut req =
                                http.post(format!("{base}{}", r.path)).body(r.body.clone());
                            if let Some(ct) = r.content_type {
                                req = req.header("content-type", ct);
                            }
                            if r.junk_header > 0 {
                                req = req.header("x-junk", "j".repeat(r.junk_header));
                            }
                            let status = match req.send().await {
                                Ok(r) => r.status().as_u16(),
                                // No answer at all: the refusal was lost (a
                                // reset connection), which the test forbids.
                                Err(e) => {
                                    eprintln!("no answer to {:?}: {e:?}", r.path);
                                    0
                                }
                            };
                            *statuses.entry(status).or_default() += 1;
                        }
                    });
                }
                let mut all = BTreeMap::<u16, usize>::new();
                while let Some(Ok(s)) = workers.join_next().await {
                    for (k, v) in s {
                        *all.entry(k).or_default() += v;
                    }
                }
                all
            })
        };

        // The broker garbage, on the order topic with the real tag; each
        // has a key of its own to find its quarantine row by.
        let producer = RocketProducer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &format!("{}PG_UNDER_FIRE", env.cfg.topic_prefix),
            Duration::from_secs(3),
            2,
        )
        .await?;
        let topic = env.names.topic(TopicKind::OrderCreate);
        let template: OrderCreateRequested = serde_json::from_value(order_body(1))?;
        let mut expected = BTreeMap::new();
        for i in 0..BAD_MESSAGES {
            let (body, reason) = bad_message(i);
            let mut m = to_outgoing(&template, &topic);
            m.keys = vec![format!("garbage-{i}")];
            m.properties
                .retain(|(k, _)| i % 2 == 0 || k != seckill_engine::PROP_MESSAGE_ID);
            m.body = body;
            let sent = producer.send(m, Duration::from_secs(5)).await;
            ensure!(
                matches!(sent, seckill_engine::SendOutcome::Confirmed(_)),
                "bad message {i} was not sent: {sent:?}"
            );
            expected.insert(format!("garbage-{i}"), reason);
        }
        producer.shutdown().await;

        let sale = buyers.await?;
        let flooded = flood.await?;
        ensure!(
            sale.get(&202) == Some(&(STOCK as usize))
                && sale.get(&409) == Some(&((BUYERS - STOCK) as usize)),
            "the sale's answers: {sale:?}"
        );
        // Every bad request got a 4xx: refused, never served, never a 5xx.
        let served: usize = flooded
            .iter()
            .filter(|(s, _)| !(400..500).contains(*s))
            .map(|(_, n)| n)
            .sum();
        ensure!(
            served == 0,
            "bad requests answered outside 4xx: {flooded:?}"
        );
        ensure!(
            flooded.values().sum::<usize>() == BAD_REQUESTS,
            "{flooded:?}"
        );
        for code in [400, 401, 413, 431] {
            ensure!(flooded.contains_key(&code), "no {code} among {flooded:?}");
        }

        // Orders equal stock; every bad message quarantined once, with its reason.
        let count = |sql: &'static str| {
            let pool = env.pool.clone();
            async move { Ok::<i64, anyhow::Error>(sqlx::query_scalar(sql).fetch_one(&pool).await?) }
        };
        eventually(Duration::from_secs(90), "orders equal to stock, every bad message quarantined", || async {
            let orders = count("SELECT count(*) FROM orders").await?;
            let quarantined = count("SELECT count(*) FROM message_quarantine WHERE properties->>'KEYS' LIKE 'garbage-%'").await?;
            Ok((orders == STOCK && quarantined == BAD_MESSAGES as i64).then_some(()))
        })
        .await?;
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT properties->>'KEYS', reason::text, count(*) FROM message_quarantine
             WHERE properties->>'KEYS' LIKE 'garbage-%' GROUP BY 1, 2",
        )
        .fetch_all(&env.pool)
        .await?;
        ensure!(
            rows.len() == BAD_MESSAGES,
            "{} keys quarantined",
            rows.len()
        );
        for (key, reason, n) in &rows {
            ensure!(*n == 1, "{key} quarantined {n} times");
            ensure!(
                expected.get(key) == Some(&reason.as_str()),
                "{key}: {reason}, expected {:?}",
                expected.get(key)
            );
        }
        let report = reconcile::run(&env.pool, &env.store(), ACTIVITY).await?;
        ensure!(report.passed(), "{report:#?}");

        // On-call sees them, reads one, and discards it through the engine.
        let operator = env.issue_token("fire-operator", Role::Operator).await?;
        let out = ctl(
            &env,
            &engine,
            &operator,
            &["quarantine", "list", "--limit", "5000", "-o", "json"],
        )
        .await;
        ensure!(out.status.success(), "{out:?}");
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let messages = listed["messages"].as_array().cloned().unwrap_or_default();
        ensure!(messages.len() == BAD_MESSAGES, "listed {}", messages.len());
        let id = messages[0]["quarantine_id"]
            .as_i64()
            .unwrap_or_default()
            .to_string();
        let out = ctl(
            &env,
            &engine,
            &operator,
            &["quarantine", "show", "--id", &id, "-o", "json"],
        )
        .await;
        ensure!(out.status.success(), "{out:?}");
        let shown: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        ensure!(
            shown["properties"]["KEYS"]
                .as_str()
                .is_some_and(|k| k.starts_with("garbage-")),
            "{shown}"
        );
        let reader = env.issue_token("fire-reader", Role::Reader).await?;
        let discard = [
            "quarantine",
            "discard",
            "--id",
            id.as_str(),
            "--reason",
            "garbage from the fire drill",
        ];
        let out = ctl(&env, &engine, &reader, &discard).await;
        ensure!(out.status.code() == Some(77), "{out:?}");
        let out = ctl(&env, &engine, &operator, &discard).await;
        ensure!(out.status.success(), "{out:?}");
        let again = ctl(&env, &engine, &operator, &discard).await;
        ensure!(
            again.status.code() == Some(64),
            "a second discard: {again:?}"
        );
        let audited = env.audit_of(&id).await?;
        ensure!(
            audited.len() == 1
                && audited[0].actor == "fire-operator"
                && audited[0].command == "quarantine discard",
            "{audited:?}"
        );
        let out = ctl(
            &env,
            &engine,
            &operator,
            &["quarantine", "list", "--limit", "5000", "-o", "json"],
        )
        .await;
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        ensure!(listed["messages"].as_array().map(Vec::len) == Some(BAD_MESSAGES - 1));
        engine.stop().await
    });
}
