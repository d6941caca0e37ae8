//! Activities and their stock on both sides: PostgreSQL inventory (the
//! final truth) and Redis stock (the fast path), seeded together so that
//! conservation holds from the first request (docs/architecture.md §12).

use crate::domain::auth::Actor;
use crate::domain::ids::{ActivityId, SkuId};
use crate::reservation::{ReservationError, ReservationStore, RetireOutcome, SeedOutcome};
use crate::store::audit;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ActivityError {
    #[error(
        "activity {activity} sku {sku} already has stock (PostgreSQL total {pg_total}, Redis {redis:?}); pass --force to overwrite"
    )]
    AlreadyExists {
        activity: ActivityId,
        sku: SkuId,
        pg_total: i64,
        redis: Option<i64>,
    },
    #[error(
        "activity {activity} sku {sku} already has {orders} order(s); re-seeding it would break conservation"
    )]
    HasOrders {
        activity: ActivityId,
        sku: SkuId,
        orders: i64,
    },
    #[error("activity {0} does not exist; create it with `seckillctl activity create`")]
    NotFound(ActivityId),
    #[error("stock must be between 0 and 10,000,000, got {0}")]
    BadStock(i64),
    #[error("{what} must be between 1 ms and 7 days, got {ms} ms")]
    BadWindow { what: &'static str, ms: i64 },
    #[error(
        "activity {activity} still has {live} live reservation(s) and {pending} pending send(s) in Redis; re-seeding now would admit more than the stock"
    )]
    LiveReservations {
        activity: ActivityId,
        live: u64,
        pending: u64,
    },
    #[error("--force re-seeds stock under a running sale: --reason must say why")]
    NoReason,
    #[error("ending a sale stops its reservations: --reason must say why")]
    EndNeedsReason,
    #[error("--in must be at most 7 days, got {0:?}")]
    BadEnd(Duration),
    #[error(
        "activity {activity} ended at {ends_at}; an ended sale cannot be seeded again: create a new activity id"
    )]
    Ended {
        activity: ActivityId,
        ends_at: DateTime<Utc>,
    },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Redis(#[from] ReservationError),
}

