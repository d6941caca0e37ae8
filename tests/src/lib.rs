//! Shared harness for the integration tests. Every test gets its own
//! PostgreSQL database (created, migrated, dropped), its own Redis key prefix
//! and its own topic and consumer-group prefix, so tests run in parallel and
//! in any order against the one real stack (`./scripts/stack.sh up`).

use anyhow::Result;
use seckill_engine::RedisConn;
use seckill_engine::{
    ActivityId, ClientRuntime, Config, MessageId, Names, OrderId, RequestId, ReservationId,
    ReserveRequest, RocketAdmin, SkuId, TicketId, TopicKind, UserId,
};
use secrecy::{ExposeSecret, SecretString};
use sqlx::PgPool;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The stack's coordinates; the same environment variables as the CLI.
/// The tests' send timeout, pinned whatever the default: a debug build on
/// a loaded 2-core box is slow to send (docs/architecture.md §6.1), and the
/// tests check what the pipeline does with an outcome, not the timeout;
/// those that want an UNKNOWN inject one.
pub const TEST_SEND_TIMEOUT_MS: u64 = 3_000;

fn base_config() -> Config {
    let mut cfg = Config::default();
    cfg.mq.send_timeout_ms = TEST_SEND_TIMEOUT_MS;
    if let Ok(v) = std::env::var("SECKILL_DATABASE_URL") {
        cfg.database_url = SecretString::from(v);
    }
    if let Ok(v) = std::env::var("SECKILL_REDIS_URL") {
        cfg.redis_url = SecretString::from(v);
    }
    if let Ok(v) = std::env::var("SECKILL_NAMESRV_ADDR") {
        cfg.namesrv_addr = v;
    }
    if let Some(n) = std::env::var("SECKILL_REDIS_WAIT_REPLICAS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        cfg.redis.wait_replicas = n;
    }
    cfg
}

/// One test's private slice of the stack.
pub struct TestEnv {
    /// Points at this test's database, key prefix and topic prefix.
    pub cfg: Config,
    pub pool: PgPool,
    pub redis: RedisConn,
    pub names: Names,
    pub rt: Arc<ClientRuntime>,
    pub admin: RocketAdmin,
    /// A lowercase unique token, also the database name's suffix.
    pub token: String,
}

/// The actor of a test's own direct calls into the library, on its audit rows.
pub fn test_actor() -> seckill_engine::Actor {
    seckill_engine::Actor {
        name: "integration-test".to_owned(),
        role: seckill_engine::Role::Admin,
        via: seckill_engine::Via::Direct,
    }
}

/// An HTTP client that sends `token` on every request.
pub fn client_with(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
        .expect("a token is ASCII");
    v.set_sensitive(true);
    headers.insert(reqwest::header::AUTHORIZATION, v);
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .expect("an HTTP client")
}

impl TestEnv {
    /// The operator audit rows that touched `target`, newest first.
    pub async fn audit_of(&self, target: &str) -> Result<Vec<seckill_engine::AuditRow>> {
        let filter = seckill_engine::audit::Filter {
            target: Some(target.to_owned()),
            limit: 100,
            ..Default::default()
        };
        Ok(seckill_engine::audit::list(&self.pool, &filter).await?)
    }

    /// Waits until the order consumer has created `order`.
    pub async fn order_created(&self, order: &str) -> Result<()> {
        let id: OrderId = order.parse()?;
        eventually(Duration::from_secs(30), "the order exists", || async {
            Ok(seckill_engine::order::get(&self.pool, &id)
                .await?
                .map(|_| ()))
        })
        .await
    }

    /// Issues a token of `role` in this test's database (the bootstrap
    /// path: the database URL is the root credential).
    pub async fn issue_token(&self, name: &str, role: seckill_engine::Role) -> Result<String> {
        Ok(seckill_engine::tokens::create(&self.pool, name, role, &test_actor()).await?)
    }

