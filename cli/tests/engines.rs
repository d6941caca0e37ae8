//! The engine registry (docs/architecture.md §14.3): every daemon writes its
//! row on start and beats; `seckillctl engines` lists the live ones and the
//! dead, those stopped cleanly at once and those fallen silent after
//! `[registry] dead_after_ms`. The console reads every live daemon and adds
//! their figures up; the elected singletons (§14.4) run on one daemon each.

use anyhow::{Context, Result, ensure};
use seckill_engine::{ActivityId, Role, SkuId, TopicKind};
use seckill_tests::{Engine, Setup, TestEnv, eventually, run};
use secrecy::ExposeSecret;
use std::time::Duration;

/// `seckillctl health --output json`: its exit code and its rows.
async fn health_of(
    env: &TestEnv,
    token: &str,
) -> Result<(i32, serde_json::Value, Vec<serde_json::Value>)> {
    let (code, json) = cli(env, token, &["health", "--window", "500ms", "-o", "json"]).await?;
    let rows = json["components"].as_array().context("components")?.clone();
    Ok((code, json, rows))
}

/// `seckillctl ARGS` against this test's database and topics, reading
/// whichever engines the registry holds live; its exit code and stdout.
async fn cli(env: &TestEnv, token: &str, args: &[&str]) -> Result<(i32, serde_json::Value)> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckillctl"))
        .args(args)
        .env_remove("SECKILL_CONFIG")
        .env_remove("SECKILL_ENGINE_URL")
        .env("SECKILL_DATABASE_URL", env.cfg.database_url.expose_secret())
        .env("SECKILL_TOPIC_PREFIX", &env.cfg.topic_prefix)
        .env("SECKILL_TOKEN", token)
        .output()
        .await?;
    let json = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "{args:?}: not JSON: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok((out.status.code().unwrap_or(-1), json))
}

const ACTIVITY: ActivityId = ActivityId(4242);
const SKU: SkuId = SkuId(7);

async fn reserve(engine: &Engine, user: i64) -> Result<()> {
    let (code, body) = engine.reserve(ACTIVITY, SKU, user).await?;
    ensure!(code == 202, "reservation of {user}: {code} {body}");
    Ok(())
}

fn order_row<'a>(backlog: &'a serde_json::Value, group: &str) -> Result<&'a serde_json::Value> {
    backlog["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["group"] == group)
        .with_context(|| format!("no row for {group}: {backlog}"))
}

