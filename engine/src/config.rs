//! Engine configuration: one plain struct, parsed once by the binary (defaults,
//! then `seckill.toml`, then environment, then flags) and handed in. The engine
//! never reads the environment itself.
//!
//! Connection URLs may carry passwords, so they are [`SecretString`]s: `Debug`
//! prints `[REDACTED]` and nothing logs them (use [`redact_url`] for display).

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub database_url: SecretString,
    pub redis_url: SecretString,
    pub namesrv_addr: String,
    /// Prefix for every topic and consumer group, so environments and tests
    /// never share broker state (docs/architecture.md §3).
    pub topic_prefix: String,
    /// First part of every Redis key (`<prefix>:{<activity>}:...`, docs/architecture.md §4),
    /// so environments and tests never share keys.
    pub redis_prefix: String,
    /// Where operator commands find a running engine's `/v1/stats` (engine-
    /// side figures: in-flight, pool wait, transaction latency, send outcomes)
    /// and its operator API, when the registry names no live engine.
    pub engine_url: String,
    /// The engines the console reads, when given (`--engine-url A,B`);
    /// empty: every live engine of the registry (docs/architecture.md §14.3).
    pub engine_urls: Vec<String>,
    pub pg: PgConfig,
    pub mq: MqConfig,
    pub publisher: PublisherConfig,
    pub scanner: ScannerConfig,
    pub consumer: ConsumerConfig,
    pub outbox: OutboxConfig,
    pub lifecycle: LifecycleConfig,
    pub dlq: DlqConfig,
    pub retention: RetentionConfig,
    /// docs/architecture.md §11.2 thresholds.
    pub alerts: crate::decide::alerts::AlertConfig,
    pub governor: GovernorConfig,
    pub redis: RedisConfig,
    pub auth: AuthConfig,
    pub http: HttpConfig,
    pub registry: RegistryConfig,
    pub log: LogConfig,
}

/// How the binaries write their logs (docs/architecture.md §11.3).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    /// Where the daemon sends its spans over OTLP/HTTP, e.g.
    /// `http://127.0.0.1:4318` (a bare address means its `/v1/traces`);
    /// none by default (docs/architecture.md §11.5). The binary needs its
    /// `otlp` feature, on by default.
    pub otlp_endpoint: Option<String>,
}

/// `auto`: the daemon logs JSON when its stdout is not a terminal (a
/// service manager, a pipe, a file), people at a terminal get text; the
/// CLI's commands always write text to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Auto,
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(LogFormat::Auto),
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "log format {other:?} is not one of auto, text, json"
            )),
        }
    }
}

/// The engine registry (docs/architecture.md §14.3): how often a daemon
/// says it is alive, and how long a silent one counts as live.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    pub heartbeat_ms: u64,
    /// Past this without a heartbeat a daemon is dead: a few beats, so one
    /// slow beat under load does not make it so.
    pub dead_after_ms: u64,
    /// An elected singleton's lease (docs/architecture.md §14.4), renewed
    /// every `heartbeat_ms`: a killed holder's roles go to another daemon
    /// within about this long.
    pub lease_ttl_ms: u64,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            heartbeat_ms: 1_000,
            dead_after_ms: 5_000,
            lease_ttl_ms: 5_000,
        }
    }
}

/// The daemon's HTTP limits (docs/architecture.md §13.2, "Limits"): what
/// one request may bring and hold, so a hostile or broken client costs a
/// bounded amount of memory and time.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// A body past this is refused with 413 before it is read whole.
    pub max_body_bytes: usize,
    /// The request line and headers together; past this, 431.
    pub max_header_bytes: usize,
    /// How long an API request may take before it is answered 503
    /// `TIMED_OUT`. The operator API's waits (a replay's verify, a
    /// restore's drain) have their own cap, `MAX_VERIFY_MS` plus a minute.
    pub request_timeout_ms: u64,
    /// Requests in flight at once on the API address; one more is answered
    /// 503 `OVERLOADED` with `Retry-After` at once, never queued. The
    /// probes and `/metrics` are not counted.
    pub max_concurrent: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 * 1024,
            max_header_bytes: 16 * 1024,
            request_timeout_ms: 10_000,
            max_concurrent: 2_048,
        }
    }
}

