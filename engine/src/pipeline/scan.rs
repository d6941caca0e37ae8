//! The pending-reservation scanner (docs/architecture.md §6.5, §6).
//!
//! Inputs: reservations in the pending ZSET whose `next_retry_at` has passed
//! (a first send that never confirmed: the process died before sending,
//! window 1 of docs/architecture.md §1, or the outcome was UNKNOWN, window 2). Outputs:
//! re-sends with the SAME `message_id`, and the outcome applied.
//!
//! Claims carry a lease, so N engine instances can scan at once: a claim is
//! exclusive until its lease expires, and a crashed claimer's reservations
//! come back by themselves when it does. Work per pass is bounded (batch
//! size and sends in flight), and UNKNOWN backs off exponentially with jitter.

use crate::config::ScannerConfig;
use crate::decide::circuit::Permit;
use crate::domain::clock::now_ms;
use crate::domain::message::OrderCreateRequested;
use crate::domain::stats::PublishStats;
use crate::mq::{Producer, SendOutcome};
use crate::pipeline::circuit::SendCircuit;
use crate::pipeline::publish::{
    PublishError, compensate_send_failure, mark_sent, order_message, send_batch,
};
use crate::pipeline::trail;
use crate::reservation::{ReservationStore, backoff_ms};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub struct ScannerDeps<P> {
    pub producer: P,
    pub store: ReservationStore,
    pub pool: PgPool,
    pub topic: String,
    pub send_timeout: Duration,
    pub stats: Arc<PublishStats>,
    /// This instance's lease owner id.
    pub owner: String,
    /// Messages per send request (the publisher's batch size).
    pub batch_max: usize,
    /// Send requests in flight at once.
    pub in_flight: usize,
    /// Shared with the publisher: no sends while the broker is silent.
    pub circuit: Arc<SendCircuit>,
}

/// After `valid_until` plus this, no copy of the message can still become an
/// order (the consumer rejects it as expired), so the scanner stops sending
/// and settles the reservation itself.
pub const EXPIRY_GRACE_MS: i64 = 60_000;

/// One pass over every activity. Returns how many reservations it handled.
/// An error in one activity is logged and the others still run: leases
/// expire by themselves, so the next pass retries.
pub async fn pass<P: Producer>(
    deps: &Arc<ScannerDeps<P>>,
    cfg: &ScannerConfig,
) -> Result<usize, PublishError> {
    let mut total = 0;
    for activity in deps.store.activities().await? {
        match pass_activity(deps, cfg, activity).await {
            Ok(n) => total += n,
            Err(e) => tracing::warn!(%activity, error = %e, "scanner pass failed for one activity"),
        }
    }
    Ok(total)
}

/// Settles a reservation whose validity is long gone: if PostgreSQL already
/// decided it, it is simply done; otherwise nothing can still create its
/// order, so it is compensated (docs/architecture.md §8, one compensation per reservation).
async fn settle_expired<P: Producer>(
    deps: &ScannerDeps<P>,
    m: &OrderCreateRequested,
) -> Result<(), PublishError> {
    let decided: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM reservations WHERE reservation_id = $1)")
            .bind(&m.reservation_id)
            .fetch_one(&deps.pool)
            .await?;
    if decided {
        deps.store
            .mark_sent_many(
                &[(
                    m.activity_id,
                    m.reservation_id.clone(),
                    m.message_id.clone(),
                )],
                "",
            )
            .await?;
    } else {
        compensate_send_failure(
            &deps.store,
            &deps.pool,
            m,
            "expired before any send was confirmed",
        )
        .await?;
    }
    Ok(())
}