#[test]
fn one_console_reads_every_live_engine_and_adds_them_up() {
    run(Setup::Full, |env| async move {
        env.seed_activity(ACTIVITY, SKU, 500, 300_000).await?;
        let reader = env.issue_token("console", Role::Reader).await?;
        let a = Engine::start(&env, env.cfg.clone()).await?;
        let b = Engine::start(&env, env.cfg.clone()).await?;
        let group = env.names.group(TopicKind::OrderCreate);
        let topic = env.names.topic(TopicKind::OrderCreate);

        // Hold the SKU's row so the order consumers, on both daemons,
        // block in their transactions: the broker's lag stands still.
        let mut hold = env.pool.begin().await?;
        sqlx::query("SELECT 1 FROM inventory WHERE activity_id = $1 AND sku_id = $2 FOR UPDATE")
            .bind(ACTIVITY)
            .bind(SKU)
            .execute(&mut *hold)
            .await?;
        for user in 0..120 {
            reserve(if user % 2 == 0 { &a } else { &b }, 1_000 + user).await?;
        }
        eventually(Duration::from_secs(30), "120 messages stored", || async {
            let d = env.admin.lag_detail(&topic, &group, 0, usize::MAX).await?;
            Ok((d.broker_offsets >= 120).then_some(()))
        })
        .await?;
        let (code, backlog) =
            cli(&env, &reader, &["backlog", "--window", "1s", "-o", "json"]).await?;
        let broker = env.admin.lag_detail(&topic, &group, 0, usize::MAX).await?;
        let retry = env
            .admin
            .lag_detail(&seckill_engine::retry_topic(&group), &group, 0, usize::MAX)
            .await
            .map(|d| d.messages)
            .unwrap_or(0);
        ensure!(code == 0, "backlog exit {code}: {backlog}");
        let row = order_row(&backlog, &group)?;
        ensure!(
            row["lag_messages"] == broker.messages + retry && broker.messages + retry > 0,
            "the console's lag {} is the broker's own {} (+{retry} retrying)",
            row["lag_messages"],
            broker.messages
        );
        let daemons = backlog["engines"].as_array().context("engines")?.clone();
        ensure!(daemons.len() == 2, "{backlog:#}");
        ensure!(
            daemons
                .iter()
                .all(|e| e["seen"] == "answered" && e["id"].is_string()),
            "{daemons:#?}"
        );
        let inflight: i64 = daemons.iter().filter_map(|e| e["inflight"].as_i64()).sum();
        ensure!(
            row["inflight"].as_i64() == Some(inflight),
            "in flight {} is the daemons' {inflight}",
            row["inflight"]
        );
        hold.rollback().await?;

        eventually(Duration::from_secs(60), "120 orders", || async {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
                .fetch_one(&env.pool)
                .await?;
            Ok((n == 120).then_some(()))
        })
        .await?;
        let (_, backlog) = cli(&env, &reader, &["backlog", "--window", "1s", "-o", "json"]).await?;
        let created: i64 = backlog["engines"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["orders_created"].as_i64())
            .sum();
        ensure!(
            created == 120,
            "the daemons created {created} orders, PostgreSQL holds 120"
        );
        // Each daemon reports where its consumers have got to, queue by
        // queue (docs/architecture.md §10.4), never past the broker's head.
        let heads = env.admin.queue_offsets(&topic).await?;
        let mut furthest = std::collections::BTreeMap::new();
        for e in [&a, &b] {
            let stats: serde_json::Value = e
                .http
                .get(format!("http://{}/v1/stats", e.addr))
                .send()
                .await?
                .json()
                .await?;
            for p in stats["positions"].as_array().into_iter().flatten() {
                if p["topic"] != topic.as_str() {
                    continue;
                }
                let (broker, queue) = (p["broker"].as_str().unwrap_or("?"), p["queue_id"].as_i64());
                let offset = p["offset"].as_i64().context("offset")?;
                let head = heads
                    .iter()
                    .find(|(b, q)| b == broker && Some(q.queue_id as i64) == queue)
                    .map(|(_, q)| q.max)
                    .with_context(|| format!("{p} names no queue of {topic}"))?;
                ensure!(offset <= head, "{p} is past the head {head}");
                let at = furthest.entry((broker.to_owned(), queue)).or_insert(offset);
                *at = (*at).max(offset);
            }
        }
        ensure!(
            !furthest.is_empty(),
            "no daemon reported a position of {topic}"
        );

        // Each singleton runs on exactly one daemon, and health says who.
        let list = engines(&env).await?;
        let mut roles: Vec<String> = list
            .iter()
            .flat_map(|e| e["roles"].as_array().cloned().unwrap_or_default())
            .filter_map(|r| r.as_str().map(str::to_owned))
            .collect();
        roles.sort();
        ensure!(roles == ["dlq-mirror", "sweeps", "webhook"], "{list:#?}");
        let (code, health, rows) = health_of(&env, &reader).await?;
        let row = |name: &str| rows.iter().find(|c| c["component"] == name).cloned();
        for e in &list {
            let name = format!("engine {}", e["id"].as_str().unwrap_or("?"));
            ensure!(
                row(&name).is_some_and(|r| r["state"] == "UP"),
                "{name}: {health:#}"
            );
        }
        for role in ["dlq-mirror", "sweeps", "webhook"] {
            ensure!(
                row(&format!("singleton {role}")).is_some_and(|r| r["state"] == "UP"),
                "{role}: {health:#}"
            );
        }
        // (The alerts may fire: the held row slowed those transactions.)
        ensure!(
            code != 3 && rows.iter().all(|c| c["state"] != "DOWN"),
            "health exit {code}: {health:#}"
        );

        // A mutation without --engine-url goes to a live daemon of the
        // registry, not to the default address where none listens.
        let operator = env.issue_token("on-call", Role::Operator).await?;
        cancel_reaches_an_engine(&env, &operator).await?;

        // The holder stops cleanly: its roles move at once, and a stopped
        // daemon is no finding.
        let holder = list
            .iter()
            .find(|e| e["roles"].as_array().is_some_and(|r| !r.is_empty()))
            .and_then(|e| e["address"].as_str())
            .context("a holder")?
            .to_owned();
        let (stopping, staying) = if holder == a.addr.to_string() {
            (a, b)
        } else {
            (b, a)
        };
        stopping.stop().await?;
        let staying_addr = staying.addr.to_string();
        eventually(
            Duration::from_secs(10),
            "the roles on the survivor",
            || async {
                let list = engines(&env).await?;
                Ok(list
                    .iter()
                    .find(|e| e["address"] == staying_addr.as_str())
                    .and_then(|e| e["roles"].as_array())
                    .is_some_and(|r| r.len() == 3)
                    .then_some(()))
            },
        )
        .await?;
        // And a daemon that fell silent is a finding: degraded, not down.
        sqlx::query(
            "INSERT INTO engine_instances (engine_id, address, version, hostname, pid, started_at, heartbeat_at)
             VALUES ('engine-silent', '127.0.0.1:1', '0.1.0', 'elsewhere', 1, now() - interval '2 min', now() - interval '1 min')",
        )
        .execute(&env.pool)
        .await?;
        let (code, health, rows) = health_of(&env, &reader).await?;
        let state_of = |name: &str| {
            rows.iter()
                .find(|c| c["component"] == name)
                .map(|c| c["state"].as_str().unwrap_or("?").to_owned())
        };
        ensure!(
            state_of("engine engine-silent").as_deref() == Some("DEGRADED"),
            "{health:#}"
        );
        ensure!(
            rows.iter().any(|c| c["component"]
                .as_str()
                .is_some_and(|n| n.starts_with("engine "))
                && c["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("stopped cleanly"))
                && c["state"] == "UP"),
            "the stopped daemon: {health:#}"
        );
        ensure!(
            code != 3,
            "one live daemon answers: not unreachable ({code}): {health:#}"
        );
        let (_, backlog) = cli(&env, &reader, &["backlog", "--window", "1s", "-o", "json"]).await?;
        let seen: Vec<&str> = backlog["engines"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["seen"].as_str())
            .collect();
        ensure!(
            seen.contains(&"answered") && seen.contains(&"silent") && seen.contains(&"stopped"),
            "{seen:?}"
        );
        // A daemon the registry holds live but that refuses connections
        // (restarting, say), newest of all: the mutation moves on to the
        // next live one; the request never reached the first.
        sqlx::query(
            "INSERT INTO engine_instances (engine_id, address, version, hostname, pid, started_at, heartbeat_at)
             VALUES ('engine-restarting', '127.0.0.1:1', '0.1.0', 'here', 1, now() + interval '1 hour', now() + interval '1 hour')",
        )
        .execute(&env.pool)
        .await?;
        cancel_reaches_an_engine(&env, &operator).await?;
        staying.stop().await
    });
}

/// `order cancel` of an unknown order without `--engine-url`: it must reach
/// a live engine (and be refused there), not the default address where
/// none listens.
async fn cancel_reaches_an_engine(env: &TestEnv, operator: &str) -> Result<()> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckillctl"))
        .args([
            "order",
            "cancel",
            "--order-id",
            &seckill_engine::OrderId::generate().to_string(),
            "--reason",
            "test",
        ])
        .env_remove("SECKILL_CONFIG")
        .env_remove("SECKILL_ENGINE_URL")
        .env("SECKILL_DATABASE_URL", env.cfg.database_url.expose_secret())
        .env("SECKILL_TOPIC_PREFIX", &env.cfg.topic_prefix)
        .env("SECKILL_TOKEN", operator)
        .output()
        .await?;
    let said = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() != Some(3) && !said.contains("cannot reach"),
        "the cancel of an unknown order should reach a live engine and be refused there: {:?} {said}",
        out.status.code()
    );
    Ok(())
}

