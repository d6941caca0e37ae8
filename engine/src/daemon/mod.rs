//! `seckillctl engine run`: the publisher, the scanner, the order-create
//! consumer, the outbox publisher, the cancel, compensation and projection
//! consumers with their sweeps, and the HTTP surface in one process
//! (docs/architecture.md §2).
//!
//! Like mini-redis, [`run`] takes the listener and a `shutdown` future, so
//! the binary decides what stops it (SIGTERM, Ctrl-C) and tests can stop it
//! on demand. Shutdown order: stop admitting (readiness off, HTTP drains),
//! stop pulling and let in-flight consumer batches finish (a batch is only
//! ACKed after its transaction commits, so nothing unfinished is ACKed),
//! flush the publisher, then stop the producer.

pub mod api;
pub mod governor;
pub mod http;
pub mod metrics;

use crate::config::Config;
use crate::config::LifecycleConfig;
use crate::daemon::governor::Governor;
use crate::daemon::http::{AppState, router};
use crate::domain::stats::{ConsumeStats, LifecycleStats, PublishStats};
use crate::mq::rocket::{MqError, RocketAdmin, RocketConsumer, RocketProducer};
use crate::mq::{ConsumerSpec, Names, TopicKind};
use crate::observe::Observer;
use crate::pipeline::consume::OrderConsumer;
use crate::pipeline::ingress::Ingress;
use crate::pipeline::lifecycle::{CancelConsumer, CompensationConsumer, ProjectionConsumer};
use crate::pipeline::{outbox, publish, scan};
use crate::reservation::ReservationStore;
use crate::runtime::ClientRuntime;
use crate::store::{db, redis as redis_conn};
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

/// A unique lease owner for this instance's scanner.
fn instance_id() -> String {
    format!("engine-{}-{}", std::process::id(), ulid::Ulid::new())
}

