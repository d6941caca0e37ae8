//! The invariants of docs/architecture.md §12, checked against PostgreSQL and Redis.
//! Each check returns a verdict and, when it fails, the ids that break it.
//! Read-only: reconcile never repairs anything.

use crate::domain::ids::ActivityId;
use crate::reservation::{ReservationError, ReservationStore};
use serde::Serialize;
use sqlx::PgPool;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    Pass,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub invariant: &'static str,
    pub verdict: Verdict,
    /// The measured figures behind the verdict.
    pub evidence: String,
    /// Up to 10 offending ids.
    pub counterexamples: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub activity_id: ActivityId,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.verdict == Verdict::Pass)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Redis(#[from] ReservationError),
}

fn check(invariant: &'static str, evidence: String, counterexamples: Vec<String>) -> Check {
    Check {
        invariant,
        verdict: if counterexamples.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        evidence,
        counterexamples,
    }
}

async fn ids(pool: &PgPool, sql: &str, activity: ActivityId) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(sql).bind(activity).fetch_all(pool).await
}

pub async fn run(
    pool: &PgPool,
    store: &ReservationStore,
    activity: ActivityId,
) -> Result<Report, ReconcileError> {
    let mut checks = Vec::new();

    let per_sku = crate::ops::activity::pg_stock(pool, activity).await?;

    let oversold: Vec<String> = per_sku
        .iter()
        .filter(|(_, total, _, valid)| valid > total)
        .map(|(sku, total, _, valid)| format!("sku {sku}: {valid} valid orders > stock {total}"))
        .collect();
    let (total, valid): (i64, i64) = per_sku.iter().fold((0, 0), |(t, v), r| (t + r.1, v + r.3));
    checks.push(check(
        "valid orders <= initial PostgreSQL stock",
        format!("{valid} valid orders, stock {total}"),
        oversold,
    ));

    let dup_users = ids(
        pool,
        "SELECT user_id::text FROM orders WHERE activity_id = $1 AND status <> 'CANCELED'
         GROUP BY user_id HAVING count(*) > 1 LIMIT 10",
        activity,
    )
    .await?;
    checks.push(check(
        "valid orders per user <= 1",
        "per (activity, user)".into(),
        dup_users,
    ));

    let dup_effects = ids(
        pool,
        "SELECT l.reservation_id FROM inventory_ledger l WHERE l.activity_id = $1
         GROUP BY l.reservation_id, l.reason HAVING count(*) > 1
         UNION ALL
         SELECT r.message_id FROM reservations r WHERE r.activity_id = $1 AND r.outcome = 'ORDER_CREATED'
           AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.reservation_id = r.reservation_id)
         LIMIT 10",
        activity,
    )
    .await?;
    checks.push(check(
        "business effect per message_id <= 1",
        "ledger rows per reservation and reason; every ORDER_CREATED has its order".into(),
        dup_effects,
    ));

    let comp = ids(
        pool,
        "SELECT r.reservation_id FROM reservations r WHERE r.activity_id = $1
           AND r.outcome IN ('REJECTED_NO_STOCK', 'REJECTED_DUPLICATE', 'REJECTED_EXPIRED')
           AND NOT EXISTS (SELECT 1 FROM compensation_tasks c WHERE c.reservation_id = r.reservation_id)
         UNION ALL
         SELECT o.reservation_id FROM orders o WHERE o.activity_id = $1 AND o.status = 'CANCELED'
           AND NOT EXISTS (SELECT 1 FROM compensation_tasks c
                           WHERE c.reservation_id = o.reservation_id AND c.source = 'CANCELLATION')
         UNION ALL
         SELECT o.reservation_id FROM orders o WHERE o.activity_id = $1 AND o.status <> 'CANCELED'
           AND EXISTS (SELECT 1 FROM compensation_tasks c WHERE c.reservation_id = o.reservation_id)
         LIMIT 10",
        activity,
    )
    .await?;
    checks.push(check(
        "compensations per reservation = 1 where owed, 0 otherwise (<= 1 by key)",
        "every rejection and every canceled order has one task; no valid order has one".into(),
        comp,
    ));

    let (settled, unsettled): (i64, Vec<String>) = {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM compensation_tasks WHERE activity_id = $1 AND status <> 'PENDING'",
        )
        .bind(activity)
        .fetch_one(pool)
        .await?;
        let pending = ids(
            pool,
            "SELECT reservation_id || ' (' || status || ', ' || source || ')' FROM compensation_tasks
             WHERE activity_id = $1 AND status IN ('PENDING', 'ORPHANED')
             ORDER BY created_at LIMIT 10",
            activity,
        )
        .await?;
        (n, pending)
    };
    checks.push(check(
        "compensations released in Redis (once quiet)",
        format!(
            "{settled} settled; PENDING ones are released by the compensation consumer or sweep"
        ),
        unsettled,
    ));

    let paid_canceled = ids(
        pool,
        "SELECT o.order_id FROM orders o WHERE o.activity_id = $1
           AND (o.status = 'CANCELED' AND o.paid_at IS NOT NULL
                OR o.status = 'PAID' AND EXISTS (
                    SELECT 1 FROM inventory_ledger l
                    WHERE l.reservation_id = o.reservation_id AND l.reason = 'ORDER_CANCELED'))
         LIMIT 10",
        activity,
    )
    .await?;
    checks.push(check(
        "paid orders canceled = 0",
        "no canceled order was paid; no paid order gave its stock back".into(),
        paid_canceled,
    ));

    let pg_broken: Vec<String> = per_sku
        .iter()
        .filter(|(_, total, avail, valid)| avail + valid != *total)
        .map(|(sku, total, avail, valid)| {
            format!("sku {sku}: available {avail} + valid {valid} != total {total}")
        })
        .collect();
    let avail: i64 = per_sku.iter().map(|r| r.2).sum();
    checks.push(check(
        "PostgreSQL conservation: available + valid orders = total",
        format!("{avail} + {valid} vs {total}"),
        pg_broken,
    ));

    let mut redis_stock = 0i64;
    for (sku, ..) in &per_sku {
        redis_stock += store.stock(activity, *sku).await?.unwrap_or(0);
    }
    let live = store.live_reservations(activity).await? as i64;
    let pending = store.pending_count(activity).await?;
    let redis_ok = redis_stock + live == total;
    checks.push(check(
        "Redis conservation: stock + live reservations = initial (once quiet)",
        format!("{redis_stock} + {live} vs {total}; {pending} reservation(s) still pending send"),
        if redis_ok {
            Vec::new()
        } else {
            vec![format!("off by {}", redis_stock + live - total)]
        },
    ));

    Ok(Report {
        activity_id: activity,
        checks,
    })
}