#[derive(Debug, Clone)]
pub struct NewActivity {
    pub activity: ActivityId,
    pub sku: SkuId,
    pub stock: i64,
    pub valid_for_ms: i64,
    pub pay_within_ms: i64,
    pub force: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SkuStock {
    pub sku_id: SkuId,
    pub pg_total: i64,
    pub pg_available: i64,
    pub pg_valid_orders: i64,
    pub redis_stock: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ActivityView {
    pub activity_id: ActivityId,
    pub valid_for_ms: i64,
    pub pay_within_ms: i64,
    pub redis_live_reservations: u64,
    pub redis_pending: u64,
    pub skus: Vec<SkuStock>,
    /// When `activity end` ends (or ended) the sale (docs/architecture.md §16.3).
    #[serde(default)]
    pub ends_at: Option<DateTime<Utc>>,
    /// When the sweeps took it out of Redis (§16.3).
    #[serde(default)]
    pub retired_at: Option<DateTime<Utc>>,
}

pub use crate::reservation::MAX_WINDOW_MS;

/// Seeds PostgreSQL first (in one transaction), then Redis. If Redis fails
/// after the commit, running the command again with `--force` repairs it.
///
/// The checks run before anything is written, in this order: the figures,
/// under the activity row's lock that the sale has not ended, Redis' live
/// reservations, then under the inventory row's lock the
/// existing stock on both sides and the orders (docs/architecture.md §12:
/// conservation must hold from the first request).
pub async fn create(
    pool: &PgPool,
    store: &ReservationStore,
    a: &NewActivity,
) -> Result<ActivityView, ActivityError> {
    check_figures(a)?;
    let mut tx = pool.begin().await?;
    check_not_ended(&mut tx, a.activity).await?;
    check_no_live_reservations(store, a.activity).await?;
    check_not_seeded(&mut tx, store, a).await?;
    check_no_orders(&mut tx, a).await?;
    write_pg(&mut tx, a).await?;
    let epoch = crate::ops::redis_state::begin_epoch(
        &mut tx,
        a.activity,
        crate::domain::status::RedisEpochKind::Seed,
        "activity create",
        "seeded",
        serde_json::json!({ "sku_id": a.sku.0, "stock": a.stock }),
    )
    .await?;
    tx.commit().await?;
    match store
        .seed_stock(a.activity, a.sku, a.stock, true, epoch)
        .await?
    {
        SeedOutcome::Seeded | SeedOutcome::AlreadySeeded { .. } => {}
    }
    show(pool, store, a.activity).await
}

/// [`create`], audited (docs/security.md, "What is audited"): Redis and
/// PostgreSQL both change, so an intent row with both sides as they were
/// is committed first and completed with the outcome. A forced re-seed
/// needs a reason; both the CLI's `--direct` path and the operator API
/// call this, so the rule holds on either.
pub async fn create_audited(
    pool: &PgPool,
    store: &ReservationStore,
    a: &NewActivity,
    reason: Option<&str>,
    actor: &Actor,
) -> Result<ActivityView, ActivityError> {
    let reason = reason.map(str::trim).filter(|r| !r.is_empty());
    if a.force && reason.is_none() {
        return Err(ActivityError::NoReason);
    }
    let command = if a.force {
        "activity create --force"
    } else {
        "activity create"
    };
    let before = show(pool, store, a.activity).await.ok();
    let entry = audit::Entry::new(command, vec![a.activity.to_string(), a.sku.to_string()])
        .reason(reason)
        .before(&before);
    let id = audit::open(pool, actor, &entry).await?;
    let done = create(pool, store, a).await;
    audit::finish(pool, id, &done).await?;
    done
}

/// The stock and both windows are in range (pure).
fn check_figures(a: &NewActivity) -> Result<(), ActivityError> {
    if !(0..=10_000_000).contains(&a.stock) {
        return Err(ActivityError::BadStock(a.stock));
    }
    for (what, ms) in [
        ("--valid-for", a.valid_for_ms),
        ("--pay-within", a.pay_within_ms),
    ] {
        if !(1..=MAX_WINDOW_MS).contains(&ms) {
            return Err(ActivityError::BadWindow { what, ms });
        }
    }
    Ok(())
}

/// Live reservations hold units the new stock figure would count again.
async fn check_no_live_reservations(
    store: &ReservationStore,
    activity: ActivityId,
) -> Result<(), ActivityError> {
    let (live, pending) = (
        store.live_reservations(activity).await?,
        store.pending_count(activity).await?,
    );
    if live > 0 || pending > 0 {
        return Err(ActivityError::LiveReservations {
            activity,
            live,
            pending,
        });
    }
    Ok(())
}

/// An ended sale stays ended: seeding it again would reopen it under the
/// retirement's feet (docs/architecture.md §16.3). Locks the activity row.
async fn check_not_ended(
    tx: &mut Transaction<'static, Postgres>,
    activity: ActivityId,
) -> Result<(), ActivityError> {
    let ends_at: Option<Option<DateTime<Utc>>> =
        sqlx::query_scalar("SELECT ends_at FROM activities WHERE activity_id = $1 FOR UPDATE")
            .bind(activity)
            .fetch_optional(&mut **tx)
            .await?;
    match ends_at.flatten() {
        Some(ends_at) => Err(ActivityError::Ended { activity, ends_at }),
        None => Ok(()),
    }
}

/// Neither side holds stock for this SKU yet, unless `--force`. Locks the
/// inventory row (if any) for the rest of `tx`.
async fn check_not_seeded(
    tx: &mut Transaction<'static, Postgres>,
    store: &ReservationStore,
    a: &NewActivity,
) -> Result<(), ActivityError> {
    let existing: Option<i64> = sqlx::query_scalar(
        "SELECT total_stock FROM inventory WHERE activity_id = $1 AND sku_id = $2 FOR UPDATE",
    )
    .bind(a.activity)
    .bind(a.sku)
    .fetch_optional(&mut **tx)
    .await?;
    let redis_now = store.stock(a.activity, a.sku).await?;
    if (existing.is_some() || redis_now.is_some()) && !a.force {
        return Err(ActivityError::AlreadyExists {
            activity: a.activity,
            sku: a.sku,
            pg_total: existing.unwrap_or(0),
            redis: redis_now,
        });
    }
    Ok(())
}

/// No order exists for this SKU: re-seeding under one would break
/// conservation, `--force` or not.
async fn check_no_orders(
    tx: &mut Transaction<'static, Postgres>,
    a: &NewActivity,
) -> Result<(), ActivityError> {
    let orders: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE activity_id = $1 AND sku_id = $2")
            .bind(a.activity)
            .bind(a.sku)
            .fetch_one(&mut **tx)
            .await?;
    if orders > 0 {
        return Err(ActivityError::HasOrders {
            activity: a.activity,
            sku: a.sku,
            orders,
        });
    }
    Ok(())
}

/// Upserts the activity's windows, then the SKU's stock (total and
/// available alike).
async fn write_pg(
    tx: &mut Transaction<'static, Postgres>,
    a: &NewActivity,
) -> Result<(), ActivityError> {
    sqlx::query(
        "INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES ($1, $2, $3)
         ON CONFLICT (activity_id) DO UPDATE SET valid_for_ms = EXCLUDED.valid_for_ms,
             pay_within_ms = EXCLUDED.pay_within_ms, updated_at = now()",
    )
    .bind(a.activity)
    .bind(a.valid_for_ms)
    .bind(a.pay_within_ms)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock) VALUES ($1, $2, $3, $3)
         ON CONFLICT (activity_id, sku_id) DO UPDATE SET total_stock = $3, available_stock = $3, updated_at = now()",
    )
    .bind(a.activity)
    .bind(a.sku)
    .bind(a.stock)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// PostgreSQL's side of every SKU: (sku, total, available, valid orders).
pub async fn pg_stock(
    pool: &PgPool,
    activity: ActivityId,
) -> Result<Vec<(SkuId, i64, i64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT i.sku_id, i.total_stock, i.available_stock,
                (SELECT count(*) FROM orders o WHERE o.activity_id = i.activity_id AND o.sku_id = i.sku_id
                   AND o.status <> 'CANCELED')
         FROM inventory i WHERE i.activity_id = $1 ORDER BY i.sku_id",
    )
    .bind(activity)
    .fetch_all(pool)
    .await
}

