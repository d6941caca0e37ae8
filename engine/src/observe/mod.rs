//! What on-call looks at (docs/architecture.md §10–11): one [`Sample`] of every
//! source (consumer lag per group, Redis pending, PostgreSQL server
//! activity, the DLQ, and a running engine's own counters), taken by an
//! [`Observer`]. The [`view`] functions turn one or two samples into the
//! rows `backlog`, `pending`, `pg`, `health`, `scale advise`, the TUI and
//! the daemon's governor show; they are pure.
//!
//! A source that cannot be read becomes an entry in [`Sample::errors`],
//! never a failed sample: a down component must not blank the whole screen.

pub mod engines;
pub mod health;
pub mod view;
mod watch;

pub use watch::{Observation, Watch};

use crate::config::Config;
use crate::domain::clock::now_ms;
use crate::domain::ids::ActivityId;
use crate::domain::message::parse_order_create;
use crate::domain::stats::StatsView;
use crate::mq::rocket::RocketAdmin;
use crate::mq::{Names, TopicKind};
use crate::reservation::ReservationStore;
use crate::runtime::ClientRuntime;
use crate::store::{db, redis as redis_conn};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Pending reservations read per activity; beyond it the view says so.
pub const PENDING_SCAN_CAP: usize = 10_000;
/// Unconsumed messages read per queue to find soon-to-expire reservations.
pub const HEAD_PROBE: i32 = 32;
/// Rates compare samples at least this far apart: the broker learns
/// consumed offsets only once a second (see `RocketConsumer::start`), so
/// a shorter span reads 0/s and then a burst.
pub const RATE_SPAN: std::time::Duration = std::time::Duration::from_secs(3);

/// Recent samples, to pick the one [`RATE_SPAN`] back as the base of rates.
#[derive(Debug, Default)]
pub struct History(std::collections::VecDeque<Sample>);