/// Who may reach the daemon, and how the CLI and TUI present themselves
/// (docs/security.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// `token` (the default): every route but `/healthz`, `/readyz` and
    /// `/metrics` needs a bearer token. `open`: nobody is asked, for local
    /// experiments only; `health` warns.
    pub mode: AuthMode,
    /// Where the CLI and the TUI read their token when `SECKILL_TOKEN` is
    /// unset. The file holds the token alone.
    pub token_file: Option<std::path::PathBuf>,
    /// Refuse every mutation from this CLI (`--readonly` too), as the
    /// TUI's read-only mode does.
    pub readonly: bool,
    /// How often a daemon re-reads `api_tokens`: a revoked token stops
    /// working within this.
    pub refresh_ms: u64,
    /// The token itself, from `SECKILL_TOKEN` or `token_file`; filled by
    /// the binary, never read from or shown as configuration.
    #[serde(skip)]
    pub token: Option<SecretString>,
    /// `--direct`: this one command's mutations go over the database URL
    /// (the audited break glass) instead of the engine's operator API. A
    /// flag only: never a standing setting.
    #[serde(skip)]
    pub direct: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    #[default]
    Token,
    Open,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            mode: AuthMode::Token,
            token_file: None,
            readonly: false,
            refresh_ms: 2_000,
            token: None,
            direct: false,
        }
    }
}

/// What is expected of the Redis in use.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `health` warns when Redis keeps nothing across a restart
    /// (docs/architecture.md §4.5). Off by default: the loopback Redis of a
    /// development machine often runs without persistence on purpose.
    pub expect_persistence: bool,
    /// Replicas that must hold a reservation before it is answered (Redis
    /// `WAIT`, docs/architecture.md §4.6): with replicas, 1 keeps a
    /// failover from losing an answered reservation. 0 (the default, for
    /// one server without replicas) does not wait.
    pub wait_replicas: u32,
    /// How long a reservation waits for them; past it, it is answered
    /// anyway and counted (a replica is down, so no failover is coming).
    pub wait_timeout_ms: u64,
    /// Connections of their own that the waiting writes take turns on: a
    /// `WAIT` holds up everything queued behind it on its connection.
    pub wait_lanes: u32,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            expect_persistence: false,
            wait_replicas: 0,
            wait_timeout_ms: 100,
            wait_lanes: 8,
        }
    }
}

/// The daemon's backlog governor (docs/architecture.md §10): how often it samples
/// lag, pending and the pool, for `/metrics`, admission control and the
/// adaptive consumer concurrency.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GovernorConfig {
    pub interval_ms: u64,
    /// Refuse new reservations on the docs/architecture.md §10.8 last row.
    pub admission_control: bool,
    /// Clear ticks in a row before a tripped gate opens again.
    pub recover_after_ticks: u32,
    /// Adapt the order consumer's concurrency inside its budget.
    pub adaptive_concurrency: bool,
    /// docs/architecture.md §10.7 inputs: order transactions PostgreSQL sustains (a load
    /// test figure; default: the pool size) and the engine instances sharing it
    /// (the registry's live count when it has one, §14.3; this is the fallback).
    pub safe_pg_concurrency: Option<u32>,
    pub instances: u32,
}

impl Default for GovernorConfig {
    fn default() -> Self {
        Self {
            interval_ms: 1_000,
            admission_control: true,
            recover_after_ticks: 3,
            adaptive_concurrency: true,
            safe_pg_concurrency: None,
            instances: 1,
        }
    }
}

/// The DLQ governor (docs/architecture.md §9).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DlqConfig {
    /// How often every `%DLQ%<group>` is mirrored into `dlq_messages`.
    pub mirror_interval_ms: u64,
    /// Where to POST each new ticket (JSON, `Idempotency-Key: <ticket_id>`).
    pub webhook_url: Option<String>,
    /// How long the broker keeps a dead message (its `fileReservedTime`,
    /// 72 h by default): past it, the mirror is the only copy left, and the
    /// replay pre-checks say so (docs/architecture.md §9.3).
    pub broker_retention_hours: u64,
    /// Owner routing: error class → team (`[dlq.owners] DB_TIMEOUT =
    /// "dba"`). A new ticket of that class is owned by the team at once,
    /// and the webhook tells its tracker so (docs/architecture.md §9.2).
    pub owners: std::collections::BTreeMap<String, String>,
}

impl DlqConfig {
    pub fn broker_retention(&self) -> Duration {
        Duration::from_secs(self.broker_retention_hours.saturating_mul(3600))
    }
}

impl Default for DlqConfig {
    fn default() -> Self {
        Self {
            mirror_interval_ms: 2_000,
            webhook_url: None,
            broker_retention_hours: 72,
            owners: Default::default(),
        }
    }
}

