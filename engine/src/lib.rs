//! `seckill-engine`: the headless flash-sale pipeline. Redis reserves stock,
//! RocketMQ absorbs the burst, PostgreSQL creates the orders. The design, its
//! failure windows and its invariants are in `docs/architecture.md`; this
//! page is the map of the code.
//!
//! # Layout
//!
//! Each folder is one kind of thing, and imports run one way, from the top
//! of this list to the bottom (docs/architecture.md §15.1; the
//! `engine/tests/layout.rs` test fails on a cycle):
//!
//! | layer | folder | what lives there |
//! |---|---|---|
//! | surface | `daemon/` | `seckillctl engine run`: every component started and stopped in one place; HTTP (`api` bodies, `http` handlers, the `auth` token gate, the `ops` operator API, `limits` and `body` for what a request may bring), `/metrics`, the governor's tick |
//! | operations | `dlq/` | the mirror of `%DLQ%` groups, the entry state machine and its verifier, tickets, the webhook, guarded replay, rehearsal, discard |
//! | | `ops/` | activities, the reconcile of the invariants, pipeline facts, reservation status, Redis state survey and restore, the quarantine, the prune of the finished history (retention) |
//! | | `observe/` | samples of every component, the history and pure views the CLI, TUI and governor share, health probes |
//! | stages | `pipeline/` | ingress, publish, scan, consume, outbox, order, lifecycle consumers, adaptive concurrency |
//! | adapters | `reservation/` | the Redis Lua scripts, the reservation store, the epoch and restore of an activity's Redis state |
//! | | `mq/` | the message-queue boundary and its rocketmq-rust implementation |
//! | | `store/` | the PostgreSQL pool (migrations, schema guard), the Redis connection, the tokens and the operator audit log |
//! | setup | `config.rs`, `runtime.rs` | layered configuration; the process's one runtime |
//! | vocabulary | `domain/` | ids, statuses, message bodies, counters and the stats view, the clock |
//! | | `decide/` | pure decisions: backlog, scale, alerts, admission, the send circuit, stalls, Redis state, replica acknowledgements, retention's floor and schedule |
//!
//! # The face
//!
//! Everything the CLI, the TUI and the tests use is re-exported here, and
//! they import from this root only: types by name, and the modules whose
//! functions read best qualified (`reconcile::run`, `tickets::list_tickets`) as
//! namespaces. The folders themselves are private.
//!
//! This crate never depends on a UI crate (clap, ratatui, crossterm,
//! comfy-table): `cargo tree -p seckill-engine` proves it.

// The rocketmq client's types nest deeply: proving a task that owns a push
// consumer `Send` (daemon/restart.rs) needs more than the default 128.
#![recursion_limit = "256"]

mod config;
mod daemon;
mod decide;
mod dlq;
mod domain;
mod mq;
mod observe;
mod ops;
mod pipeline;
mod reservation;
pub mod runtime;
mod store;

// Configuration and the daemon.
pub use config::{
    AuthConfig, AuthMode, Config, ConsumerConfig, DlqConfig, GovernorConfig, HttpConfig,
    LifecycleConfig, LogConfig, LogFormat, MqConfig, OutboxConfig, PgConfig, PublisherConfig,
    RegistryConfig, ScannerConfig, redact_url,
};
pub use daemon::api::{
    ActivityBody, ApiError, CancelBody, DiscardBody, EndBody, MAX_VERIFY_MS, OpError, OpReply,
    PayBody, PayView, QuarantineDiscardBody, Queued, RehearseBody, ReplayBody, ReserveBody,
    RestoreBody, StatusView, TicketBody, TicketReplayBody, post_op, post_op_within,
};
pub use daemon::metrics::METRIC_NAMES;
pub use daemon::{DaemonError, Listeners, run as run_daemon};
pub use runtime::ClientRuntime;

// Who may do what, and the record of what they did (docs/security.md).
pub use domain::auth::{self, Actor, Need, Role, Via};
pub use store::audit::{self, AuditId, AuditRow};
pub use store::tokens::{self, TokenError, TokenRow};

// The vocabulary: every id newtype, every status enum, the message bodies.
pub use domain::ids::*;
pub use domain::message;
pub use domain::singleton::Singleton;
pub use domain::stats::{
    ConsumeView, GovernorView, LifecycleStats, LifecycleView, Percentiles, PoolView, ResendView,
    StatsView,
};
pub use domain::status::{self, *};
pub use domain::trace::{TraceId, parse_traceparent};

