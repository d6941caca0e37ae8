//! When Redis loses an activity's state (docs/architecture.md §4.5):
//! the epochs PostgreSQL records, the survey that compares them with
//! Redis, the restore that rebuilds Redis from PostgreSQL, and the
//! reservations that were lost before they were sent.
//!
//! Inputs: the pool and the reservation store. Outputs: [`ActivityRedis`]
//! rows (health, the engine's watcher, the TUI), a [`RestoreReport`], and
//! the `LOST` answer for a reservation id.

use crate::decide::redis_state::{RedisState, judge};
use crate::domain::ids::{ActivityId, ReservationId, SkuId, UserId};
use crate::domain::status::RedisEpochKind;
use crate::reservation::{LiveOrder, ReservationError, ReservationStore, RestoredState};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};

#[derive(Debug, thiserror::Error)]
pub enum RedisStateError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Redis(#[from] ReservationError),
    #[error("activity {0} does not exist, or was never seeded with `seckillctl activity create`")]
    NotSeeded(ActivityId),
    #[error(
        "Redis still holds epoch {redis} of activity {activity} (PostgreSQL's is {pg}): nothing to restore; rebuilding a live activity would count its reservations twice"
    )]
    Intact {
        activity: ActivityId,
        pg: i64,
        redis: i64,
    },
    #[error("--reason must say why (it is kept in redis_epochs)")]
    BlankReason,
    #[error(
        "activity {0} ended and was retired: its Redis keys were let go on purpose (docs/architecture.md §16.3), so there is nothing to restore"
    )]
    Retired(ActivityId),
}

/// Whether the sweeps retired `activity` (docs/architecture.md §16.3):
/// its Redis keys then expire on purpose, so neither a restore nor
/// reconcile's Redis checks apply to it.
pub async fn retired(pool: &PgPool, activity: ActivityId) -> Result<bool, sqlx::Error> {
    let at: Option<Option<DateTime<Utc>>> =
        sqlx::query_scalar("SELECT retired_at FROM activities WHERE activity_id = $1")
            .bind(activity)
            .fetch_optional(pool)
            .await?;
    Ok(at.flatten().is_some())
}

/// One activity's Redis state, as the survey found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ActivityRedis {
    pub activity_id: ActivityId,
    /// PostgreSQL's latest epoch, and when it began.
    pub pg_epoch: i64,
    pub since: DateTime<Utc>,
    /// `None`: the epoch key is gone.
    pub redis_epoch: Option<i64>,
    pub state: RedisState,
}

impl ActivityRedis {
    /// What on-call reads: the state, what the engine does about it, the fix.
    pub fn explain(&self) -> String {
        let found = match self.redis_epoch {
            None => "its epoch key is gone".to_owned(),
            Some(r) => format!("Redis holds epoch {r}"),
        };
        format!(
            "Redis lost activity {a}'s state ({found}; PostgreSQL's epoch is {p}): reservations are refused with 503 REDIS_STATE_LOST; run `seckillctl activity restore --activity {a} --reason \"...\"`",
            a = self.activity_id,
            p = self.pg_epoch,
        )
    }
}

/// Starts a new epoch of the activity's Redis state inside `tx`, with who
/// and why; returns its number. The caller writes it to Redis.
pub async fn begin_epoch(
    tx: &mut Transaction<'static, Postgres>,
    activity: ActivityId,
    kind: RedisEpochKind,
    operator: &str,
    reason: &str,
    detail: serde_json::Value,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO redis_epochs (activity_id, epoch, kind, operator, reason, detail)
         SELECT $1, coalesce(max(epoch), 0) + 1, $2, $3, $4, $5 FROM redis_epochs WHERE activity_id = $1
         RETURNING epoch",
    )
    .bind(activity)
    .bind(kind)
    .bind(operator)
    .bind(reason)
    .bind(detail)
    .fetch_one(&mut **tx)
    .await
}