    /// Everything under this test's Redis prefix, gone: what a Redis
    /// restarted without persistence holds of it.
    pub async fn lose_redis_state(&self) -> Result<()> {
        let mut redis = self.redis.clone();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.cfg.redis_prefix))
            .query_async(&mut redis)
            .await?;
        anyhow::ensure!(!keys.is_empty(), "nothing of this test is in Redis");
        let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut redis).await?;
        Ok(())
    }

    /// A new live ticket of the order-create group for `class`, as the
    /// governor opens them (one per group and class while not closed).
    pub async fn open_ticket(&self, class: seckill_engine::FailureClass) -> Result<TicketId> {
        let ticket = TicketId::generate();
        sqlx::query(
            "INSERT INTO dlq_tickets (ticket_id, consumer_group, error_class) VALUES ($1, $2, $3)",
        )
        .bind(&ticket)
        .bind(self.names.group(TopicKind::OrderCreate))
        .bind(class)
        .execute(&self.pool)
        .await?;
        Ok(ticket)
    }

    /// A dead order-create message of `user`, as the mirror leaves it
    /// (under `ticket` when given): a replay sends it to this test's
    /// order topic, where a running engine creates the order.
    pub async fn dead_order(
        &self,
        ticket: Option<&TicketId>,
        activity: ActivityId,
        sku: SkuId,
        user: i64,
    ) -> Result<MessageId> {
        let m = order_create(activity, sku, user);
        let kind = TopicKind::OrderCreate;
        sqlx::query(
            "INSERT INTO dlq_messages (consumer_group, message_id, ticket_id, original_topic, broker_msg_id,
                                       dlq_queue_id, dlq_queue_offset, body, properties, error_class,
                                       delivery_attempts, dead_at)
             VALUES ($1, $2, $3, $4, 'B', 0, $5, $6, $7, 'DB_TIMEOUT', 4, now())",
        )
        .bind(self.names.group(kind))
        .bind(m.message_id.as_str())
        .bind(ticket)
        .bind(self.names.topic(kind))
        .bind(user)
        .bind(serde_json::to_vec(&m)?)
        .bind(serde_json::json!({"TAGS": "CREATE_ORDER", "KEYS": m.reservation_id.as_str()}))
        .execute(&self.pool)
        .await?;
        Ok(m.message_id)
    }

    /// `bin` (the caller's `env!("CARGO_BIN_EXE_seckillctl")`) pointed at
    /// this test's stores: `conf`, written here, holds its Redis prefix,
    /// and the environment names its database, Redis, NameServer and topic
    /// prefix; what the shell may have set (`SECKILL_CONFIG`, the log's
    /// format and level, an OTLP endpoint) is removed. Each caller names
    /// its own `conf`: tests run in parallel, and one rewriting a shared
    /// file under another's daemon would point it elsewhere.
    pub fn seckillctl(&self, bin: &str, conf: &std::path::Path) -> Result<tokio::process::Command> {
        std::fs::write(
            conf,
            format!(
                "redis_prefix = \"{}\"\n[mq]\nsend_timeout_ms = {TEST_SEND_TIMEOUT_MS}\n",
                self.cfg.redis_prefix
            ),
        )?;
        let mut cmd = tokio::process::Command::new(bin);
        cmd.arg("--config")
            .arg(conf)
            .env_remove("SECKILL_CONFIG")
            .env_remove("SECKILL_LOG_FORMAT")
            .env_remove("SECKILL_OTLP_ENDPOINT")
            .env_remove("RUST_LOG")
            .env(
                "SECKILL_DATABASE_URL",
                self.cfg.database_url.expose_secret(),
            )
            .env("SECKILL_REDIS_URL", self.cfg.redis_url.expose_secret())
            .env("SECKILL_NAMESRV_ADDR", &self.cfg.namesrv_addr)
            .env("SECKILL_TOPIC_PREFIX", &self.cfg.topic_prefix);
        Ok(cmd)
    }

    /// This test's reservation store (its own key prefix).
    pub fn store(&self) -> seckill_engine::ReservationStore {
        seckill_engine::ReservationStore::new(self.redis.clone(), self.cfg.redis_prefix.clone())
    }

    /// An activity with one SKU, seeded in PostgreSQL and Redis alike, with
    /// a 15-minute pay window.
    pub async fn seed_activity(
        &self,
        activity: ActivityId,
        sku: SkuId,
        stock: i64,
        valid_for_ms: i64,
    ) -> Result<()> {
        seckill_engine::activity::create(
            &self.pool,
            &self.store(),
            &seckill_engine::activity::NewActivity {
                activity,
                sku,
                stock,
                valid_for_ms,
                pay_within_ms: 900_000,
                force: false,
            },
        )
        .await?;
        Ok(())
    }
}

/// A valid order-create body of `user`, as the publisher builds it: fresh
/// ids, valid for 5 minutes.
pub fn order_create(
    activity: ActivityId,
    sku: SkuId,
    user: i64,
) -> seckill_engine::message::OrderCreateRequested {
    use seckill_engine::message::{ORDER_CREATE_EVENT, OrderCreateRequested, TraceContext};
    let rsv = ReservationId::generate();
    let now = chrono::Utc::now();
    OrderCreateRequested {
        schema_version: 1,
        event_type: ORDER_CREATE_EVENT.into(),
        message_id: MessageId::generate(),
        message_key: rsv.clone(),
        request_id: RequestId::generate(),
        reservation_id: rsv,
        order_id: OrderId::generate(),
        activity_id: activity,
        sku_id: sku,
        user_id: UserId(user),
        quantity: 1,
        reservation_created_at: now,
        reservation_valid_until: now + chrono::Duration::minutes(5),
        created_at: now,
        retry_count: 0,
        replay_count: 0,
        producer: "harness".into(),
        trace: TraceContext::generate(),
    }
}

