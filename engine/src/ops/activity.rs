//! Activities and their stock on both sides: PostgreSQL inventory (the
//! final truth) and Redis stock (the fast path), seeded together so that
//! conservation holds from the first request (docs/architecture.md §12).

use crate::domain::auth::Actor;
use crate::domain::ids::{ActivityId, SkuId};
use crate::reservation::{ReservationError, ReservationStore, SeedOutcome};
use crate::store::audit;
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres, Transaction};

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
}

pub use crate::reservation::MAX_WINDOW_MS;

/// Seeds PostgreSQL first (in one transaction), then Redis. If Redis fails
/// after the commit, running the command again with `--force` repairs it.
///
/// The checks run before anything is written, in this order: the figures,
/// Redis' live reservations, then under the inventory row's lock the
/// existing stock on both sides and the orders (docs/architecture.md §12:
/// conservation must hold from the first request).
pub async fn create(
    pool: &PgPool,
    store: &ReservationStore,
    a: &NewActivity,
) -> Result<ActivityView, ActivityError> {
    check_figures(a)?;
    check_no_live_reservations(store, a.activity).await?;
    let mut tx = pool.begin().await?;
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
    let row: Option<(i64, i64)> =
        sqlx::query_as("SELECT valid_for_ms, pay_within_ms FROM activities WHERE activity_id = $1")
            .bind(activity)
            .fetch_optional(pool)
            .await?;
    let Some((valid_for_ms, pay_within_ms)) = row else {
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
    })
}