// Pure decisions.
pub use decide::alerts::{self, Alert, AlertConfig, AlertInputs, AlertState, Ratio};
pub use decide::backlog::{self, Drain, Level};
pub use decide::liveness::{DeadBecause, EngineState, RoleState};
pub use decide::redis_state::RedisState;
pub use decide::replica_ack::AckState;
pub use decide::scale::{self, Advice, PoolFit, ScaleInputs};
pub use decide::story::StoryVerdict;

// Adapters.
pub use mq::rocket::{MqError, QueueOffsets, RocketAdmin, RocketConsumer, RocketProducer};
pub use mq::topics::{dlq_topic, retry_topic};
pub use mq::{
    BrokerLag, ConsumeVerdict, ConsumerSpec, DefiniteCause, Handler, IncomingMessage, Names,
    OutgoingMessage, PROP_MESSAGE_ID, Producer, SendOutcome, SendReceipt, Sender, StartFrom,
    TopicKind, TopicSpec, TopicType, UnknownCause, setup as setup_mq,
};
pub use reservation::{
    MqStatus, ReleaseOutcome, ReplicaWait, Reservation, ReservationError, ReservationStore,
    ReserveOutcome, ReserveRequest, RetireOutcome, Sale, SeedOutcome,
};
pub use store::db::{self, DbError, MigrationRow, MigrationState};
pub use store::redis::{self as redis_conn, RedisConn, RedisError};

// Pipeline stages.
pub use pipeline::consume::{self, OrderConsumer};
pub use pipeline::lifecycle::{self, CancelConsumer, CompensationConsumer, ProjectionConsumer};
pub use pipeline::order::{self, CancelMode, CancelOutcome, OrderRow, PayOutcome};
pub use pipeline::{outbox, publish};

// Operations.
pub use dlq::discard::{DiscardError, DiscardReport, DiscardRequest, discard};
pub use dlq::entry::{self as dlq_entry, EntryMove, EntryRefusal, MoveFacts};
pub use dlq::key::{DlqEntryKey, NotReplayable};
pub use dlq::replay::{
    self, BulkReport, BulkRequest, Check as ReplayCheck, Level as CheckLevel, ReplayError,
    ReplayReport, ReplayRequest, Skipped, Verdict,
};
pub use dlq::tickets::{
    self, ApplyError, DlqEntry, EntryDetail, Ticket, TicketAction, TicketError,
};
pub use dlq::verifier::{self, VerifyReport};
pub use dlq::{mirror_once, webhook};
pub use observe::engines::{EngineSample, Seen};
pub use observe::health::{self, ComponentHealth, HealthReport, HealthState};
pub use observe::view::{self, BacklogRow, EngineRow, PendingRow, PgView, PoolRow, ServerRow};
pub use observe::{History, Observation, Observer, RATE_SPAN, Sample, Source, SourceError, Watch};
pub use ops::activity::{self, ActivityError, ActivityView, EndView, NewActivity, Retirement};
pub use ops::engines::{self, EngineView, RoleView};
pub use ops::facts::{self, PipelineFacts, SecondFacts};
pub use ops::quarantine::{self, QuarantineError, Quarantined};
pub use ops::reconcile::{self, Report as ReconcileReport, Verdict as ReconcileVerdict};
pub use ops::redis_state::{self, ActivityRedis, RedisStateError, RestoreReport, RestoreRequest};
pub use ops::reservation_status::{self, ReservationStatus, ReservationStatusError};
pub use ops::restore::{RestoreError, RestoreOn, restore_audited};
pub use ops::trace::{
    Anchor as TraceAnchor, Line as TraceLine, Sources as TraceSources, Story, TraceError,
    trace as trace_story,
};

// Retention of the finished history (docs/architecture.md §16.2).
pub use config::{RetentionConfig, RetentionConfigError};
pub use decide::retention::{PruneTable, REDELIVERY_SPAN, Refusal as RetentionRefusal};
pub use ops::retention::{
    self, Mark as RetentionMark, Progress as PruneProgress, PruneReport, PruneRequest,
    RetentionError, RunBy, TableReport,
};
/// What stops a long operation between its steps (`retention::prune`).
pub use tokio_util::sync::CancellationToken;
