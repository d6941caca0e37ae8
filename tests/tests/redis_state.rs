//! Redis loses an activity's state (docs/architecture.md §4.5): the engine
//! fails closed with 503 REDIS_STATE_LOST, the survey and the alert say so,
//! the restore rebuilds Redis from PostgreSQL, and afterwards the sale goes
//! on: 409 for a user who already holds an order, 202 for a new one, LOST
//! for a reservation Redis lost before it was sent, and a clean reconcile.
//!
//! The main test runs the sale on a Redis of its own and restarts it for
//! real (it keeps nothing on disk, so it comes back empty), as the
//! `redis-restart` drill does; the smaller one deletes its own keys on the
//! shared Redis.

use anyhow::{Result, ensure};
use seckill_engine::{
    ActivityId, Config, Observer, RedisState, RestoreRequest, SkuId, alerts, redis_state, view,
};
use seckill_tests::{Engine, Setup, TestEnv, eventually, reserve_request, run};
use std::time::Duration;

const ACTIVITY: ActivityId = ActivityId(16);
const SKU: SkuId = SkuId(1);
const STOCK: i64 = 10;

fn engine_cfg(env: &TestEnv) -> Config {
    on(&env.cfg)
}

fn on(cfg: &Config) -> Config {
    let mut cfg = cfg.clone();
    cfg.scanner.first_retry_after_ms = 500;
    cfg.scanner.interval_ms = 100;
    cfg
}

async fn reserve(engine: &Engine, user: i64) -> Result<(u16, serde_json::Value)> {
    let r = engine
        .http
        .post(format!(
            "http://{}/v1/activities/{ACTIVITY}/skus/{SKU}/reservations",
            engine.addr
        ))
        .json(&serde_json::json!({
            "user_id": user,
            "request_id": seckill_engine::RequestId::generate().as_str(),
        }))
        .send()
        .await?;
    Ok((r.status().as_u16(), r.json().await.unwrap_or_default()))
}

async fn count(env: &TestEnv, sql: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(&env.pool).await?)
}

/// A Redis of this test's own, and the configuration and store that use it.
async fn on_private_redis(
    env: &TestEnv,
) -> Result<(PrivateRedis, Config, seckill_engine::ReservationStore)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let dir = std::env::temp_dir().join(format!("seckill-redis-{}", env.token));
    std::fs::create_dir_all(&dir)?;
    let redis = PrivateRedis::start(port, &dir)?;
    redis.wait_ready().await?;
    let mut cfg = env.cfg.clone();
    cfg.redis_url = format!("redis://127.0.0.1:{port}/").into();
    let store = seckill_engine::ReservationStore::new(
        seckill_engine::redis_conn::connect(&cfg).await?,
        cfg.redis_prefix.clone(),
    );
    Ok((redis, cfg, store))
}