pub async fn run(
    cfg: Config,
    rt: Arc<ClientRuntime>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    let pool = db::connect(&cfg).await?;
    let redis = redis_conn::connect(&cfg).await?;
    let store = ReservationStore::new(redis, cfg.redis_prefix.clone());
    let names = Names::new(cfg.topic_prefix.clone());
    let send_timeout = Duration::from_millis(cfg.mq.send_timeout_ms);
    let producer = RocketProducer::start(
        rt.clone(),
        &cfg.namesrv_addr,
        &names.producer_group(),
        send_timeout,
        cfg.mq.send_retries,
    )
    .await?;
    let stats = Arc::new(PublishStats::default());
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    let topic = names.topic(TopicKind::OrderCreate);

    let publisher = publish::spawn(
        publish::PublisherDeps {
            producer: producer.clone(),
            store: store.clone(),
            pool: pool.clone(),
            topic: topic.clone(),
            send_timeout,
            stats: stats.clone(),
            hand_over_after: Duration::from_millis(cfg.scanner.first_retry_after_ms),
        },
        &cfg.publisher,
        &tracker,
    );
    scan::spawn(
        scan::ScannerDeps {
            producer: producer.clone(),
            store: store.clone(),
            pool: pool.clone(),
            topic: topic.clone(),
            send_timeout,
            stats: stats.clone(),
            owner: instance_id(),
            batch_max: cfg.publisher.batch_max,
            in_flight: cfg.publisher.in_flight,
        },
        cfg.scanner.clone(),
        &tracker,
        cancel.clone(),
    );

    let mut spec = ConsumerSpec::new(names.group(TopicKind::OrderCreate), topic);
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
    // budget the listener threads already respect (docs/architecture.md §10).
    let consume_stats = Arc::new(ConsumeStats::default());
    let governor = Governor::new(&cfg);
    let consumer = RocketConsumer::start(
        rt.clone(),
        &cfg.namesrv_addr,
        &spec,
        Arc::new(
            OrderConsumer::new(pool.clone(), names.clone())
                .with_stats(consume_stats.clone())
                .with_limiter(governor.limiter.clone()),
        ),
    )
    .await?;

    // After the order (docs/architecture.md §8): outbox → cancel, compensation, projection.
    let lifecycle = Arc::new(LifecycleStats::default());
    outbox::spawn(
        outbox::OutboxDeps {
            producer: producer.clone(),
            pool: pool.clone(),
            send_timeout,
            stats: lifecycle.clone(),
            orders: Some(consume_stats.clone()),
        },
        cfg.outbox.clone(),
        &tracker,
        cancel.clone(),
    );
    let small = |kind: TopicKind| {
        let mut spec = ConsumerSpec::new(names.group(kind), names.topic(kind));
        spec.threads = cfg.lifecycle.consumer_threads.max(1);
        spec.batch_max = 16;
        spec.max_reconsume_times = cfg.mq.max_reconsume_times;
        spec
    };
    let cancel_consumer = RocketConsumer::start(
        rt.clone(),
        &cfg.namesrv_addr,
        &small(TopicKind::OrderTimeout),
        Arc::new(CancelConsumer::new(
            pool.clone(),
            names.clone(),
            lifecycle.clone(),
        )),
    )
    .await?;
    let compensation_consumer = RocketConsumer::start(
        rt.clone(),
        &cfg.namesrv_addr,
        &small(TopicKind::InventoryCompensate),
        Arc::new(CompensationConsumer::new(
            pool.clone(),
            store.clone(),
            &names,
            lifecycle.clone(),
        )),
    )
    .await?;
    let projection_consumer = RocketConsumer::start(
        rt.clone(),
        &cfg.namesrv_addr,
        &small(TopicKind::OrderEvent),
        Arc::new(ProjectionConsumer::new(
            pool.clone(),
            store.clone(),
            &names,
            lifecycle.clone(),
        )),
    )
    .await?;
    let admin = RocketAdmin::start(rt.clone(), &cfg.namesrv_addr, cfg.admin_timeout()).await?;
    spawn_governor(
        admin,
        pool.clone(),
        names.clone(),
        cfg.dlq.webhook_url.clone(),
        Duration::from_millis(cfg.dlq.mirror_interval_ms.max(100)),
        &tracker,
        cancel.clone(),
    );
    spawn_sweeps(
        pool.clone(),
        store.clone(),
        names.clone(),
        cfg.lifecycle.clone(),
        lifecycle.clone(),
        &tracker,
        cancel.clone(),
    );

    let ready = Arc::new(AtomicBool::new(true));
    let consuming = Arc::new(AtomicBool::new(false));
    tokio::spawn(wait_for_queues(queues, consuming.clone(), cancel.clone()));
    let state = AppState {
        ingress: Ingress::new(
            store.clone(),
            pool.clone(),
            publisher,
            cfg.scanner.first_retry_after_ms as i64,
        ),
        store: store.clone(),
        pool: pool.clone(),
        stats,
        lifecycle,
        consume: consume_stats.clone(),
        governor: governor.clone(),
        names: names.clone(),
        ready: ready.clone(),
        consuming,
    };
    let observer = Observer::with_parts(
        &cfg,
        rt.clone(),
        pool.clone(),
        store,
        RocketAdmin::start(rt.clone(), &cfg.namesrv_addr, cfg.admin_timeout()).await?,
    );
    let view_of = state.clone();
    crate::daemon::governor::spawn(
        observer,
        governor,
        consume_stats,
        move || view_of.stats_view(),
        &tracker,
        cancel.clone(),
    );
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "engine serving");
    let stop = cancel.clone();
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down");
        ready.store(false, Ordering::Relaxed);
        stop.cancel();
    });
    let served = axum::serve(listener, router(state))
        .with_graceful_shutdown(cancel.clone().cancelled_owned())
        .await;

    consumer.shutdown().await;
    cancel_consumer.shutdown().await;
    compensation_consumer.shutdown().await;
    projection_consumer.shutdown().await;
    tracker.close();
    tracker.wait().await;
    producer.shutdown().await;
    pool.close().await;
    served?;
    Ok(())
}

