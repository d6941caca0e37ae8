//! `seckillctl engine run`: the publisher, the scanner, the order-create
//! consumer, the outbox publisher, the cancel, compensation and projection
//! consumers with their sweeps, and the HTTP surface in one process
//! (docs/architecture.md §2).
//!
//! Like mini-redis, [`run`] takes the listener and a `shutdown` future, so
//! the binary decides what stops it (SIGTERM, Ctrl-C) and tests can stop it
//! on demand. Every component is started in [`start`], in order, into a
//! [`Parts`] stack; shutdown first stops admitting (readiness off, HTTP
//! drains), then stops the parts in reverse order (see `parts` for why that
//! order is safe). A start that fails halfway stops what it had started.

pub mod api;
pub mod auth;
mod body;
pub mod governor;
pub mod http;
mod limits;
mod loops;
pub mod metrics;
mod ops;
mod parts;
mod registry;
mod restart;
mod retention;
mod singleton;
mod state;

use crate::config::Config;
use crate::daemon::auth::Gate;
use crate::daemon::governor::Governor;
use crate::daemon::http::{AppState, admin_router, router};
use crate::daemon::state::OpsDeps;
use crate::daemon::state::Shared;
use crate::domain::meters::Meters;
use crate::domain::stats::{ConsumeStats, LifecycleStats, PublishStats};
use crate::mq::position::Positions;
use crate::mq::rocket::{MqError, RocketAdmin, RocketConsumer, RocketProducer};
use crate::mq::{ConsumerSpec, Handler, Names, TopicKind};
use crate::observe::Observer;
use crate::pipeline::circuit::SendCircuit;
use crate::pipeline::consume::OrderConsumer;
use crate::pipeline::ingress::Ingress;
use crate::pipeline::lifecycle::{CancelConsumer, CompensationConsumer, ProjectionConsumer};
use crate::pipeline::{outbox, publish, scan};
use crate::reservation::ReservationStore;
use crate::runtime::ClientRuntime;
use crate::store::{db, redis as redis_conn};
use parts::{Part, Parts};
use sqlx::PgPool;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Db(#[from] db::DbError),
    #[error(transparent)]
    Redis(#[from] redis_conn::RedisError),
    #[error(transparent)]
    Mq(#[from] MqError),
    #[error("HTTP server failed: {0}")]
    Http(#[from] std::io::Error),
}

/// This daemon's one id: its registry row (docs/architecture.md §14.3), its
/// scanner's lease owner and its Redis watch, so a lease names a daemon
/// `seckillctl engines` lists.
fn instance_id() -> String {
    format!("engine-{}-{}", std::process::id(), ulid::Ulid::new())
}

/// Where the daemon listens: the API, and optionally a separate address for
/// the open probes and `/metrics` (`--admin-listen`, docs/security.md).
pub struct Listeners {
    pub api: TcpListener,
    pub admin: Option<TcpListener>,
}

impl From<TcpListener> for Listeners {
    fn from(api: TcpListener) -> Self {
        Listeners { api, admin: None }
    }
}

pub async fn run(
    cfg: Config,
    rt: Arc<ClientRuntime>,
    listeners: impl Into<Listeners>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let listeners = listeners.into();
    let address = listeners.api.local_addr()?.to_string();
    let engine_id = instance_id();
    let mut parts = Parts::default();
    let served = match start(&cfg, &rt, &engine_id, &mut parts).await {
        Ok(started) => {
            let pool = started.state.pool.clone();
            let me = registry::identity(engine_id.clone(), address);
            match registry::register(&pool, &me, &cfg.registry, started.cancel.clone()).await {
                Ok(()) => {
                    let served = serve(listeners, started, &cfg.http, shutdown).await;
                    registry::stopped(&pool, &me.engine_id).await;
                    served
                }
                Err(e) => Err(db::DbError::from(e).into()),
            }
        }
        Err(e) => Err(e),
    };
    parts.stop_all().await;
    served
}

/// What [`start`] hands to the HTTP surface.
struct Started {
    state: AppState,
    gate: Arc<Gate>,
    /// Cancelled on shutdown: readiness off, HTTP drains, loops stop.
    cancel: CancellationToken,
    ready: Arc<AtomicBool>,
}

/// Shared by every component [`start`] builds.
struct Ctx<'a> {
    cfg: &'a Config,
    rt: &'a Arc<ClientRuntime>,
    engine_id: &'a str,
    names: Names,
    pool: PgPool,
    store: ReservationStore,
    tracker: TaskTracker,
    cancel: CancellationToken,
    /// Shared by the publisher and the scanner; its reconnects restart the
    /// consumers (§6.7).
    circuit: Arc<SendCircuit>,
    /// Every consumer's queue positions, for `/v1/stats` (§10.4).
    positions: Arc<Positions>,
    /// Every send and delivery by topic and group, for `/metrics` (§11.1).
    meters: Meters,
}

impl Ctx<'_> {
    async fn consumer<H: Handler>(
        &self,
        parts: &mut Parts,
        name: &'static str,
        spec: &ConsumerSpec,
        handler: H,
    ) -> Result<(), DaemonError> {
        let recipe = restart::Recipe {
            rt: self.rt.clone(),
            namesrv: self.cfg.namesrv_addr.clone(),
            spec: ConsumerSpec {
                positions: Some(self.positions.clone()),
                meters: Some(self.meters.clone()),
                ..spec.clone()
            },
            handler: Arc::new(handler),
        };
        let first = RocketConsumer::start(
            recipe.rt.clone(),
            &recipe.namesrv,
            &recipe.spec,
            recipe.handler.clone(),
        )
        .await?;
        parts.started(Part::Consumer {
            name,
            consumer: restart::Restarting::spawn(name, first, recipe, self.circuit.reconnects()),
        });
        Ok(())
    }

    /// The lifecycle consumers' spec: small batches, few threads (§8).
    fn small_spec(&self, kind: TopicKind) -> ConsumerSpec {
        let mut spec = ConsumerSpec::new(self.names.group(kind), self.names.topic(kind));
        spec.threads = self.cfg.lifecycle.consumer_threads.max(1);
        spec.batch_max = 16;
        spec.max_reconsume_times = self.cfg.mq.max_reconsume_times;
        spec
    }
}

/// Every component, in start order: the stores, the producer, the loops,
/// the senders, the lifecycle, the order consumer that feeds it, then the
/// safety nets and the governor.
async fn start(
    cfg: &Config,
    rt: &Arc<ClientRuntime>,
    engine_id: &str,
    parts: &mut Parts,
) -> Result<Started, DaemonError> {
    let pool = db::connect(cfg).await?;
    parts.started(Part::Pool(pool.clone()));
    let redis = redis_conn::connect(cfg).await?;
    let mut wait_lanes = Vec::new();
    if cfg.redis.wait_replicas > 0 {
        for _ in 0..cfg.redis.wait_lanes {
            wait_lanes.push(redis_conn::connect(cfg).await?);
        }
    }
    let ctx = Ctx {
        cfg,
        rt,
        engine_id,
        names: Names::new(cfg.topic_prefix.clone()),
        store: ReservationStore::new(redis, cfg.redis_prefix.clone())
            .with_replica_wait(crate::reservation::ReplicaWait {
                replicas: cfg.redis.wait_replicas,
                timeout_ms: cfg.redis.wait_timeout_ms,
            })
            .with_wait_lanes(wait_lanes),
        pool,
        tracker: TaskTracker::new(),
        cancel: CancellationToken::new(),
        circuit: Arc::new(SendCircuit::new(cfg.mq.circuit)),
        positions: Arc::new(Positions::new()),
        meters: Meters::default(),
    };
    let send_timeout = Duration::from_millis(cfg.mq.send_timeout_ms);
    let producer = RocketProducer::start(
        rt.clone(),
        &cfg.namesrv_addr,
        &ctx.names.producer_group(),
        send_timeout,
        cfg.mq.send_retries,
    )
    .await?
    .with_meters(ctx.meters.clone());
    parts.started(Part::Producer(producer.clone()));
    parts.started(Part::Loops {
        tracker: ctx.tracker.clone(),
        cancel: ctx.cancel.clone(),
    });

    let stats = Arc::new(PublishStats::default());
    let publisher = start_senders(&ctx, &producer, send_timeout, &stats);
    let governor = Governor::new(cfg);
    let consume = Arc::new(ConsumeStats::default());
    // Downstream before upstream: the lifecycle is up before the first
    // order can feed it, and, stopped in reverse, the order consumer stops
    // pulling first while the consumers after it still run.
    let lifecycle = Arc::new(LifecycleStats::default());
    let outbox_timeout = Duration::from_millis(cfg.outbox.send_timeout_ms);
    start_lifecycle(&ctx, parts, &producer, outbox_timeout, &lifecycle, &consume).await?;
    let queues = start_order_consumer(&ctx, parts, &governor, &consume).await?;
    start_safety_nets(&ctx, &lifecycle).await?;

    let ready = Arc::new(AtomicBool::new(true));
    let consuming = Arc::new(AtomicBool::new(false));
    tokio::spawn(loops::wait_for_queues(
        queues,
        consuming.clone(),
        ctx.cancel.clone(),
    ));
    let state = AppState::new(Shared {
        ingress: Ingress::new(
            ctx.store.clone(),
            ctx.pool.clone(),
            publisher,
            cfg.scanner.first_retry_after_ms as i64,
        ),
        store: ctx.store.clone(),
        pool: ctx.pool.clone(),
        stats,
        circuit: ctx.circuit.clone(),
        lifecycle,
        consume: consume.clone(),
        governor: governor.clone(),
        names: ctx.names.clone(),
        ready: ready.clone(),
        consuming,
        positions: ctx.positions.clone(),
        meters: ctx.meters.clone(),
        ops: Arc::new(OpsDeps {
            producer: producer.clone(),
            rt: rt.clone(),
            namesrv: cfg.namesrv_addr.clone(),
            admin_timeout: cfg.admin_timeout(),
            retention: cfg.dlq.broker_retention(),
        }),
    });
    loops::spawn_redis_watch(
        ctx.pool.clone(),
        ctx.store.clone(),
        state.ingress.clone(),
        ctx.engine_id.to_owned(),
        &ctx.tracker,
        ctx.cancel.clone(),
    );
    start_governor(&ctx, &state, governor, consume).await?;
    let gate = Gate::load(cfg.auth.mode, &ctx.pool)
        .await
        .map_err(db::DbError::from)?;
    if cfg.auth.mode == crate::config::AuthMode::Open {
        tracing::warn!(
            "[auth] mode = \"open\": every route answers anyone, tokens are not checked (docs/security.md)"
        );
    }
    loops::spawn_token_refresh(
        gate.clone(),
        ctx.pool.clone(),
        Duration::from_millis(cfg.auth.refresh_ms.max(100)),
        &ctx.tracker,
        ctx.cancel.clone(),
    );
    Ok(Started {
        state,
        gate,
        cancel: ctx.cancel,
        ready,
    })
}

/// The publisher (ingress's bounded sends, §6.3) and the scanner that
/// re-sends what it could not (§6.5).
fn start_senders(
    ctx: &Ctx<'_>,
    producer: &RocketProducer,
    send_timeout: Duration,
    stats: &Arc<PublishStats>,
) -> publish::Publisher {
    let circuit = &ctx.circuit;
    let topic = ctx.names.topic(TopicKind::OrderCreate);
    let publisher = publish::spawn(
        publish::PublisherDeps {
            producer: producer.clone(),
            store: ctx.store.clone(),
            pool: ctx.pool.clone(),
            topic: topic.clone(),
            send_timeout,
            stats: stats.clone(),
            hand_over_after: Duration::from_millis(ctx.cfg.scanner.first_retry_after_ms),
            circuit: circuit.clone(),
        },
        &ctx.cfg.publisher,
        &ctx.tracker,
    );
    scan::spawn(
        scan::ScannerDeps {
            producer: producer.clone(),
            store: ctx.store.clone(),
            pool: ctx.pool.clone(),
            topic,
            send_timeout,
            stats: stats.clone(),
            owner: ctx.engine_id.to_owned(),
            batch_max: ctx.cfg.publisher.batch_max,
            in_flight: ctx.cfg.publisher.in_flight,
            circuit: circuit.clone(),
        },
        ctx.cfg.scanner.clone(),
        &ctx.tracker,
        ctx.cancel.clone(),
    );
    publisher
}

/// The order-create consumer (§7). Returns the watch that turns true once
/// it has queues, which `/readyz` waits for.
async fn start_order_consumer(
    ctx: &Ctx<'_>,
    parts: &mut Parts,
    governor: &Governor,
    consume: &Arc<ConsumeStats>,
) -> Result<tokio::sync::watch::Receiver<bool>, DaemonError> {
    let cfg = ctx.cfg;
    let kind = TopicKind::OrderCreate;
    let mut spec = ConsumerSpec::new(ctx.names.group(kind), ctx.names.topic(kind));
    spec.threads = cfg.consumer_threads();
    if spec.threads < cfg.consumer.threads {
        tracing::warn!(
            wanted = cfg.consumer.threads,
            budget = spec.threads,
            "consumer threads capped by the PostgreSQL budget (pg.max_connections x consumer.pg_share)"
        );
    }
    spec.batch_max = cfg.consumer.batch_max;
    spec.pull_batch = cfg.consumer.batch_max.max(32);
    spec.max_reconsume_times = cfg.mq.max_reconsume_times;
    let (assigned, queues) = tokio::sync::watch::channel(false);
    spec.assigned = Some(assigned);
    // The governor's limiter gates each order transaction inside the
    // budget the listener threads already respect (docs/architecture.md §10.10).
    let handler = OrderConsumer::new(ctx.pool.clone(), ctx.names.clone())
        .with_stats(consume.clone())
        .with_limiter(governor.limiter.clone());
    ctx.consumer(parts, "order consumer", &spec, handler)
        .await?;
    Ok(queues)
}

/// After the order (docs/architecture.md §8): the outbox, then the cancel,
/// compensation and projection consumers it feeds.
async fn start_lifecycle(
    ctx: &Ctx<'_>,
    parts: &mut Parts,
    producer: &RocketProducer,
    outbox_timeout: Duration,
    lifecycle: &Arc<LifecycleStats>,
    consume: &Arc<ConsumeStats>,
) -> Result<(), DaemonError> {
    outbox::spawn(
        outbox::OutboxDeps {
            producer: producer.clone(),
            pool: ctx.pool.clone(),
            send_timeout: outbox_timeout,
            stats: lifecycle.clone(),
            orders: Some(consume.clone()),
        },
        ctx.cfg.outbox.clone(),
        &ctx.tracker,
        ctx.cancel.clone(),
    );
    let (pool, store, names) = (&ctx.pool, &ctx.store, &ctx.names);
    let lead = chrono::Duration::milliseconds(ctx.cfg.outbox.timer_lead_ms as i64);
    let cancel = CancelConsumer::new(pool.clone(), names.clone(), lifecycle.clone())
        .with_hold(outbox::max_hold(lead));
    let mut spec = ctx.small_spec(TopicKind::OrderTimeout);
    spec.threads = ctx.cfg.lifecycle.cancel_threads.max(1);
    ctx.consumer(parts, "cancel consumer", &spec, cancel)
        .await?;
    let compensation =
        CompensationConsumer::new(pool.clone(), store.clone(), names, lifecycle.clone());
    let spec = ctx.small_spec(TopicKind::InventoryCompensate);
    ctx.consumer(parts, "compensation consumer", &spec, compensation)
        .await?;
    let projection = ProjectionConsumer::new(pool.clone(), store.clone(), names, lifecycle.clone());
    let spec = ctx.small_spec(TopicKind::OrderEvent);
    ctx.consumer(parts, "projection consumer", &spec, projection)
        .await
}

/// The DLQ mirror and its webhook (§9.1, §9.2) and the sweeps that settle
/// what the broker's timers and the consumers missed (§8): each an elected
/// singleton, run by the one daemon holding its lease (§14.4).
async fn start_safety_nets(
    ctx: &Ctx<'_>,
    lifecycle: &Arc<LifecycleStats>,
) -> Result<(), DaemonError> {
    let cfg = ctx.cfg;
    let admin = RocketAdmin::start(ctx.rt.clone(), &cfg.namesrv_addr, cfg.admin_timeout()).await?;
    let elected = singleton::spawn(
        ctx.pool.clone(),
        ctx.engine_id.to_owned(),
        Duration::from_millis(cfg.registry.heartbeat_ms.max(100)),
        Duration::from_millis(cfg.registry.lease_ttl_ms.max(500)),
        &ctx.tracker,
        ctx.cancel.clone(),
    )
    .await;
    loops::spawn_dlq_governor(
        admin,
        ctx.pool.clone(),
        ctx.names.clone(),
        cfg.dlq.clone(),
        elected.clone(),
        &ctx.tracker,
        ctx.cancel.clone(),
    );
    loops::spawn_webhook(
        ctx.pool.clone(),
        &cfg.dlq,
        elected.clone(),
        &ctx.tracker,
        ctx.cancel.clone(),
    );
    retention::spawn_retention(
        ctx.pool.clone(),
        cfg.retention.clone(),
        cfg.dlq.broker_retention(),
        elected.clone(),
        &ctx.tracker,
        ctx.cancel.clone(),
    );
    loops::spawn_sweeps(
        loops::SweepDeps {
            pool: ctx.pool.clone(),
            store: ctx.store.clone(),
            names: ctx.names.clone(),
            cfg: cfg.lifecycle.clone(),
            stats: lifecycle.clone(),
        },
        elected,
        &ctx.tracker,
        ctx.cancel.clone(),
    );
    Ok(())
}

/// The backlog governor (§10): samples with its own broker admin and the
/// engine's pool and store, and reads the engine's figures in-process.
async fn start_governor(
    ctx: &Ctx<'_>,
    state: &AppState,
    governor: Arc<Governor>,
    consume: Arc<ConsumeStats>,
) -> Result<(), DaemonError> {
    let cfg = ctx.cfg;
    let admin = RocketAdmin::start(ctx.rt.clone(), &cfg.namesrv_addr, cfg.admin_timeout()).await?;
    let observer = Observer::with_parts(
        cfg,
        ctx.rt.clone(),
        ctx.pool.clone(),
        ctx.store.clone(),
        admin,
    );
    let view_of = state.clone();
    governor::spawn(
        observer,
        governor,
        consume,
        ctx.circuit.clone(),
        move || view_of.stats_view(),
        &ctx.tracker,
        ctx.cancel.clone(),
    );
    Ok(())
}

/// Serves HTTP until `shutdown`, then turns readiness off and lets the
/// open requests finish.
async fn serve(
    listeners: Listeners,
    started: Started,
    http: &crate::config::HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let Started {
        state,
        gate,
        cancel,
        ready,
    } = started;
    let addr = listeners.api.local_addr()?;
    tracing::info!(%addr, "engine serving");
    let stop = cancel.clone();
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down");
        ready.store(false, Ordering::Relaxed);
        stop.cancel();
    });
    let api = router(state.clone(), gate, http);
    let Some(admin) = listeners.admin else {
        axum::serve(listeners.api, api.merge(admin_router(state)))
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await?;
        return Ok(());
    };
    tracing::info!(addr = %admin.local_addr()?, "probes and /metrics serving");
    let admin = axum::serve(admin, admin_router(state))
        .with_graceful_shutdown(cancel.clone().cancelled_owned())
        .into_future();
    let api = axum::serve(listeners.api, api)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .into_future();
    let (a, b) = tokio::join!(api, admin);
    a?;
    b?;
    Ok(())
}