/// A fresh reservation request of `user`, made at `now_ms`, valid for `valid_for_ms`.
pub fn reserve_request(
    activity: ActivityId,
    sku: SkuId,
    user: i64,
    now_ms: i64,
    valid_for_ms: i64,
) -> ReserveRequest {
    let reservation_id = ReservationId::generate();
    ReserveRequest {
        activity_id: activity,
        sku_id: sku,
        user_id: UserId(user),
        request_id: RequestId::generate(),
        trace_id: seckill_engine::TraceId::of_reservation(&reservation_id),
        reservation_id,
        message_id: MessageId::generate(),
        order_id: OrderId::generate(),
        now_ms,
        valid_until_ms: now_ms + valid_for_ms,
    }
}

/// Which parts of the stack a test needs set up before it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// Database created but left empty (no migrations).
    EmptyDatabase,
    /// Migrated database, topics and groups created.
    Full,
}

fn url_with_database(url: &str, db: &str) -> String {
    // Replace the path segment after the authority; keep any query string.
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[scheme_end..].find('/').map(|i| i + scheme_end);
    let root = path_start.map_or(base, |i| &base[..i]);
    match query {
        Some(q) => format!("{root}/{db}?{q}"),
        None => format!("{root}/{db}"),
    }
}

/// Runs `body` with a fresh [`TestEnv`] on the engine's runtime, then drops
/// the database and the Redis keys, whether the body passed, failed or panicked.
pub fn run<F, Fut>(setup: Setup, body: F)
where
    F: FnOnce(TestEnv) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let outcome = seckill_engine::runtime::run(|rt| async move {
        let token = ulid::Ulid::new().to_string().to_lowercase();
        let base = base_config();
        let admin_url = url_with_database(base.database_url.expose_secret(), "postgres");
        let db_name = format!("seckill_t_{token}");
        let admin_pool = match PgPool::connect(&admin_url).await {
            Ok(p) => p,
            Err(e) => {
                return Err(anyhow::Error::new(e).context(
                    "connect to the postgres database; is the stack up? (./scripts/stack.sh up)",
                ));
            }
        };
        if let Err(e) = sqlx::query(&format!("CREATE DATABASE \"{db_name}\""))
            .execute(&admin_pool)
            .await
        {
            return Err(anyhow::Error::new(e).context("create the test database"));
        }

        let mut cfg = base.clone();
        cfg.database_url = SecretString::from(url_with_database(
            base.database_url.expose_secret(),
            &db_name,
        ));
        cfg.topic_prefix = format!("T{}_", token.to_uppercase());
        cfg.redis_prefix = format!("t{token}");
        cfg.pg.max_connections = 8;

        let result = start(setup, &cfg, rt.clone(), token.clone(), body).await;
        cleanup(&admin_pool, &db_name, &cfg).await;
        drop_topics(&cfg, rt.clone()).await;
        admin_pool.close().await;
        result
    })
    .expect("build the runtime");
    match outcome {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => panic!("test failed: {e:#}"),
        Ok(Err(join)) => match join.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("test task was cancelled: {e}"),
        },
        Err(e) => panic!("test setup failed: {e:#}"),
    }
}

type BodyResult = std::result::Result<Result<()>, tokio::task::JoinError>;

async fn start<F, Fut>(
    setup: Setup,
    cfg: &Config,
    rt: Arc<ClientRuntime>,
    token: String,
    body: F,
) -> Result<BodyResult>
where
    F: FnOnce(TestEnv) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let pool = seckill_engine::db::connect_unchecked(cfg).await?;
    let redis = seckill_engine::redis_conn::connect(cfg).await?;
    let names = Names::new(cfg.topic_prefix.clone());
    let admin = RocketAdmin::start(rt.clone(), &cfg.namesrv_addr, cfg.admin_timeout()).await?;
    if setup == Setup::Full {
        seckill_engine::db::migrate(&pool).await?;
        seckill_engine::setup_mq(&admin, &names, cfg.mq.max_reconsume_times).await?;
    }
    let env = TestEnv {
        cfg: cfg.clone(),
        pool: pool.clone(),
        redis,
        names,
        rt,
        admin,
        token,
    };
    // The body runs as its own task, so a panic in it still reaches the
    // caller's cleanup.
    let out = tokio::spawn(body(env)).await;
    pool.close().await;
    Ok(out)
}