/// The safety nets of docs/architecture.md §8: overdue unpaid orders and stale
/// compensation tasks, settled by the same code the consumers run.
fn spawn_sweeps(
    pool: sqlx::PgPool,
    store: ReservationStore,
    names: Names,
    cfg: LifecycleConfig,
    stats: Arc<LifecycleStats>,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) {
    const LIMIT: i64 = 500;
    tracker.spawn(async move {
        let every = Duration::from_millis(cfg.sweep_interval_ms.max(100));
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
            // Drain while passes come back full: after a large sale the
            // broker's timer may deliver the cancels far too slowly (see
            // LifecycleConfig::cancel_grace_ms), and then this is the path.
            let grace = Duration::from_millis(cfg.cancel_grace_ms);
            drain("cancel sweep", LIMIT, &cancel, || {
                crate::pipeline::lifecycle::cancel::sweep_once(&pool, &names, grace, LIMIT, &stats)
            })
            .await;
            let grace = Duration::from_millis(cfg.compensation_grace_ms);
            drain("compensation sweep", LIMIT, &cancel, || {
                crate::pipeline::lifecycle::compensate::sweep_once(
                    &pool, &store, grace, LIMIT, &stats,
                )
            })
            .await;
        }
    });
}

/// Runs `pass` again while it settles a full batch (and the daemon is not
/// stopping); a failed pass waits for the next interval.
async fn drain<F, Fut, E>(what: &str, limit: i64, cancel: &CancellationToken, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<usize, E>>,
    E: std::fmt::Display,
{
    loop {
        match pass().await {
            Ok(n) if n as i64 >= limit && !cancel.is_cancelled() => continue,
            Ok(_) => break,
            Err(e) => {
                tracing::warn!(error = %e, "{what} failed; retrying next interval");
                break;
            }
        }
    }
}

/// The DLQ governor (docs/architecture.md §9.1): mirrors every seckill group's DLQ
/// into `dlq_messages` and tickets, every `every`.
fn spawn_governor(
    admin: RocketAdmin,
    pool: sqlx::PgPool,
    names: Names,
    webhook: Option<String>,
    every: Duration,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) {
    let http = reqwest::Client::new();
    tracker.spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
            if let Err(e) = crate::dlq::mirror_once(&admin, &pool, &names).await {
                tracing::warn!(error = %e, "DLQ mirror pass failed; retrying next interval");
            }
            if let Some(url) = &webhook
                && let Err(e) = crate::dlq::webhook::deliver_pending(&pool, &http, url).await
            {
                tracing::warn!(error = %e, "ticket webhook pass failed; retrying next interval");
            }
        }
        admin.shutdown().await;
    });
}

/// How long `/readyz` waits for the order consumer's first queues.
const QUEUE_WAIT: Duration = Duration::from_secs(10);

/// Raises `consuming` once the order consumer has queues, so `/readyz` says
/// ready only when reservations accepted now are also pulled now. The first
/// rebalance after a start takes a second or two; a burst let in before it
/// waits in the broker that long, which was most of the demo's end-to-end
/// latency (issue 3). An instance can stay without queues when the group has
/// more consumers than the topic has queues; ingress does not need them, so
/// after [`QUEUE_WAIT`] it is ready anyway, with a warning.
async fn wait_for_queues(
    mut queues: tokio::sync::watch::Receiver<bool>,
    consuming: Arc<AtomicBool>,
    cancel: CancellationToken,
) {
    let since = tokio::time::Instant::now();
    tokio::select! {
        _ = cancel.cancelled() => return,
        got = tokio::time::timeout(QUEUE_WAIT, queues.wait_for(|has| *has)) => match got {
            Ok(Ok(_)) => tracing::info!(
                after_ms = since.elapsed().as_millis() as u64,
                "the order consumer has its queues"
            ),
            // Timed out, or the consumer (and its listener) is gone.
            _ => tracing::warn!(
                "the order consumer has no queues after {} s (more consumers in the group than queues?); ready anyway",
                since.elapsed().as_secs()
            ),
        },
    }
    consuming.store(true, Ordering::Release);
}