/// The latest epoch of every live activity: one that still has stock to
/// sell or an unpaid order whose cancel must give its unit back to Redis.
/// A finished sale has nothing left in Redis to lose, and neither has an
/// ended one past its validity and the retirement's grace: its ingress
/// refuses before Redis is asked, and its retirement deletes the epoch on
/// purpose (docs/architecture.md §16.3), so it is left out from that
/// moment, before `retired_at` is stamped. Twice a second per daemon: it
/// reads `orders_by_activity_status`, never a past sale's orders (§16.1).
const LIVE_EPOCHS: &str = "SELECT e.activity_id, e.epoch, e.started_at FROM (
        SELECT DISTINCT ON (activity_id) activity_id, epoch, started_at
        FROM redis_epochs ORDER BY activity_id, epoch DESC) e
     JOIN activities a ON a.activity_id = e.activity_id
     WHERE a.retired_at IS NULL
       AND (a.ends_at IS NULL
            OR a.ends_at + (a.valid_for_ms + $1) * interval '1 millisecond' >= now())
       AND (EXISTS (SELECT 1 FROM inventory i WHERE i.activity_id = e.activity_id AND i.available_stock > 0)
         OR EXISTS (SELECT 1 FROM orders o WHERE o.activity_id = e.activity_id AND o.status IN ('CREATED', 'PAYING')))
     ORDER BY e.activity_id";

const ONE_EPOCH: &str = "SELECT activity_id, epoch, started_at FROM redis_epochs
     WHERE activity_id = $1 ORDER BY epoch DESC LIMIT 1";

/// Every live activity's Redis state: one query and one pipelined read.
pub async fn survey(
    pool: &PgPool,
    store: &ReservationStore,
) -> Result<Vec<ActivityRedis>, RedisStateError> {
    let grace_ms = i64::try_from(crate::decide::redis_state::RETIRE_GRACE.as_millis()).unwrap_or(0);
    let rows: Vec<(ActivityId, i64, DateTime<Utc>)> = sqlx::query_as(LIVE_EPOCHS)
        .bind(grace_ms)
        .fetch_all(pool)
        .await?;
    judge_rows(store, rows).await
}

/// One activity's Redis state, live or not; `None` if it was never seeded.
pub async fn survey_one(
    pool: &PgPool,
    store: &ReservationStore,
    activity: ActivityId,
) -> Result<Option<ActivityRedis>, RedisStateError> {
    let rows: Vec<(ActivityId, i64, DateTime<Utc>)> = sqlx::query_as(ONE_EPOCH)
        .bind(activity)
        .fetch_all(pool)
        .await?;
    Ok(judge_rows(store, rows).await?.pop())
}

async fn judge_rows(
    store: &ReservationStore,
    rows: Vec<(ActivityId, i64, DateTime<Utc>)>,
) -> Result<Vec<ActivityRedis>, RedisStateError> {
    let ids: Vec<ActivityId> = rows.iter().map(|r| r.0).collect();
    let found = store.epochs(&ids).await?;
    Ok(rows
        .into_iter()
        .zip(found)
        .map(
            |((activity_id, pg_epoch, since), redis_epoch)| ActivityRedis {
                activity_id,
                pg_epoch,
                since,
                redis_epoch,
                state: judge(pg_epoch, redis_epoch),
            },
        )
        .collect())
}

/// Accepted reservations against decided ones (docs/architecture.md §4.5).
/// Once the pipeline is quiet, the difference is what Redis lost before it
/// was sent: PostgreSQL never saw those. The engines' tallies are flushed
/// about once a second and a killed engine loses its last second, so the
/// gap can only be under-counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    pub accepted: i64,
    pub decided: i64,
}

impl Gap {
    pub fn undecided(&self) -> i64 {
        (self.accepted - self.decided).max(0)
    }
}