pub async fn show(
    pool: &PgPool,
    store: &ReservationStore,
    activity: ActivityId,
) -> Result<ActivityView, ActivityError> {
    type Row = (i64, i64, Option<DateTime<Utc>>, Option<DateTime<Utc>>);
    let row: Option<Row> = sqlx::query_as(
        "SELECT valid_for_ms, pay_within_ms, ends_at, retired_at FROM activities WHERE activity_id = $1",
    )
    .bind(activity)
    .fetch_optional(pool)
    .await?;
    let Some((valid_for_ms, pay_within_ms, ends_at, retired_at)) = row else {
        return Err(ActivityError::NotFound(activity));
    };
    let rows = pg_stock(pool, activity).await?;
    let mut skus = Vec::with_capacity(rows.len());
    for (sku_id, pg_total, pg_available, pg_valid_orders) in rows {
        skus.push(SkuStock {
            sku_id,
            pg_total,
            pg_available,
            pg_valid_orders,
            redis_stock: store.stock(activity, sku_id).await?,
        });
    }
    Ok(ActivityView {
        activity_id: activity,
        valid_for_ms,
        pay_within_ms,
        redis_live_reservations: store.live_reservations(activity).await?,
        redis_pending: store.pending_count(activity).await?,
        skus,
        ends_at,
        retired_at,
    })
}

/// What `activity end` did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EndView {
    pub activity_id: ActivityId,
    /// When reservations stop: now plus `--in`, or the earlier end an
    /// earlier call already set.
    pub ends_at: DateTime<Utc>,
    /// An earlier `activity end` had already set an end no later than this
    /// one asked for; nothing changed.
    pub already_ended: bool,
}

/// The longest `--in` of an `activity end`.
pub const MAX_END_IN: Duration = Duration::from_secs(7 * 24 * 3600);

/// Ends a sale at PostgreSQL's `now() + within` (docs/architecture.md
/// §16.3). Every engine's ingress answers `410 ACTIVITY_ENDED` to new
/// requests from then on, at most [`crate::pipeline::ingress::FACTS_FRESH`]
/// later; a request it saw before still gets its reservation back. An
/// end only ever moves earlier: a second call cannot reopen a sale.
pub async fn end(
    pool: &PgPool,
    activity: ActivityId,
    within: Duration,
) -> Result<EndView, ActivityError> {
    if within > MAX_END_IN {
        return Err(ActivityError::BadEnd(within));
    }
    let within_ms = i64::try_from(within.as_millis()).unwrap_or(i64::MAX);
    let row: Option<(DateTime<Utc>, bool)> = sqlx::query_as(
        "WITH asked AS (SELECT now() + $2 * interval '1 millisecond' AS at),
              before AS (SELECT ends_at FROM activities WHERE activity_id = $1 FOR UPDATE)
         UPDATE activities a SET ends_at = LEAST(COALESCE(b.ends_at, asked.at), asked.at),
                updated_at = now()
         FROM asked, before b
         WHERE a.activity_id = $1
         RETURNING a.ends_at, b.ends_at IS NOT NULL AND b.ends_at <= asked.at",
    )
    .bind(activity)
    .bind(within_ms)
    .fetch_optional(pool)
    .await?;
    let Some((ends_at, already_ended)) = row else {
        return Err(ActivityError::NotFound(activity));
    };
    Ok(EndView {
        activity_id: activity,
        ends_at,
        already_ended,
    })
}