/// The automatic prune of the finished history (docs/architecture.md
/// §16.2): the daemon holding the sweeps lease runs `db prune` over every
/// table every `every_hours`, keeping `keep_hours`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// How often a run is due, counted from the last run that finished.
    pub every_hours: u64,
    /// How much history a run keeps: never less than `[dlq]
    /// broker_retention_hours`, or an inbox row could go while the broker
    /// can still redeliver its message.
    pub keep_hours: u64,
}

impl RetentionConfig {
    pub fn every(&self) -> Duration {
        Duration::from_secs(self.every_hours.saturating_mul(3600))
    }

    pub fn keep(&self) -> Duration {
        Duration::from_secs(self.keep_hours.saturating_mul(3600))
    }

    /// The section against the floor (`[dlq] broker_retention_hours`),
    /// with the fix named.
    pub fn validate(&self, dlq: &DlqConfig) -> Result<(), RetentionConfigError> {
        crate::decide::retention::check_schedule(self.every(), self.keep(), dlq.broker_retention())
            .map_err(|why| RetentionConfigError {
                every_hours: self.every_hours,
                keep_hours: self.keep_hours,
                why,
            })
    }
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            every_hours: 24,
            keep_hours: 14 * 24,
        }
    }
}

/// A `[retention]` section refused by [`RetentionConfig::validate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("[retention] every_hours = {every_hours}, keep_hours = {keep_hours}: {why}")]
pub struct RetentionConfigError {
    pub every_hours: u64,
    pub keep_hours: u64,
    pub why: crate::decide::retention::Refusal,
}

/// The outbox publisher (docs/architecture.md §8): claims due `event_outbox` rows and
/// sends them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxConfig {
    /// Rows claimed per pass.
    pub batch_max: i64,
    /// Pause between passes when nothing was due.
    pub poll_ms: u64,
    /// A claim's lease: if this instance dies mid-send, another one re-sends
    /// the row (with the same `message_id`) once the lease lapses.
    pub lease_ms: u64,
    /// Delayed (timer) sends in flight at once; they cannot be batched.
    pub in_flight: usize,
    /// A timer message is asked for this long before its `deliver_at`, and
    /// its consumer holds it until then: the broker's timer delivers up to
    /// ~1.4 s late and the consumer's pull adds ~1 s, so a message asked for
    /// its deadline cancelled 2.5 s after it (docs/architecture.md §8.2).
    pub timer_lead_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
    /// Deadline for one outbox send. Off the request path, so looser than
    /// `[mq] send_timeout_ms`: an UNKNOWN here costs one more pass of the
    /// row, sent again with its `message_id` (docs/architecture.md §6.1, §8).
    /// Shorter than `lease_ms`, or a send could outlive its claim.
    pub send_timeout_ms: u64,
    /// While the order consumer is creating orders, the outbox holds back
    /// for up to this long, then drains everything due before it may hold
    /// back again (docs/architecture.md §10.5 item 4: non-core work yields to the order
    /// path). Its events, and the projection and cancel work they feed,
    /// compete for the same cores and PostgreSQL during a burst. 0 never
    /// holds back.
    pub yield_to_orders_ms: u64,
}

/// The after-order consumers and their safety-net sweeps (docs/architecture.md §8).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LifecycleConfig {
    /// Listener threads of each of the compensation and projection
    /// consumers. They share the pool with the order consumer.
    pub consumer_threads: u32,
    /// Listener threads of the cancel consumer. A sale's deadlines come
    /// in a burst (every order of a 5 s crowd is due within 5 s, paid ones
    /// included, as no-ops), and a thread also waits out the lead a timer
    /// message arrives with (docs/architecture.md §8.2).
    pub cancel_threads: u32,
    /// How often the sweeps look for overdue work.
    pub sweep_interval_ms: u64,
    /// How far past `expires_at` an unpaid order must be before the sweep
    /// cancels it itself: the safety net behind the timer message
    /// (docs/architecture.md §8.2), for a message lost or a broker down.
    pub cancel_grace_ms: u64,
    /// How old a PENDING compensation task must be before the sweep
    /// releases it itself (a lost release message or a crash mid-way).
    pub compensation_grace_ms: u64,
}

/// The micro-batching publisher (docs/architecture.md §6).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PublisherConfig {
    /// Reservations per batch request; 1 sends each on its own.
    pub batch_max: usize,
    /// How long the first reservation of a batch waits for company.
    pub linger_ms: u64,
    /// Batch requests in flight at once.
    pub in_flight: usize,
    /// Reservations waiting for a batch; past this, ingress sheds load.
    pub queue_capacity: usize,
}