impl History {
    /// Adds `cur` and returns the newest earlier sample at least
    /// [`RATE_SPAN`] older (or the oldest one kept, while warming up).
    pub fn push(&mut self, cur: Sample) -> Option<&Sample> {
        let span = RATE_SPAN.as_millis() as i64;
        // Keep one sample older than the span, drop the rest.
        while self.0.len() >= 2 && cur.at_ms - self.0[1].at_ms >= span {
            self.0.pop_front();
        }
        self.0.push_back(cur);
        let n = self.0.len();
        (n >= 2).then(|| &self.0[0])
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GroupSample {
    pub group: String,
    pub topic: String,
    pub lag_messages: i64,
    pub lag_seconds: f64,
    /// Of which waiting in `%RETRY%<group>`.
    pub retry_lag_messages: i64,
    pub retry_lag_seconds: f64,
    pub broker_offsets: i64,
    pub consumer_offsets: i64,
    /// Earliest `reservation_valid_until` among the probed unconsumed
    /// order messages (order-create only).
    pub oldest_valid_until_ms: Option<i64>,
    /// Probed unconsumed order messages whose validity ends within the horizon.
    pub expiring: u64,
    /// The lag (topic and `%RETRY%`) broker by broker.
    #[serde(default)]
    pub per_broker: Vec<crate::mq::BrokerLag>,
    /// The lag (topic and `%RETRY%`) queue by queue, for the daemon's own
    /// `mq_consumer_ready` (§11.1); too long for the CLI's JSON.
    #[serde(skip)]
    pub queues: Vec<crate::mq::QueueBacklog>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PendingSample {
    pub activity_id: ActivityId,
    pub count: u64,
    pub oldest_created_ms: Option<i64>,
    pub next_due_ms: Option<i64>,
    pub oldest_valid_until_ms: Option<i64>,
    /// Send attempts (scanner claims) → reservations.
    pub attempts: BTreeMap<u32, u64>,
    pub expiring: u64,
    /// Fewer entries were read than exist (see [`PENDING_SCAN_CAP`]).
    pub truncated: bool,
}

/// Server-side PostgreSQL activity; counters are cumulative. Read as one row
/// of `PG_SERVER`, column for field.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, sqlx::FromRow)]
pub struct PgServerSample {
    pub active: i64,
    pub idle_in_transaction: i64,
    pub lock_waiters: i64,
    /// Active backends waiting on WAL or data-file I/O.
    pub io_waiters: i64,
    pub longest_tx_s: f64,
    pub max_connections: i64,
    pub connections: i64,
    pub commits: i64,
    pub wal_bytes: f64,
    /// The server's `autovacuum` setting; `None` from an older sample.
    #[serde(default)]
    pub autovacuum: Option<bool>,
    /// Dead and live row versions of the tables every order rewrites
    /// ([`CHURN_TABLES`]), as the statistics collector counts them.
    #[serde(default)]
    pub churn_dead_rows: i64,
    #[serde(default)]
    pub churn_live_rows: i64,
}

/// The tables each order leaves dead row versions in: the outbox (claim and
/// SENT updates), the inbox, orders (pay, cancel) and reservations.
pub const CHURN_TABLES: [&str; 4] = ["event_outbox", "consumer_inbox", "orders", "reservations"];

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DlqSample {
    pub dead: u64,
    pub open_tickets: u64,
    pub oldest_dead_age_s: Option<f64>,
    /// Replay audit rows by outcome (`mq_dlq_replay_total{result}`).
    pub replays: BTreeMap<String, u64>,
}

/// What a sample reads from. A source that fails leaves its part of the
/// sample empty and says why in [`Sample::errors`]; the rest still counts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub enum Source {
    #[serde(rename = "postgresql")]
    Postgresql,
    #[serde(rename = "redis")]
    Redis,
    #[serde(rename = "rocketmq")]
    Rocketmq,
    #[serde(rename = "dlq")]
    Dlq,
    #[serde(rename = "engine")]
    Engine,
    #[serde(rename = "broker uptime")]
    BrokerUptime,
    /// The Redis epoch survey (docs/architecture.md §4.5): PostgreSQL and Redis.
    #[serde(rename = "redis state")]
    RedisState,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Postgresql => "postgresql",
            Source::Redis => "redis",
            Source::Rocketmq => "rocketmq",
            Source::Dlq => "dlq",
            Source::Engine => "engine",
            Source::BrokerUptime => "broker uptime",
            Source::RedisState => "redis state",
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why one source gave nothing this sample.
#[derive(Debug, thiserror::Error)]
pub enum SourceFailure {
    #[error("not connected (see the component's own error)")]
    NotConnected,
    #[error("did not answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Redis(#[from] crate::reservation::ReservationError),
    #[error(transparent)]
    Mq(#[from] crate::mq::rocket::MqError),
    #[error(transparent)]
    RedisState(#[from] crate::ops::redis_state::RedisStateError),
    #[error("{group}: {source}")]
    Group {
        group: String,
        source: crate::mq::rocket::MqError,
    },
}

/// A source's failure as the sample records it (plain data, so samples
/// serialize and compare).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SourceError {
    pub source: Source,
    pub error: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub at_ms: i64,
    pub groups: Vec<GroupSample>,
    pub pending: Vec<PendingSample>,
    pub pg: Option<PgServerSample>,
    pub dlq: Option<DlqSample>,
    /// The engines' own figures (`/v1/stats`), every daemon that answered
    /// as one ([`StatsView::merge`]).
    pub engine: Option<StatsView>,
    /// Each daemon asked, or known dead from the registry (§14.3), with
    /// the singletons it runs (§14.4).
    #[serde(default)]
    pub engines: Vec<engines::EngineSample>,
    pub broker_uptime_s: Option<f64>,
    /// Live activities whose Redis state is lost or stale (docs/architecture.md §4.5).
    #[serde(default)]
    pub redis_lost: Vec<crate::ops::redis_state::ActivityRedis>,
    /// Engine daemons live in the registry (docs/architecture.md §14.3):
    /// the instances sharing PostgreSQL's budget (§10.7).
    #[serde(default)]
    pub live_engines: Option<u32>,
    pub errors: Vec<SourceError>,
}

impl Sample {
    pub fn error(&self, source: Source) -> Option<&str> {
        self.errors
            .iter()
            .find(|e| e.source == source)
            .map(|e| e.error.as_str())
    }
}

/// Holds a connection to each source; a source that was down is retried
/// on the next sample.
pub struct Observer {
    cfg: Config,
    names: Names,
    rt: Arc<ClientRuntime>,
    pool: Option<PgPool>,
    store: Option<ReservationStore>,
    admin: Option<RocketAdmin>,
    http: reqwest::Client,
    /// Read the engine over HTTP (operator commands); the daemon fills
    /// [`Sample::engine`] itself.
    read_engine: bool,
    /// The daemon lends its pool: never close it from here.
    owns_pool: bool,
    head_probe: i32,
    /// Queues read per topic for the head messages (deepest first).
    head_queues: usize,
    /// The broker's uptime as last read, and when: its runtime stats are
    /// not cheap for the broker, and a boot time changes only on restart.
    uptime: Option<(std::time::Instant, Option<f64>)>,
}

impl Observer {
    pub fn new(cfg: &Config, rt: Arc<ClientRuntime>) -> Self {
        Self {
            names: Names::new(cfg.topic_prefix.clone()),
            cfg: cfg.clone(),
            rt,
            pool: None,
            store: None,
            admin: None,
            http: cfg.engine_http(),
            read_engine: true,
            owns_pool: true,
            head_probe: HEAD_PROBE,
            head_queues: usize::MAX,
            uptime: None,
        }
    }

    /// For the daemon: reuse its connections and skip the HTTP read.
    pub fn with_parts(
        cfg: &Config,
        rt: Arc<ClientRuntime>,
        pool: PgPool,
        store: ReservationStore,
        admin: RocketAdmin,
    ) -> Self {
        let mut o = Self::new(cfg, rt);
        o.pool = Some(pool);
        o.store = Some(store);
        o.admin = Some(admin);
        o.read_engine = false;
        o.owns_pool = false;
        // The governor needs only the oldest message per queue (its
        // `valid_until`); reading 32 per queue every second during a burst
        // costs the consumer throughput.
        o.head_probe = 1;
        // And from the 8 deepest queues only: 64 pulls a second measurably
        // slowed the order consumer on a 2-core box (the issue-6 note).
        o.head_queues = 8;
        o
    }

    pub fn names(&self) -> &Names {
        &self.names
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The PostgreSQL pool, once a sample has connected it.
    pub fn pool(&self) -> Option<&PgPool> {
        self.pool.as_ref()
    }

    async fn connect(&mut self, errors: &mut Vec<SourceError>) {
        let err = |source: Source, e: String| SourceError { source, error: e };
        if self.pool.is_none() {
            match db::connect_unchecked(&self.cfg).await {
                Ok(p) => self.pool = Some(p),
                Err(e) => errors.push(err(Source::Postgresql, e.to_string())),
            }
        }
        if self.store.is_none() {
            match redis_conn::connect(&self.cfg).await {
                Ok(c) => self.store = Some(ReservationStore::new(c, self.cfg.redis_prefix.clone())),
                Err(e) => errors.push(err(Source::Redis, e.to_string())),
            }
        }
        if self.admin.is_none() {
            match RocketAdmin::start(
                self.rt.clone(),
                &self.cfg.namesrv_addr,
                self.cfg.admin_timeout(),
            )
            .await
            {
                Ok(a) => self.admin = Some(a),
                Err(e) => errors.push(err(Source::Rocketmq, e.to_string())),
            }
        }
    }

    /// One sample of every source, each bounded by the admin timeout.
    pub async fn sample(&mut self) -> Sample {
        let mut errors = Vec::new();
        self.connect(&mut errors).await;
        let at_ms = now_ms();
        let horizon_ms = (self.cfg.alerts.expiry_horizon_s * 1000.0) as i64;
        let limit = self.cfg.admin_timeout();
        // The engines are read before the broker: their queue positions
        // are fresher than the broker's committed offsets, and read first
        // they can only be behind the truth the broker is then asked about
        // (§10.4). Redis, PostgreSQL and the rest go meanwhile.
        let (read, pending, pg, dlq, uptime, lost) = tokio::join!(
            async {
                let registry =
                    bounded(limit, registry(self.pool.as_ref(), &self.cfg.registry)).await;
                let asked = match self.read_engine {
                    true => {
                        let rows = registry.as_ref().ok().map(Vec::as_slice);
                        let plan = engines::plan(&self.cfg.engine_urls, rows, &self.cfg.engine_url);
                        engines::read(&self.http, plan).await
                    }
                    false => Vec::new(),
                };
                // Every answering daemon as one: its positions are the
                // furthest per queue.
                let engine = StatsView::merge(asked.iter().filter_map(|s| s.stats.as_ref()));
                let groups = bounded(
                    limit,
                    groups(
                        self.admin.as_ref(),
                        &self.names,
                        engine.as_ref(),
                        at_ms + horizon_ms,
                        self.head_probe,
                        self.head_queues,
                    ),
                )
                .await;
                (groups, (registry, asked, engine))
            },
            bounded(limit * 2, pending(self.store.as_ref(), at_ms + horizon_ms)),
            bounded(limit, pg_server(self.pool.as_ref())),
            bounded(limit, dlq(self.pool.as_ref())),
            bounded(limit, broker_uptime(self.admin.as_ref(), self.uptime)),
            bounded(limit, redis_lost(self.pool.as_ref(), self.store.as_ref())),
        );
        let (groups, registered) = read;
        let e = &mut errors;
        let groups = take(e, Source::Rocketmq, groups).unwrap_or_default();
        let pending = take(e, Source::Redis, pending).unwrap_or_default();
        let pg = take(e, Source::Postgresql, pg);
        let dlq = take(e, Source::Dlq, dlq);
        let (registry, engines, engine) = registered;
        let live_engines = take(e, Source::Postgresql, registry).map(|rows| live_count(&rows));
        // No engine answered at all: the engine figures are missing, and
        // that is the source's error. One daemon of several not answering
        // is a finding of its row, not an error of the sample.
        if engine.is_none()
            && let Some(why) = engines.iter().find_map(|s| s.error.clone())
        {
            e.push(SourceError {
                source: Source::Engine,
                error: why,
            });
        }
        let redis_lost = take(e, Source::RedisState, lost).unwrap_or_default();
        let broker_uptime_s = take(e, Source::BrokerUptime, uptime).and_then(|(fresh, u)| {
            if fresh {
                self.uptime = Some((std::time::Instant::now(), u));
            }
            u
        });
        Sample {
            at_ms,
            groups,
            pending,
            pg,
            dlq,
            engine,
            engines,
            broker_uptime_s,
            redis_lost,
            live_engines,
            errors,
        }
    }

    pub async fn shutdown(self) {
        if let Some(a) = self.admin {
            a.shutdown().await;
        }
        if let Some(p) = self.pool.filter(|_| self.owns_pool) {
            p.close().await;
        }
    }
}

fn take<T>(
    errors: &mut Vec<SourceError>,
    source: Source,
    r: Result<T, SourceFailure>,
) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push(SourceError {
                source,
                error: e.to_string(),
            });
            None
        }
    }
}

async fn bounded<T>(
    limit: Duration,
    fut: impl Future<Output = Result<T, SourceFailure>>,
) -> Result<T, SourceFailure> {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or(Err(SourceFailure::Timeout(limit)))
}

use SourceFailure::NotConnected as DOWN;

/// Lag of every seckill group, with its `%RETRY%` topic.
async fn groups(
    admin: Option<&RocketAdmin>,
    names: &Names,
    // The merged engines' view: where their consumers have got to (§10.4).
    engines: Option<&StatsView>,
    expiring_before_ms: i64,
    head_probe: i32,
    head_queues: usize,
) -> Result<Vec<GroupSample>, SourceFailure> {
    let admin = admin.ok_or(DOWN)?;
    let mut out = Vec::new();
    for kind in TopicKind::ALL {
        let (topic, group) = (names.topic(kind), names.group(kind));
        let probe = if kind == TopicKind::OrderCreate {
            head_probe
        } else {
            1
        };
        let main = admin
            .lag_detail_with(
                &topic,
                &group,
                probe,
                head_queues,
                &positions_of(engines, &group, &topic),
            )
            .await
            .map_err(|source| SourceFailure::Group {
                group: group.clone(),
                source,
            })?;
        // `%RETRY%<group>` exists only once something was retried; its
        // absence is the common case, and the main topic's lag stands.
        let retry_topic = crate::mq::topics::retry_topic(&group);
        let retry = admin
            .lag_detail_with(
                &retry_topic,
                &group,
                1,
                head_queues,
                &positions_of(engines, &group, &retry_topic),
            )
            .await
            .unwrap_or_default();
        let valid_untils: Vec<i64> = if kind == TopicKind::OrderCreate {
            main.heads
                .iter()
                .chain(&retry.heads)
                .filter_map(|m| parse_order_create(&m.body).ok())
                .map(|m| m.reservation_valid_until.timestamp_millis())
                .collect()
        } else {
            Vec::new()
        };
        let mut per_broker = main.per_broker.clone();
        for b in &retry.per_broker {
            crate::mq::merge_broker_lag(&mut per_broker, b);
        }
        out.push(GroupSample {
            per_broker,
            queues: main.queues.into_iter().chain(retry.queues).collect(),
            group,
            topic,
            lag_messages: main.messages + retry.messages,
            lag_seconds: main.seconds.max(retry.seconds),
            retry_lag_messages: retry.messages,
            retry_lag_seconds: retry.seconds,
            broker_offsets: main.broker_offsets + retry.broker_offsets,
            consumer_offsets: main.consumer_offsets + retry.consumer_offsets,
            oldest_valid_until_ms: valid_untils.iter().copied().min(),
            expiring: valid_untils
                .iter()
                .filter(|v| **v <= expiring_before_ms)
                .count() as u64,
        });
    }
    Ok(out)
}

async fn pending(
    store: Option<&ReservationStore>,
    expiring_before_ms: i64,
) -> Result<Vec<PendingSample>, SourceFailure> {
    let store = store.ok_or(DOWN)?;
    let mut out = Vec::new();
    for activity in store.activities().await? {
        let count = store.pending_count(activity).await?;
        let entries = store.pending_entries(activity, PENDING_SCAN_CAP).await?;
        let mut attempts = BTreeMap::new();
        for e in &entries {
            *attempts.entry(e.send_attempt).or_insert(0) += 1;
        }
        out.push(PendingSample {
            activity_id: activity,
            count,
            oldest_created_ms: entries.iter().map(|e| e.created_at_ms).min(),
            next_due_ms: entries.iter().map(|e| e.next_retry_at_ms).min(),
            oldest_valid_until_ms: entries.iter().map(|e| e.valid_until_ms).min(),
            attempts,
            expiring: entries
                .iter()
                .filter(|e| e.valid_until_ms <= expiring_before_ms)
                .count() as u64,
            truncated: (entries.len() as u64) < count,
        });
    }
    Ok(out)
}

/// This database's backends (the engine's and its neighbours'); WAL is
/// server-wide by nature.
const PG_SERVER: &str = r#"
SELECT
  count(*) FILTER (WHERE state = 'active' AND pid <> pg_backend_pid()) AS active,
  count(*) FILTER (WHERE state LIKE 'idle in transaction%') AS idle_in_transaction,
  count(*) FILTER (WHERE wait_event_type = 'Lock') AS lock_waiters,
  count(*) FILTER (WHERE state = 'active' AND (wait_event_type = 'IO' OR wait_event LIKE 'WAL%')) AS io_waiters,
  COALESCE(EXTRACT(EPOCH FROM max(clock_timestamp() - xact_start)
           FILTER (WHERE pid <> pg_backend_pid())), 0)::float8 AS longest_tx_s,
  current_setting('max_connections')::bigint AS max_connections,
  count(*) AS connections,
  COALESCE((SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), 0)::bigint AS commits,
  pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8 AS wal_bytes,
  current_setting('autovacuum') = 'on' AS autovacuum,
  (SELECT COALESCE(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname = ANY($1))::bigint AS churn_dead_rows,
  (SELECT COALESCE(sum(n_live_tup), 0) FROM pg_stat_user_tables WHERE relname = ANY($1))::bigint AS churn_live_rows
FROM pg_stat_activity
WHERE backend_type = 'client backend' AND datname = current_database()
"#;

async fn pg_server(pool: Option<&PgPool>) -> Result<PgServerSample, SourceFailure> {
    let pool = pool.ok_or(DOWN)?;
    Ok(sqlx::query_as(PG_SERVER)
        .bind(CHURN_TABLES)
        .fetch_one(pool)
        .await?)
}

async fn redis_lost(
    pool: Option<&PgPool>,
    store: Option<&ReservationStore>,
) -> Result<Vec<crate::ops::redis_state::ActivityRedis>, SourceFailure> {
    let (pool, store) = (pool.ok_or(DOWN)?, store.ok_or(DOWN)?);
    let rows = crate::ops::redis_state::survey(pool, store).await?;
    Ok(rows.into_iter().filter(|r| r.state.refuses()).collect())
}

/// The registry's daemons heard from within [`DEAD_SHOWN`], each with the
/// singletons it holds.
async fn registry(
    pool: Option<&PgPool>,
    cfg: &crate::config::RegistryConfig,
) -> Result<Vec<crate::ops::engines::EngineView>, SourceFailure> {
    let pool = pool.ok_or(DOWN)?;
    let window = chrono::Duration::from_std(DEAD_SHOWN).unwrap_or(chrono::Duration::MAX);
    Ok(crate::ops::engines::list(pool, cfg, window).await?)
}

/// How long a dead daemon stays in the console's samples: long enough to
/// read during an incident, short enough that last week's restarts are gone.
pub const DEAD_SHOWN: Duration = Duration::from_secs(600);

/// The engines' queue positions of (group, topic) (docs/architecture.md
/// §10.4); none without an engine.
fn positions_of(
    engines: Option<&StatsView>,
    group: &str,
    topic: &str,
) -> BTreeMap<(String, i32), i64> {
    engines.map_or_else(BTreeMap::new, |e| e.positions_of(group, topic))
}

fn live_count(rows: &[crate::ops::engines::EngineView]) -> u32 {
    let live = rows
        .iter()
        .filter(|e| e.state == crate::decide::liveness::EngineState::Live)
        .count();
    u32::try_from(live).unwrap_or(u32::MAX)
}

async fn dlq(pool: Option<&PgPool>) -> Result<DlqSample, SourceFailure> {
    let pool = pool.ok_or(DOWN)?;
    let (dead, oldest): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), EXTRACT(EPOCH FROM now() - min(dead_at))::float8
           FROM dlq_messages WHERE status = 'DEAD'",
    )
    .fetch_one(pool)
    .await?;
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM dlq_tickets WHERE status <> 'CLOSED'")
        .fetch_one(pool)
        .await?;
    let replays: Vec<(String, i64)> =
        sqlx::query_as("SELECT outcome::text, count(*) FROM replay_audit GROUP BY 1")
            .fetch_all(pool)
            .await?;
    Ok(DlqSample {
        dead: dead as u64,
        open_tickets: open as u64,
        oldest_dead_age_s: oldest,
        replays: replays.into_iter().map(|(k, v)| (k, v as u64)).collect(),
    })
}

/// Re-read every minute; in between, the cached uptime plus the time since.
const UPTIME_REFRESH: Duration = Duration::from_secs(60);

/// The youngest broker's uptime, and whether it was read now (to cache).
async fn broker_uptime(
    admin: Option<&RocketAdmin>,
    cached: Option<(std::time::Instant, Option<f64>)>,
) -> Result<(bool, Option<f64>), SourceFailure> {
    if let Some((at, u)) = cached
        && at.elapsed() < UPTIME_REFRESH
    {
        return Ok((false, u.map(|u| u + at.elapsed().as_secs_f64())));
    }
    let admin = admin.ok_or(DOWN)?;
    let brokers = admin.brokers().await?;
    let mut youngest: Option<f64> = None;
    for b in brokers {
        if let Some(u) = admin.broker_uptime_s(&b.addr).await? {
            youngest = Some(youngest.map_or(u, |y: f64| y.min(u)));
        }
    }
    Ok((true, youngest))
}