async fn pass_activity<P: Producer>(
    deps: &Arc<ScannerDeps<P>>,
    cfg: &ScannerConfig,
    activity: crate::domain::ids::ActivityId,
) -> Result<usize, PublishError> {
    // Behind an open circuit nothing is claimed, so no attempt is spent
    // and no backoff grows while the broker is gone; a probe claims one
    // batch (docs/architecture.md §6.7).
    let limit = match deps.circuit.permit(0) {
        Permit::Hold => return Ok(0),
        Permit::Probe => deps.batch_max.max(1),
        Permit::Send => cfg.batch,
    };
    let now = now_ms();
    let claimed = deps
        .store
        .claim_due(activity, now, limit, &deps.owner, cfg.lease_ms as i64)
        .await?;
    if claimed.is_empty() {
        return Ok(0);
    }
    let total = claimed.len();
    let (expired, live): (Vec<_>, Vec<_>) = claimed
        .into_iter()
        .partition(|r| now > r.valid_until_ms + EXPIRY_GRACE_MS);
    for r in &expired {
        settle_expired(deps, &order_message(r)).await?;
    }
    deps.stats.resent.add(live.len() as u64);
    deps.stats.resend_expired.add(expired.len() as u64);
    let mut workers = JoinSet::new();
    for (i, chunk) in live.chunks(deps.batch_max.max(1)).enumerate() {
        // Bounded workers: at most `in_flight` sends at a time.
        while workers.len() >= deps.in_flight.max(1) {
            log_worker(workers.join_next().await);
        }
        // The circuit may have opened under this pass: give the rest of
        // the claim back, due now, for the pass after the probe.
        if i > 0 && deps.circuit.permit(chunk.len()) == Permit::Hold {
            for r in chunk {
                deps.store
                    .reschedule(
                        r.activity_id,
                        &r.reservation_id,
                        &r.message_id,
                        &deps.owner,
                        now_ms(),
                        "held: the send circuit is open",
                    )
                    .await?;
            }
            continue;
        }
        let deps = deps.clone();
        let (base, max) = (cfg.backoff_base_ms, cfg.backoff_max_ms);
        let batch: Vec<_> = chunk.iter().map(order_message).collect();
        let attempts: Vec<u32> = chunk.iter().map(|r| r.send_attempt).collect();
        let span = tracing::info_span!("resend", n = batch.len());
        trail::link(&span, batch.iter().map(|m| m.trace.traceparent.as_str()));
        workers.spawn(tracing::Instrument::instrument(
            async move {
                let result = async {
                    let outcome = send_batch(
                        &deps.producer,
                        &deps.topic,
                        &batch,
                        deps.send_timeout,
                        &deps.stats,
                    )
                    .await;
                    deps.circuit.record(&outcome);
                    let n = batch.len() as u64;
                    match &outcome {
                        SendOutcome::Confirmed(_) => deps.stats.resend_confirmed.add(n),
                        SendOutcome::Unknown { .. } => deps.stats.resend_unknown.add(n),
                        SendOutcome::DefiniteFailure { .. } => deps.stats.resend_failed.add(n),
                    }
                    match &outcome {
                        SendOutcome::Confirmed(r) => mark_sent(&deps.store, &batch, r).await?,
                        // A re-sent reservation may already be stored from an
                        // earlier attempt, so even a definite failure does not
                        // compensate here: it backs off, and the expiry path
                        // settles it against PostgreSQL once no copy can still
                        // become an order. (`trail::sent` logged the outcome,
                        // with the batch's ids.)
                        SendOutcome::Unknown { detail, .. }
                        | SendOutcome::DefiniteFailure { detail, .. } => {
                            for (m, attempt) in batch.iter().zip(&attempts) {
                                let delay = backoff_ms(*attempt, base, max, rand::random::<f64>());
                                deps.store
                                    .reschedule(
                                        m.activity_id,
                                        &m.reservation_id,
                                        &m.message_id,
                                        &deps.owner,
                                        now_ms() + delay as i64,
                                        detail,
                                    )
                                    .await?;
                            }
                        }
                    }
                    Ok::<(), PublishError>(())
                }
                .await;
                if let Err(e) = &result {
                    trail::resend_failed(&batch, e);
                }
                result
            },
            span,
        ));
    }
    while let Some(r) = workers.join_next().await {
        log_worker(Some(r));
    }
    Ok(total)
}

/// A failed worker leaves its reservations leased; the lease expiry hands
/// them to the next pass. Siblings are never aborted for it.
fn log_worker(r: Option<Result<Result<(), PublishError>, tokio::task::JoinError>>) {
    match r {
        // Logged by the worker, with its reservations (`trail::resend_failed`).
        Some(Ok(Err(_))) => {}
        Some(Err(e)) => {
            tracing::error!(error = %e, "scanner worker panicked; its reservations retry after the lease")
        }
        _ => {}
    }
}

/// Runs passes every `interval_ms` until `cancel` fires.
pub fn spawn<P: Producer>(
    deps: ScannerDeps<P>,
    cfg: ScannerConfig,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) {
    let deps = Arc::new(deps);
    tracker.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(cfg.interval_ms.max(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                _ = tick.tick() => {}
            }
            match pass(&deps, &cfg).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(resent = n, "scanner re-sent pending reservations"),
                // Leases expire by themselves; the next pass retries.
                Err(e) => tracing::warn!(error = %e, "scanner pass failed"),
            }
        }
    });
}