/// The pending-reservation scanner (docs/architecture.md §6.5).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScannerConfig {
    pub interval_ms: u64,
    /// Reservations claimed per pass, per activity.
    pub batch: usize,
    /// A claim's lease: another instance may take over once it expires.
    pub lease_ms: u64,
    /// Before the scanner first looks at a new reservation: the in-process
    /// send normally confirms well inside this.
    pub first_retry_after_ms: u64,
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
}

/// The order-create consumer (docs/architecture.md §7).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumerConfig {
    /// Messages per listener call and per PostgreSQL transaction; 1 is supported.
    pub batch_max: u32,
    /// Listener threads wanted; the PostgreSQL budget caps them (docs/architecture.md §10).
    pub threads: u32,
    /// Share of the pool the order consumer may hold (docs/architecture.md §10.7's order
    /// share); the rest stays for ingress, scanner and operators.
    pub pg_share: f64,
}

impl Config {
    /// The order consumer's concurrency: `threads`, never above the budget
    /// `floor(pg.max_connections × consumer.pg_share)`, and at least 1.
    /// Each listener thread holds one connection for its transaction, so
    /// more threads than this would only queue on the pool (docs/architecture.md §7).
    pub fn consumer_threads(&self) -> u32 {
        let budget = (self.pg.max_connections as f64 * self.consumer.pg_share.clamp(0.0, 1.0))
            .floor() as u32;
        self.consumer.threads.min(budget).max(1)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PgConfig {
    pub max_connections: u32,
    pub acquire_timeout_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqConfig {
    /// Deadline for one bounded send on the order path (the publisher and
    /// the scanner), across the client's own attempts (docs/architecture.md
    /// §6.1). The outbox has its own, `[outbox] send_timeout_ms`.
    pub send_timeout_ms: u64,
    pub send_retries: u32,
    /// Consumer retries before the broker moves a message to `%DLQ%<group>`.
    pub max_reconsume_times: i32,
    /// Deadline for admin and health calls, so a dead broker is reported, not waited on.
    pub admin_timeout_ms: u64,
    /// The send circuit in front of the broker (docs/architecture.md §6.7).
    pub circuit: crate::decide::circuit::CircuitPolicy,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            database_url: SecretString::from("postgres://postgres@127.0.0.1:5432/seckill"),
            redis_url: SecretString::from("redis://127.0.0.1:6379/"),
            namesrv_addr: "127.0.0.1:9876".to_owned(),
            topic_prefix: String::new(),
            redis_prefix: "seckill".to_owned(),
            engine_url: "http://127.0.0.1:8080".to_owned(),
            engine_urls: Vec::new(),
            pg: PgConfig::default(),
            mq: MqConfig::default(),
            publisher: PublisherConfig::default(),
            scanner: ScannerConfig::default(),
            consumer: ConsumerConfig::default(),
            outbox: OutboxConfig::default(),
            lifecycle: LifecycleConfig::default(),
            dlq: DlqConfig::default(),
            retention: RetentionConfig::default(),
            alerts: crate::decide::alerts::AlertConfig::default(),
            governor: GovernorConfig::default(),
            redis: RedisConfig::default(),
            auth: AuthConfig::default(),
            http: HttpConfig::default(),
            registry: RegistryConfig::default(),
            log: LogConfig::default(),
        }
    }
}

impl Default for PgConfig {
    fn default() -> Self {
        Self {
            max_connections: 16,
            acquire_timeout_ms: 3_000,
        }
    }
}

impl Default for MqConfig {
    fn default() -> Self {
        Self {
            // Looser than the design's 20-40 ms, which the 2-core reference
            // box cannot hold: the smallest value that kept UNKNOWN sends
            // under 0.1 % in every burst of the sweep (docs/architecture.md
            // §6.1, tests/bench/send_timeout.sh).
            send_timeout_ms: 300,
            send_retries: 2,
            max_reconsume_times: 3,
            admin_timeout_ms: 3_000,
            circuit: crate::decide::circuit::CircuitPolicy::default(),
        }
    }
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            batch_max: 32,
            linger_ms: 2,
            in_flight: 8,
            queue_capacity: 50_000,
        }
    }
}