/// [`end`], audited; the reason is required (docs/security.md, "What is
/// audited"). The CLI's `--direct` path and the operator API call this.
pub async fn end_audited(
    pool: &PgPool,
    activity: ActivityId,
    within: Duration,
    reason: &str,
    actor: &Actor,
) -> Result<EndView, ActivityError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(ActivityError::EndNeedsReason);
    }
    let entry = audit::Entry::new("activity end", vec![activity.to_string()])
        .reason(Some(reason))
        .before(serde_json::json!({ "in_ms": within.as_millis() as u64 }));
    let id = audit::open(pool, actor, &entry).await?;
    let done = end(pool, activity, within).await;
    audit::finish(pool, id, &done).await?;
    done
}

pub use crate::decide::redis_state::RETIRE_GRACE;

/// How long a retired activity's stock and buyers keys stay in Redis: a
/// late compensation still finds the buyer to free, and reads still see
/// the final stock. The reservation hashes keep their own physical TTL.
pub const RETIRED_KEYS_TTL: Duration = Duration::from_secs(24 * 3600);

/// One activity the retirement pass looked at.
#[derive(Debug, Clone, Serialize)]
pub struct Retirement {
    pub activity_id: ActivityId,
    pub outcome: RetireOutcome,
}

/// Ended activities whose every order is decided: past end + validity +
/// [`RETIRE_GRACE`], no unpaid order (its cancel must still give a unit
/// back to Redis), no pending compensation. PostgreSQL's clock decides.
const RETIRABLE: &str = "SELECT a.activity_id FROM activities a
     WHERE a.retired_at IS NULL AND a.ends_at IS NOT NULL
       AND a.ends_at + (a.valid_for_ms + $1) * interval '1 millisecond' < now()
       AND NOT EXISTS (SELECT 1 FROM orders o
                       WHERE o.activity_id = a.activity_id AND o.status IN ('CREATED', 'PAYING'))
       AND NOT EXISTS (SELECT 1 FROM compensation_tasks c
                       WHERE c.activity_id = a.activity_id AND c.status = 'PENDING')
     ORDER BY a.ends_at LIMIT $2";

/// The sweeps' retirement pass (docs/architecture.md §16.3): each
/// retirable activity leaves Redis (`retire.lua` refuses while a
/// reservation waits for its send, checked inside the script so a late
/// one cannot slip in), then `retired_at` is stamped, which the
/// Redis-state watch reads to leave it out. A crash between the two runs
/// the script again next pass, to the same effect.
pub async fn retire_due(
    pool: &PgPool,
    store: &ReservationStore,
    limit: i64,
) -> Result<Vec<Retirement>, ActivityError> {
    let grace_ms = i64::try_from(RETIRE_GRACE.as_millis()).unwrap_or(i64::MAX);
    let due: Vec<ActivityId> = sqlx::query_scalar(RETIRABLE)
        .bind(grace_ms)
        .bind(limit)
        .fetch_all(pool)
        .await?;
    let mut done = Vec::with_capacity(due.len());
    for activity in due {
        let skus: Vec<SkuId> =
            sqlx::query_scalar("SELECT sku_id FROM inventory WHERE activity_id = $1")
                .bind(activity)
                .fetch_all(pool)
                .await?;
        let outcome = store.retire(activity, &skus, RETIRED_KEYS_TTL).await?;
        if outcome == RetireOutcome::Retired {
            sqlx::query(
                "UPDATE activities SET retired_at = now(), updated_at = now()
                 WHERE activity_id = $1 AND retired_at IS NULL",
            )
            .bind(activity)
            .execute(pool)
            .await?;
        }
        done.push(Retirement {
            activity_id: activity,
            outcome,
        });
    }
    Ok(done)
}