#[test]
fn lost_redis_state_fails_closed_then_restore_resumes_the_sale() {
    run(Setup::Full, |env| async move {
        let (mut redis, cfg, store) = on_private_redis(&env).await?;
        seckill_engine::activity::create(
            &env.pool,
            &store,
            &seckill_engine::NewActivity {
                activity: ACTIVITY,
                sku: SKU,
                stock: STOCK,
                valid_for_ms: 300_000,
                pay_within_ms: 900_000,
                force: false,
            },
        )
        .await?;
        let engine = Engine::start(&env, on(&cfg)).await?;
        for user in 1..=4 {
            let (code, body) = reserve(&engine, user).await?;
            ensure!(code == 202, "user {user}: {code} {body}");
        }
        eventually(Duration::from_secs(60), "four orders", || async {
            Ok((count(&env, "SELECT count(*) FROM orders").await? == 4).then_some(()))
        })
        .await?;
        // A reservation Redis holds but never sent: straight into the store,
        // as if the engine had reserved it and Redis died before the send.
        let now = chrono::Utc::now().timestamp_millis();
        let unsent = reserve_request(ACTIVITY, SKU, 5, now, 300_000);
        store.reserve(&unsent, now + 600_000).await?;

        redis.restart().await?;

        // Fail closed, with a reason that names the fix.
        let (code, body) = reserve(&engine, 6).await?;
        assert_eq!(code, 503, "{body}");
        assert_eq!(body["error"], "REDIS_STATE_LOST", "{body}");
        assert_eq!(body["retryable"], true, "{body}");
        let reason = body["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("seckillctl activity restore"), "{reason}");

        // The survey, the sample and the alert see it.
        let lost = redis_state::survey(&env.pool, &store).await?;
        assert_eq!(lost.len(), 1, "{lost:?}");
        assert_eq!(lost[0].state, RedisState::Lost);
        let mut observer = Observer::new(&cfg, env.rt.clone());
        let sample = observer.sample().await;
        observer.shutdown().await;
        assert_eq!(sample.redis_lost.len(), 1, "{:?}", sample.errors);
        let fired = alerts::evaluate(&env.cfg.alerts, &view::alert_inputs(None, &sample));
        let alert = fired
            .iter()
            .find(|a| a.metric == "redis_state_lost")
            .expect("the alert is evaluated");
        assert_eq!(alert.state, seckill_engine::AlertState::Critical);
        assert_eq!(alert.runbook, "runbooks/redis_state_lost.md");
        // The unsent reservation is not LOST yet: no restore has replaced
        // its epoch, so nothing definite can be said.
        let status_url = format!(
            "http://{}/v1/reservations/{}",
            engine.addr, unsent.reservation_id
        );
        assert_eq!(
            engine.http.get(&status_url).send().await?.status().as_u16(),
            404
        );

        let report = redis_state::restore(
            &env.pool,
            &store,
            &RestoreRequest {
                activity: ACTIVITY,
                operator: "test".into(),
                reason: "Redis restarted empty".into(),
            },
        )
        .await?;
        assert_eq!(report.stock, vec![(SKU, STOCK - 4)]);
        assert_eq!((report.buyers, report.live_orders), (4, 4));
        assert_eq!((report.previous_epoch, report.epoch), (1, 2));
        // A second restore finds nothing to do, and says so.
        let again = redis_state::restore(
            &env.pool,
            &store,
            &RestoreRequest {
                activity: ACTIVITY,
                operator: "test".into(),
                reason: "twice".into(),
            },
        )
        .await;
        assert!(
            matches!(again, Err(seckill_engine::RedisStateError::Intact { .. })),
            "{again:?}"
        );

        // A definite answer for the reservation Redis lost unsent.
        let body: serde_json::Value = engine.http.get(&status_url).send().await?.json().await?;
        assert_eq!(body["status"], "LOST", "{body}");

        // The sale goes on: the watcher reopens within a second.
        let (code, body) = eventually(Duration::from_secs(10), "reopened", || async {
            let (code, body) = reserve(&engine, 1).await?;
            Ok((code != 503).then_some((code, body)))
        })
        .await?;
        assert_eq!(code, 409, "user 1 already holds an order: {body}");
        assert_eq!(body["error"], "DUPLICATE_USER", "{body}");
        let (code, body) = reserve(&engine, 7).await?;
        assert_eq!(code, 202, "a new user: {body}");
        eventually(Duration::from_secs(60), "the new order", || async {
            Ok((count(&env, "SELECT count(*) FROM orders").await? == 5).then_some(()))
        })
        .await?;
        engine.stop().await?;

        assert_eq!(store.stock(ACTIVITY, SKU).await?, Some(STOCK - 5));
        let report = seckill_engine::reconcile::run(&env.pool, &store, ACTIVITY).await?;
        assert!(report.passed(), "{report:#?}");
        Ok(())
    });
}

#[test]
fn a_restored_unpaid_order_still_gives_its_unit_back_when_canceled() {
    run(Setup::Full, |env| async move {
        env.seed_activity(ACTIVITY, SKU, STOCK, 300_000).await?;
        let engine = Engine::start(&env, engine_cfg(&env)).await?;
        let (code, body) = reserve(&engine, 1).await?;
        ensure!(code == 202, "{code} {body}");
        let order = body["order_id"].as_str().unwrap_or_default().to_owned();
        eventually(Duration::from_secs(60), "the order", || async {
            Ok((count(&env, "SELECT count(*) FROM orders").await? == 1).then_some(()))
        })
        .await?;
        env.lose_redis_state().await?;
        redis_state::restore(
            &env.pool,
            &env.store(),
            &RestoreRequest {
                activity: ACTIVITY,
                operator: "test".into(),
                reason: "lost".into(),
            },
        )
        .await?;
        let store = env.store();
        assert_eq!(store.stock(ACTIVITY, SKU).await?, Some(STOCK - 1));
        // The cancel gives the unit back in PostgreSQL, and its compensation
        // finds the restored hash and gives it back in Redis, once.
        let canceled = seckill_engine::order::cancel(
            &env.pool,
            &env.names,
            &order.parse()?,
            seckill_engine::CancelMode::Now,
            "test",
        )
        .await?;
        assert!(
            matches!(canceled, seckill_engine::CancelOutcome::Canceled { .. }),
            "{canceled:?}"
        );
        eventually(Duration::from_secs(60), "released in Redis", || async {
            Ok((store.stock(ACTIVITY, SKU).await? == Some(STOCK)).then_some(()))
        })
        .await?;
        engine.stop().await?;
        let report = seckill_engine::reconcile::run(&env.pool, &store, ACTIVITY).await?;
        assert!(report.passed(), "{report:#?}");
        Ok(())
    });
}

/// A Redis of this test's own on a free loopback port, no persistence.
struct PrivateRedis {
    port: u16,
    dir: std::path::PathBuf,
    child: std::process::Child,
}

impl PrivateRedis {
    fn start(port: u16, dir: &std::path::Path) -> Result<Self> {
        Ok(Self {
            port,
            dir: dir.to_owned(),
            child: Self::spawn(port, dir)?,
        })
    }

    fn spawn(port: u16, dir: &std::path::Path) -> Result<std::process::Child> {
        Ok(std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .spawn()?)
    }

    async fn wait_ready(&self) -> Result<()> {
        let addr = format!("127.0.0.1:{}", self.port);
        eventually(Duration::from_secs(20), "the private Redis", || async {
            Ok(tokio::net::TcpStream::connect(&addr).await.ok().map(|_| ()))
        })
        .await
    }

    /// Stopped (this test's own child, by its pid) and started again, empty.
    async fn restart(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        self.child = Self::spawn(self.port, &self.dir)?;
        self.wait_ready().await
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn the_store_reads_through_a_redis_restart() {
    run(Setup::Full, |env| async move {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = std::env::temp_dir().join(format!("seckill-redis-{}", env.token));
        std::fs::create_dir_all(&dir)?;
        let mut redis = PrivateRedis::start(port, &dir)?;
        redis.wait_ready().await?;
        let mut cfg = env.cfg.clone();
        cfg.redis_url = format!("redis://127.0.0.1:{port}/").into();
        let store = seckill_engine::ReservationStore::new(
            seckill_engine::redis_conn::connect(&cfg).await?,
            cfg.redis_prefix.clone(),
        );
        store.seed_stock(ACTIVITY, SKU, 5, false, 1).await?;
        assert_eq!(store.stock(ACTIVITY, SKU).await?, Some(5));
        redis.restart().await?;
        // The first command on the old connection breaks; the read is tried
        // again on a new one and answers: empty, as Redis came back.
        assert_eq!(store.stock(ACTIVITY, SKU).await?, None);
        assert_eq!(store.epoch(ACTIVITY).await?, None);
        assert_eq!(store.pending_count(ACTIVITY).await?, 0);
        drop(redis);
        Ok(())
    });
}
