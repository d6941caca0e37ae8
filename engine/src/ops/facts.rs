//! Pipeline facts for one activity, read from PostgreSQL and Redis: what
//! became of the reservations, and how long reservation-to-decision took.
//! The bench summary and the demo read these; so will the TUI.

use crate::domain::ids::ActivityId;
use crate::domain::stats::{Percentiles, percentiles_of};
use crate::reservation::{ReservationError, ReservationStore};
use serde::Serialize;
use sqlx::PgPool;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Serialize)]
pub struct PipelineFacts {
    /// Final outcomes in PostgreSQL, by outcome.
    pub outcomes: BTreeMap<String, i64>,
    pub decided: i64,
    /// Reservation created (Redis) to order committed (PostgreSQL).
    pub end_to_end: Percentiles,
    /// Orders per second between the first and the last decision.
    pub consume_rate: f64,
    pub quarantined: i64,
    pub redis_pending: u64,
    pub redis_live_reservations: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum FactsError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Redis(#[from] ReservationError),
}

/// How far the pipeline has got: reservations decided in PostgreSQL and
/// sends still pending in Redis. Two cheap reads (an index-only count and a
/// `ZCARD`), for a caller that polls while the pipeline works: [`collect`]
/// reads every decision's latency, which would compete with the consumer it
/// is measuring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub decided: i64,
    pub redis_pending: u64,
}

pub async fn progress(
    pool: &PgPool,
    store: &ReservationStore,
    activity: ActivityId,
) -> Result<Progress, FactsError> {
    let decided: i64 =
        sqlx::query_scalar("SELECT count(*) FROM reservations WHERE activity_id = $1")
            .bind(activity)
            .fetch_one(pool)
            .await?;
    Ok(Progress {
        decided,
        redis_pending: store.pending_count(activity).await?,
    })
}

pub async fn collect(
    pool: &PgPool,
    store: &ReservationStore,
    activity: ActivityId,
) -> Result<PipelineFacts, FactsError> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT outcome::text, count(*) FROM reservations WHERE activity_id = $1 GROUP BY outcome",
    )
    .bind(activity)
    .fetch_all(pool)
    .await?;
    let outcomes: BTreeMap<String, i64> = rows.into_iter().collect();
    let decided = outcomes.values().sum();
    let mut e2e_us: Vec<i64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM (decided_at - reserved_at)) * 1000000)::bigint
         FROM reservations WHERE activity_id = $1 AND outcome = 'ORDER_CREATED'",
    )
    .bind(activity)
    .fetch_all(pool)
    .await?;
    let mut us: Vec<u64> = e2e_us.drain(..).map(|v| v.max(0) as u64).collect();
    let span: Option<(f64, i64)> = sqlx::query_as(
        "SELECT extract(epoch FROM (max(decided_at) - min(decided_at)))::float8, count(*)
         FROM reservations WHERE activity_id = $1 AND outcome = 'ORDER_CREATED' HAVING count(*) > 0",
    )
    .bind(activity)
    .fetch_optional(pool)
    .await?;
    let consume_rate = match span {
        Some((secs, n)) if secs > 0.0 => n as f64 / secs,
        _ => 0.0,
    };
    let quarantined: i64 = sqlx::query_scalar("SELECT count(*) FROM message_quarantine")
        .fetch_one(pool)
        .await?;
    Ok(PipelineFacts {
        outcomes,
        decided,
        end_to_end: percentiles_of(&mut us),
        consume_rate,
        quarantined,
        redis_pending: store.pending_count(activity).await?,
        redis_live_reservations: store.live_reservations(activity).await?,
    })
}

/// Where an activity's orders stand after creation (docs/architecture.md §8).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LifecycleFacts {
    pub paid: i64,
    pub canceled: i64,
    /// CREATED or PAYING: the pay window is open, or its cancel is due.
    pub unpaid: i64,
    pub compensations_settled: i64,
    pub compensations_pending: i64,
}

impl LifecycleFacts {
    /// Nothing left to cancel or to give back.
    pub fn settled(&self) -> bool {
        self.unpaid == 0 && self.compensations_pending == 0
    }
}

pub async fn lifecycle(pool: &PgPool, activity: ActivityId) -> Result<LifecycleFacts, sqlx::Error> {
    let (paid, canceled, unpaid, compensations_settled, compensations_pending) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'PAID'),
                count(*) FILTER (WHERE status = 'CANCELED'),
                count(*) FILTER (WHERE status IN ('CREATED', 'PAYING')),
                (SELECT count(*) FROM compensation_tasks WHERE activity_id = $1 AND status <> 'PENDING'),
                (SELECT count(*) FROM compensation_tasks WHERE activity_id = $1 AND status = 'PENDING')
         FROM orders WHERE activity_id = $1",
    )
    .bind(activity)
    .fetch_one(pool)
    .await?;
    Ok(LifecycleFacts {
        paid,
        canceled,
        unpaid,
        compensations_settled,
        compensations_pending,
    })
}