impl Default for ScannerConfig {
    fn default() -> Self {
        Self {
            interval_ms: 200,
            batch: 256,
            lease_ms: 10_000,
            first_retry_after_ms: 5_000,
            backoff_base_ms: 500,
            backoff_max_ms: 30_000,
        }
    }
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            batch_max: 32,
            threads: 4,
            pg_share: 0.5,
        }
    }
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            batch_max: 128,
            poll_ms: 100,
            lease_ms: 15_000,
            in_flight: 16,
            timer_lead_ms: 1_500,
            backoff_base_ms: 500,
            backoff_max_ms: 30_000,
            send_timeout_ms: 3_000,
            yield_to_orders_ms: 5_000,
        }
    }
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        Self {
            consumer_threads: 2,
            cancel_threads: 6,
            sweep_interval_ms: 2_000,
            cancel_grace_ms: 10_000,
            compensation_grace_ms: 60_000,
        }
    }
}

impl Config {
    pub fn admin_timeout(&self) -> Duration {
        Duration::from_millis(self.mq.admin_timeout_ms)
    }

    /// An HTTP client for a running engine (`engine_url`): the admin
    /// timeout, and the configured token on every request, its header
    /// marked sensitive so no debug print shows it.
    pub fn engine_http(&self) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &self.auth.token
            && let Ok(mut v) =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.expose_secret()))
        {
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
        reqwest::Client::builder()
            .timeout(self.admin_timeout())
            .default_headers(headers)
            .build()
            .unwrap_or_default()
    }

    /// The database URL without its password, for messages and `config show`.
    pub fn database_url_redacted(&self) -> String {
        redact_url(self.database_url.expose_secret())
    }

    /// Every node's password hidden, for one URL or a cluster's list.
    pub fn redis_url_redacted(&self) -> String {
        redact_urls(self.redis_url.expose_secret())
    }
}

/// [`redact_url`] for each of a comma-separated list (a Redis Cluster's
/// seed nodes, each with its own credentials).
pub fn redact_urls(urls: &str) -> String {
    urls.split(',')
        .map(|url| redact_url(url.trim()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Replaces the password in `scheme://user:password@host/...` with `***`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{tail}")
            } else {
                format!("{scheme}://{user}@{host}{tail}")
            }
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/seckill"),
            "postgres://app:***@db:5432/seckill"
        );
        assert_eq!(
            redact_url("redis://:pw@127.0.0.1:6379/"),
            "redis://:***@127.0.0.1:6379/"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1/x"),
            "postgres://postgres@127.0.0.1/x"
        );
        assert_eq!(redact_url("127.0.0.1:9876"), "127.0.0.1:9876");
    }

    #[test]
    fn consumer_threads_stay_within_the_pg_budget() {
        let mut cfg = Config::default();
        cfg.pg.max_connections = 16;
        cfg.consumer.threads = 4;
        assert_eq!(cfg.consumer_threads(), 4);
        cfg.consumer.threads = 64;
        assert_eq!(cfg.consumer_threads(), 8, "16 connections x 0.5");
        cfg.consumer.pg_share = 0.0;
        assert_eq!(cfg.consumer_threads(), 1, "never zero");
        cfg.consumer.pg_share = 7.0;
        assert_eq!(cfg.consumer_threads(), 16, "share is clamped to the pool");
    }

    #[test]
    fn retention_defaults_pass_and_the_floor_is_refused() {
        let cfg = Config::default();
        assert_eq!(cfg.retention.keep_hours, 336);
        assert_eq!(cfg.retention.every_hours, 24);
        assert_eq!(cfg.retention.validate(&cfg.dlq), Ok(()));
        let below = RetentionConfig {
            keep_hours: 48,
            ..RetentionConfig::default()
        };
        let e = below.validate(&cfg.dlq).unwrap_err().to_string();
        assert!(e.contains("keep_hours = 48"), "{e}");
        assert!(e.contains("floor of 72 h"), "{e}");
        // The floor follows the broker's retention.
        let dlq = DlqConfig {
            broker_retention_hours: 24,
            ..DlqConfig::default()
        };
        assert_eq!(below.validate(&dlq), Ok(()));
        let never = RetentionConfig {
            every_hours: 0,
            ..RetentionConfig::default()
        };
        assert!(never.validate(&cfg.dlq).is_err());
    }

    #[test]
    fn debug_never_shows_secrets() {
        let cfg = Config {
            database_url: SecretString::from("postgres://app:hunter2@db/seckill"),
            redis_url: SecretString::from("redis://:hunter3@r/"),
            ..Config::default()
        };
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("hunter3"), "{shown}");
    }
}