pub async fn gap(pool: &PgPool, activity: ActivityId) -> Result<Gap, sqlx::Error> {
    let (accepted, decided): (i64, i64) = sqlx::query_as(
        "SELECT coalesce((SELECT sum(accepted) FROM ingress_tallies WHERE activity_id = $1), 0)::bigint,
                (SELECT count(*) FROM reservations WHERE activity_id = $1)",
    )
    .bind(activity)
    .fetch_one(pool)
    .await?;
    Ok(Gap { accepted, decided })
}

/// The reservations earlier restores found lost unsent (their `detail`).
pub async fn restored_lost(pool: &PgPool, activity: ActivityId) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT coalesce(sum((detail->>'lost_unsent')::bigint), 0)::bigint FROM redis_epochs
         WHERE activity_id = $1 AND kind = 'RESTORE'",
    )
    .bind(activity)
    .fetch_one(pool)
    .await
}

/// Adds this process's accepted reservations per activity (its running
/// totals) to `ingress_tallies`.
pub async fn flush_tally(
    pool: &PgPool,
    instance: &str,
    totals: &[(ActivityId, i64)],
) -> Result<(), sqlx::Error> {
    if totals.is_empty() {
        return Ok(());
    }
    let (ids, counts): (Vec<i64>, Vec<i64>) = totals.iter().map(|(a, n)| (a.0, *n)).unzip();
    sqlx::query(
        "INSERT INTO ingress_tallies (instance_id, activity_id, accepted)
         SELECT $1, a, n FROM unnest($2::bigint[], $3::bigint[]) AS t (a, n)
         ON CONFLICT (instance_id, activity_id) DO UPDATE
           SET accepted = GREATEST(ingress_tallies.accepted, EXCLUDED.accepted), updated_at = now()",
    )
    .bind(instance)
    .bind(ids)
    .bind(counts)
    .execute(pool)
    .await?;
    Ok(())
}

/// A reservation neither PostgreSQL nor Redis knows, made while an epoch
/// that a restore later replaced was current: Redis lost it before it was
/// sent, and no order will come of it.
pub async fn lost_before_restore(pool: &PgPool, id: &ReservationId) -> Result<bool, sqlx::Error> {
    let Some(at_ms) = id.created_at_ms() else {
        return Ok(false);
    };
    let Some(at) = DateTime::<Utc>::from_timestamp_millis(at_ms) else {
        return Ok(false);
    };
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM redis_epochs r JOIN redis_epochs p
             ON p.activity_id = r.activity_id AND p.epoch = r.epoch - 1
           WHERE r.kind = 'RESTORE' AND p.started_at <= $1 AND r.started_at > $1)",
    )
    .bind(at)
    .fetch_one(pool)
    .await
}