/// `seckillctl engines --output json` against this test's database.
async fn engines(env: &TestEnv) -> Result<Vec<serde_json::Value>> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckillctl"))
        .args(["engines", "--output", "json"])
        .env_remove("SECKILL_CONFIG")
        .env("SECKILL_DATABASE_URL", env.cfg.database_url.expose_secret())
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "engines: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn state_of(list: &[serde_json::Value], address: &str) -> Option<String> {
    list.iter()
        .find(|e| e["address"] == address)
        .and_then(|e| e["state"].as_str())
        .map(str::to_owned)
}

#[test]
fn engines_lists_every_daemon_live_or_dead() {
    run(Setup::Full, |env| async move {
        let a = Engine::start(&env, env.cfg.clone()).await?;
        let b = Engine::start(&env, env.cfg.clone()).await?;
        // A daemon killed a minute ago: its row stays, its heartbeat stopped.
        sqlx::query(
            "INSERT INTO engine_instances (engine_id, address, version, hostname, pid, started_at, heartbeat_at)
             VALUES ('engine-killed', '127.0.0.1:1', '0.0.9', 'elsewhere', 1, now() - interval '10 min', now() - interval '1 min')",
        )
        .execute(&env.pool)
        .await?;
        let (addr_a, addr_b) = (a.addr.to_string(), b.addr.to_string());
        let list = engines(&env).await?;
        ensure!(list.len() == 3, "{list:#?}");
        for e in &list {
            for field in ["id", "address", "version", "state"] {
                ensure!(e[field].is_string(), "{field} missing: {e}");
            }
        }
        ensure!(
            state_of(&list, &addr_a).as_deref() == Some("live"),
            "{list:#?}"
        );
        ensure!(
            state_of(&list, &addr_b).as_deref() == Some("live"),
            "{list:#?}"
        );
        let killed = list.iter().find(|e| e["id"] == "engine-killed");
        ensure!(
            killed.is_some_and(|e| e["state"] == "dead" && e["dead_because"] == "silent"),
            "{list:#?}"
        );
        ensure!(
            list[2]["id"] == "engine-killed",
            "live ones first: {list:#?}"
        );

        // A clean stop is dead at once, not after dead_after_ms.
        b.stop().await?;
        let list = engines(&env).await?;
        let b_row = list.iter().find(|e| e["address"] == addr_b.as_str());
        ensure!(
            b_row.is_some_and(|e| e["state"] == "dead" && e["dead_because"] == "stopped"),
            "{list:#?}"
        );
        // The live one keeps beating: its last heartbeat moves on.
        let first =
            seckill_engine::engines::list(&env.pool, &env.cfg.registry, chrono::Duration::hours(1))
                .await?;
        let beat = |v: &[seckill_engine::EngineView]| {
            v.iter()
                .find(|e| e.address == addr_a)
                .map(|e| e.heartbeat_at)
        };
        let before = beat(&first);
        eventually(Duration::from_secs(10), "a heartbeat", || async {
            let now = seckill_engine::engines::list(
                &env.pool,
                &env.cfg.registry,
                chrono::Duration::hours(1),
            )
            .await?;
            Ok((beat(&now) > before).then_some(()))
        })
        .await?;
        ensure!(state_of(&engines(&env).await?, &addr_a).as_deref() == Some("live"));
        a.stop().await
    });
}
