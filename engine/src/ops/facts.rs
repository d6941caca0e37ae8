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

/// One second of a sale, counted from a start the caller names: what was
/// reserved in it (by the reservation's time in Redis) and what was decided
/// in it, with the decisions' end-to-end latency (reservation to order
/// committed). The bench's plot draws these.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SecondFacts {
    /// Whole seconds since the start.
    pub second: i64,
    pub reserved: i64,
    pub orders_created: i64,
    /// Of the orders created in this second; `None` when there were none.
    pub end_to_end_ms: Option<[f64; 3]>,
}

/// The activity's reservations and orders second by second since `since`,
/// in order, from PostgreSQL alone: one pass over the activity's
/// reservation rows, after the sale (it would compete with the consumer
/// it measures).
pub async fn timeline(
    pool: &PgPool,
    activity: ActivityId,
    since: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<SecondFacts>, sqlx::Error> {
    type Row = (i64, i64, i64, Option<f64>, Option<f64>, Option<f64>);
    let rows: Vec<Row> = sqlx::query_as(
        "WITH r AS (
            SELECT floor(extract(epoch FROM reserved_at - $2))::bigint AS reserved_s,
                   floor(extract(epoch FROM decided_at - $2))::bigint AS decided_s,
                   outcome,
                   extract(epoch FROM decided_at - reserved_at)::float8 * 1000 AS e2e_ms
            FROM reservations WHERE activity_id = $1
         ), reserved AS (
            SELECT reserved_s AS s, count(*) AS n FROM r GROUP BY 1
         ), decided AS (
            SELECT decided_s AS s, count(*) AS n,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY e2e_ms) AS p50,
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY e2e_ms) AS p99,
                   percentile_cont(0.999) WITHIN GROUP (ORDER BY e2e_ms) AS p999
            FROM r WHERE outcome = 'ORDER_CREATED' GROUP BY 1
         )
         SELECT coalesce(reserved.s, decided.s), coalesce(reserved.n, 0), coalesce(decided.n, 0),
                decided.p50, decided.p99, decided.p999
         FROM reserved FULL JOIN decided ON reserved.s = decided.s
         ORDER BY 1",
    )
    .bind(activity)
    .bind(since)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(second, reserved, orders_created, p50, p99, p999)| SecondFacts {
                second,
                reserved,
                orders_created,
                end_to_end_ms: match (p50, p99, p999) {
                    (Some(a), Some(b), Some(c)) => Some([a, b, c]),
                    _ => None,
                },
            },
        )
        .collect())
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