#[derive(Debug, Clone)]
pub struct RestoreRequest {
    pub activity: ActivityId,
    pub operator: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestoreReport {
    pub activity_id: ActivityId,
    pub previous_epoch: i64,
    pub redis_epoch_found: Option<i64>,
    pub epoch: i64,
    /// Each SKU's stock as written: PostgreSQL's available stock.
    pub stock: Vec<(SkuId, i64)>,
    pub buyers: usize,
    /// Unpaid orders whose reservation hash was written back.
    pub live_orders: usize,
    /// Compensation tasks whose release the rebuilt stock already counts.
    pub settled_compensations: u64,
    /// Accepted reservations PostgreSQL never saw: lost unsent. Their
    /// clients' status queries answer `LOST`.
    pub lost_unsent: i64,
    pub gap: Gap,
}

/// Rebuilds the activity's Redis state from PostgreSQL and reopens it under
/// a new epoch. The caller waits for the order consumer's backlog to drain
/// first, so every message already in flight is decided.
///
/// The inventory rows stay locked from the read to the commit: a cancel
/// (which gives stock back in PostgreSQL, then in Redis through its
/// compensation) cannot slip between what is read and what is written.
pub async fn restore(
    pool: &PgPool,
    store: &ReservationStore,
    req: &RestoreRequest,
) -> Result<RestoreReport, RedisStateError> {
    if req.reason.trim().is_empty() {
        return Err(RedisStateError::BlankReason);
    }
    let found = survey_one(pool, store, req.activity)
        .await?
        .ok_or(RedisStateError::NotSeeded(req.activity))?;
    if let (RedisState::Intact, Some(redis)) = (found.state, found.redis_epoch) {
        return Err(RedisStateError::Intact {
            activity: req.activity,
            pg: found.pg_epoch,
            redis,
        });
    }
    let gap = gap(pool, req.activity).await?;
    let mut tx = pool.begin().await?;
    let stock: Vec<(SkuId, i64)> = sqlx::query_as(
        "SELECT sku_id, available_stock FROM inventory WHERE activity_id = $1 ORDER BY sku_id FOR UPDATE",
    )
    .bind(req.activity)
    .fetch_all(&mut *tx)
    .await?;
    let buyers: Vec<UserId> = sqlx::query_scalar(
        "SELECT DISTINCT user_id FROM orders WHERE activity_id = $1 AND status <> 'CANCELED'",
    )
    .bind(req.activity)
    .fetch_all(&mut *tx)
    .await?;
    let live = live_orders(&mut tx, req.activity).await?;
    let settled = sqlx::query(
        "UPDATE compensation_tasks SET status = 'SETTLED_BY_RESTORE'
         WHERE activity_id = $1 AND status IN ('PENDING', 'ORPHANED')",
    )
    .bind(req.activity)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let lost_unsent = gap.undecided();
    let detail = serde_json::json!({
        "redis_epoch_found": found.redis_epoch,
        "stock": stock.iter().map(|(s, n)| serde_json::json!({"sku_id": s.0, "stock": n})).collect::<Vec<_>>(),
        "buyers": buyers.len(),
        "live_orders": live.len(),
        "settled_compensations": settled,
        "accepted": gap.accepted,
        "decided": gap.decided,
        "lost_unsent": lost_unsent,
    });
    let epoch = begin_epoch(
        &mut tx,
        req.activity,
        RedisEpochKind::Restore,
        &req.operator,
        &req.reason,
        detail,
    )
    .await?;
    let state = RestoredState {
        epoch,
        stock: stock.clone(),
        buyers,
        live,
    };
    store
        .restore(req.activity, &state, Utc::now().timestamp_millis())
        .await?;
    tx.commit().await?;
    Ok(RestoreReport {
        activity_id: req.activity,
        previous_epoch: found.pg_epoch,
        redis_epoch_found: found.redis_epoch,
        epoch,
        stock,
        buyers: state.buyers.len(),
        live_orders: state.live.len(),
        settled_compensations: settled,
        lost_unsent,
        gap,
    })
}

/// Unpaid orders with what their reservation hash held.
async fn live_orders(
    tx: &mut Transaction<'static, Postgres>,
    activity: ActivityId,
) -> Result<Vec<LiveOrder>, sqlx::Error> {
    type Row = (
        ReservationId,
        crate::domain::ids::MessageId,
        crate::domain::ids::RequestId,
        crate::domain::ids::OrderId,
        SkuId,
        UserId,
        DateTime<Utc>,
        DateTime<Utc>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT r.reservation_id, r.message_id, r.request_id, o.order_id, o.sku_id, o.user_id,
                r.reserved_at, r.valid_until
         FROM orders o JOIN reservations r ON r.reservation_id = o.reservation_id
         WHERE o.activity_id = $1 AND o.status IN ('CREATED', 'PAYING')",
    )
    .bind(activity)
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(rsv, msg, req, order, sku, user, at, until)| LiveOrder {
            reservation_id: rsv,
            message_id: msg,
            request_id: req,
            order_id: order,
            sku_id: sku,
            user_id: user,
            reserved_at_ms: at.timestamp_millis(),
            valid_until_ms: until.timestamp_millis(),
        })
        .collect())
}
