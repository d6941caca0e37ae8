//! The daemon's background loops besides the pipeline's own: the sweeps,
//! the DLQ mirror, the ticket webhook, and the readiness wait for the order
//! consumer's queues. The sweeps, the mirror and the webhook are elected
//! singletons (docs/architecture.md §14.4): each pass runs only on the
//! daemon holding its role's lease.

use crate::config::LifecycleConfig;
use crate::daemon::singleton::Elected;
use crate::domain::singleton::Singleton;
use crate::domain::stats::LifecycleStats;
use crate::mq::Names;
use crate::mq::rocket::RocketAdmin;
use crate::reservation::ReservationStore;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What the sweeps work on.
pub(super) struct SweepDeps {
    pub pool: sqlx::PgPool,
    pub store: ReservationStore,
    pub names: Names,
    pub cfg: LifecycleConfig,
    pub stats: Arc<LifecycleStats>,
}

/// The safety nets of docs/architecture.md §8: overdue unpaid orders and stale
/// compensation tasks, settled by the same code the consumers run.
pub(super) fn spawn_sweeps(
    deps: SweepDeps,
    elected: Elected,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) {
    const LIMIT: i64 = 500;
    let SweepDeps {
        pool,
        store,
        names,
        cfg,
        stats,
    } = deps;
    tracker.spawn(async move {
        let every = Duration::from_millis(cfg.sweep_interval_ms.max(100));
        let mut last_retire: Option<std::time::Instant> = None;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
            if !elected.holds(Singleton::Sweeps) {
                continue;
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
            if last_retire.is_none_or(|at| at.elapsed() >= RETIRE_EVERY) {
                last_retire = Some(std::time::Instant::now());
                retire(&pool, &store).await;
            }
        }
    });
}

/// How often the sweeps' holder looks for ended activities to retire: an
/// activity waits a minute past its validity anyway (§16.3).
const RETIRE_EVERY: Duration = Duration::from_secs(5);

/// One retirement pass (docs/architecture.md §16.3); a failure waits for
/// the next pass, since nothing is lost by retiring later.
async fn retire(pool: &sqlx::PgPool, store: &ReservationStore) {
    match crate::ops::activity::retire_due(pool, store, 20).await {
        Ok(done) => {
            for r in done {
                match r.outcome {
                    crate::reservation::RetireOutcome::Retired => {
                        tracing::info!(
                            activity = r.activity_id.0,
                            "RETIRED: the ended activity left Redis"
                        );
                    }
                    crate::reservation::RetireOutcome::Pending(n) => {
                        tracing::info!(
                            activity = r.activity_id.0,
                            pending = n,
                            "retirement waits for pending sends"
                        );
                    }
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "retirement pass failed"),
    }
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

/// The DLQ governor (docs/architecture.md §9.1, §9.2): every
/// `mirror_interval_ms` it mirrors every seckill group's DLQ into
/// `dlq_messages` and tickets, routes new tickets to their owners and
/// verifies what now has its effect.
pub(super) fn spawn_dlq_governor(
    admin: RocketAdmin,
    pool: sqlx::PgPool,
    names: Names,
    cfg: crate::config::DlqConfig,
    elected: Elected,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) {
    let every = Duration::from_millis(cfg.mirror_interval_ms.max(100));
    let owners = cfg.owners;
    tracker.spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
            if !elected.holds(Singleton::DlqMirror) {
                continue;
            }
            if let Err(e) = crate::dlq::mirror_once(&admin, &pool, &names).await {
                tracing::warn!(error = %e, "DLQ mirror pass failed; retrying next interval");
            }
            match crate::dlq::tickets::route_owners(&pool, &owners).await {
                Ok(routed) => {
                    for (ticket, team) in routed {
                        tracing::info!(ticket_id = %ticket, owner = %team, "ticket routed to its owner ([dlq] owners)");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "ticket owner routing failed; retrying next interval"),
            }
            // After the mirror, so an entry that died again is DEAD before
            // its effect is looked for (docs/architecture.md §9.2).
            if let Err(e) = crate::dlq::verifier::verify_once(&pool, &names).await {
                tracing::warn!(error = %e, "DLQ verifier pass failed; retrying next interval");
            }
        }
        admin.shutdown().await;
    });
}

/// The ticket webhook (docs/architecture.md §9.2): every
/// `mirror_interval_ms` it posts the ticket transitions not yet delivered.
/// Without a `[dlq] webhook_url` there is nothing to run.
pub(super) fn spawn_webhook(
    pool: sqlx::PgPool,
    cfg: &crate::config::DlqConfig,
    elected: Elected,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) {
    let Some(url) = cfg.webhook_url.clone() else {
        return;
    };
    let http = reqwest::Client::new();
    let every = Duration::from_millis(cfg.mirror_interval_ms.max(100));
    tracker.spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
            if !elected.holds(Singleton::Webhook) {
                continue;
            }
            if let Err(e) = crate::dlq::webhook::deliver_pending(&pool, &http, &url).await {
                tracing::warn!(error = %e, "ticket webhook pass failed; retrying next interval");
            }
        }
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
pub(super) async fn wait_for_queues(
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

/// The Redis state watch (docs/architecture.md §4.5): once a second, every
/// live activity's Redis epoch against PostgreSQL's. A lost or stale one is
/// refused by the ingress until a restore, and said loudly once; the
/// accepted tally is flushed on the same beat.
pub(super) fn spawn_redis_watch(
    pool: sqlx::PgPool,
    store: ReservationStore,
    ingress: crate::pipeline::ingress::Ingress,
    instance: String,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) {
    use crate::ops::redis_state;
    tracker.spawn(async move {
        let lost = ingress.lost_states();
        let tally = ingress.tally();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            match redis_state::survey(&pool, &store).await {
                Ok(rows) => {
                    let now: std::collections::HashMap<_, _> = rows
                        .iter()
                        .filter(|r| r.state.refuses())
                        .map(|r| (r.activity_id, r.explain()))
                        .collect();
                    let mut held = lost.write().unwrap_or_else(|e| e.into_inner());
                    for (activity, why) in &now {
                        if !held.contains_key(activity) {
                            tracing::error!(activity = %activity, "{why}");
                        }
                    }
                    for activity in held.keys() {
                        if !now.contains_key(activity) {
                            tracing::warn!(activity = %activity, "Redis state of the activity is back; reservations admitted again");
                        }
                    }
                    *held = now;
                }
                // Unknown is not lost: Redis or PostgreSQL being down has
                // its own refusals and alerts.
                Err(e) => tracing::debug!(error = %e, "Redis state survey failed"),
            }
            let totals: Vec<_> = {
                let t = tally.lock().unwrap_or_else(|e| e.into_inner());
                t.iter().map(|(a, n)| (*a, *n)).collect()
            };
            if let Err(e) = redis_state::flush_tally(&pool, &instance, &totals).await {
                tracing::debug!(error = %e, "could not flush the accepted tally");
            }
        }
    });
}

/// Re-reads the tokens every `every` (docs/security.md): a new token works
/// and a revoked one stops within it. A failed read keeps the last set and
/// says so; the daemon goes on serving.
pub(super) fn spawn_token_refresh(
    gate: Arc<crate::daemon::auth::Gate>,
    pool: sqlx::PgPool,
    every: Duration,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) {
    tracker.spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
            if let Err(e) = gate.refresh(&pool).await {
                tracing::warn!(error = %e, "cannot re-read api_tokens; keeping the last set");
            }
        }
    });
}