async fn cleanup(admin_pool: &PgPool, db_name: &str, cfg: &Config) {
    let _ = sqlx::query(&format!(
        "DROP DATABASE IF EXISTS \"{db_name}\" WITH (FORCE)"
    ))
    .execute(admin_pool)
    .await;
    if let Ok(mut redis) = seckill_engine::redis_conn::connect(cfg).await {
        let pattern = format!("{}:*", cfg.redis_prefix);
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query_async(&mut redis)
            .await
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<(), _> = redis::cmd("DEL").arg(&keys).query_async(&mut redis).await;
        }
    }
}

/// Deletes this test's topics (its retry and DLQ topics too) from the
/// broker: each queue preallocates its consume-queue file, and a test
/// suite's worth of topics left behind filled the disk until the broker
/// refused writes. Best effort, bounded: a test's verdict never depends on it.
async fn drop_topics(cfg: &Config, rt: Arc<ClientRuntime>) {
    let Ok(admin) = RocketAdmin::start(rt, &cfg.namesrv_addr, cfg.admin_timeout()).await else {
        return;
    };
    if let Err(e) = admin.delete_topics_containing(&cfg.topic_prefix).await {
        eprintln!(
            "could not delete the test's topics ({}): {e}",
            cfg.topic_prefix
        );
    }
    admin.shutdown().await;
}

/// Polls `probe` until it returns `Some`, or fails after `limit` naming `what`.
/// Waiting on an observable condition, never on a fixed sleep.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            anyhow::bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A daemon (`seckillctl engine run`) inside the test, on an ephemeral port.
pub struct Engine {
    pub addr: std::net::SocketAddr,
    /// Sends an admin token, issued for this engine in the test's database,
    /// on every request: it may call every route.
    pub http: reqwest::Client,
    /// Where the probes and `/metrics` listen when apart from the API.
    pub admin_addr: Option<std::net::SocketAddr>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
}

impl Engine {
    /// One reservation request of `user` with a fresh request id: the
    /// status code and the answer's body (`Null` when it is not JSON).
    pub async fn reserve(
        &self,
        activity: ActivityId,
        sku: SkuId,
        user: i64,
    ) -> Result<(u16, serde_json::Value)> {
        let r = self
            .http
            .post(format!(
                "http://{}/v1/activities/{}/skus/{}/reservations",
                self.addr, activity.0, sku.0
            ))
            .json(
                &serde_json::json!({"user_id": user, "request_id": RequestId::generate().as_str()}),
            )
            .send()
            .await?;
        let code = r.status().as_u16();
        Ok((code, r.json().await.unwrap_or_default()))
    }

    /// Starts it and waits until `/readyz` answers.
    pub async fn start(env: &TestEnv, cfg: Config) -> Result<Engine> {
        Self::start_on(env, cfg, false).await
    }

    /// With `admin`, the probes and `/metrics` listen on a second
    /// ephemeral port ([`Engine::admin_addr`]), as `--admin-listen` does.
    pub async fn start_on(env: &TestEnv, cfg: Config, admin: bool) -> Result<Engine> {
        let name = format!(
            "test-admin-{}",
            ulid::Ulid::new().to_string().to_lowercase()
        );
        let http = client_with(&env.issue_token(&name, seckill_engine::Role::Admin).await?);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let admin = match admin {
            true => Some(tokio::net::TcpListener::bind("127.0.0.1:0").await?),
            false => None,
        };
        let admin_addr = admin.as_ref().map(|l| l.local_addr()).transpose()?;
        let listeners = seckill_engine::Listeners {
            api: listener,
            admin,
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let rt = env.rt.clone();
        let done = tokio::spawn(async move {
            let shutdown = async move {
                let _ = rx.await;
            };
            if let Err(e) = seckill_engine::run_daemon(cfg, rt, listeners, shutdown).await {
                panic!("engine failed: {e}");
            }
        });
        let url = format!("http://{}/readyz", admin_addr.unwrap_or(addr));
        eventually(Duration::from_secs(30), "engine ready", || async {
            Ok(reqwest::get(&url)
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ()))
        })
        .await?;
        Ok(Engine {
            addr,
            admin_addr,
            http,
            stop: Some(tx),
            done,
        })
    }

    /// Stops it as SIGTERM would, and waits for it to finish.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(60), self.done).await??;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::url_with_database;

    #[test]
    fn swaps_the_database() {
        assert_eq!(
            url_with_database("postgres://u@h:5432/seckill", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(
            url_with_database("postgres://u@h:5432", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(
            url_with_database("postgres://u@h/seckill?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
    }
}
