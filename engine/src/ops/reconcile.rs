//! The invariants of docs/architecture.md §12, checked against PostgreSQL and Redis.
//! Each check returns a verdict and, when it fails, the ids that break it.
//! Read-only: reconcile never repairs anything.

use crate::domain::ids::{ActivityId, SkuId};
use crate::reservation::{ReservationError, ReservationStore};
use serde::Serialize;
use sqlx::PgPool;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    Pass,
    Fail,
    /// The check reads state that was let go on purpose: a retired
    /// activity's Redis keys once they expired (docs/architecture.md §16.3).
    NotApplicable,
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
        self.checks.iter().all(|c| c.verdict != Verdict::Fail)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Redis(#[from] ReservationError),
}

fn not_applicable(invariant: &'static str, why: &str) -> Check {
    Check {
        invariant,
        verdict: Verdict::NotApplicable,
        evidence: why.to_owned(),
        counterexamples: Vec::new(),
    }
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

/// One SKU as PostgreSQL sees it: (sku, total, available, valid orders),
/// the row of `activity::pg_stock`.
type SkuStock = (SkuId, i64, i64, i64);

/// Runs every check of docs/architecture.md §12.1, in the table's order, and
/// stops at the first source that cannot be read.
pub async fn run(
    pool: &PgPool,
    store: &ReservationStore,
    activity: ActivityId,
) -> Result<Report, ReconcileError> {
    let per_sku = crate::ops::activity::pg_stock(pool, activity).await?;
    let redis = read_redis(store, activity, &per_sku).await?;
    // A retired activity's stock keys expire a day after its retirement:
    // once none is left, Redis has nothing to conserve any more.
    let redis_gone = redis.keys_left == 0
        && !per_sku.is_empty()
        && crate::ops::redis_state::retired(pool, activity).await?;
    let checks = vec![
        within_stock(&per_sku),
        listed(pool, &ONE_VALID_ORDER_PER_USER, activity).await?,
        listed(pool, &ONE_EFFECT_PER_MESSAGE, activity).await?,
        listed(pool, &COMPENSATION_WHERE_OWED, activity).await?,
        compensations_released(pool, activity).await?,
        listed(pool, &PAID_NEVER_CANCELED, activity).await?,
        pg_conservation(&per_sku),
        if redis_gone {
            not_applicable(
                "Redis conservation: stock + live reservations = initial (once quiet)",
                "the activity was retired and its Redis keys have expired (§16.3)",
            )
        } else {
            redis_conservation(&redis, total_stock(&per_sku))
        },
        accepted_decided(
            crate::ops::redis_state::gap(pool, activity).await?,
            redis.live - valid_orders(&per_sku),
            crate::ops::redis_state::restored_lost(pool, activity).await?,
        ),
    ];
    Ok(Report {
        activity_id: activity,
        checks,
    })
}

// ---------------------------------------------------------------------------
// Stock, per SKU (§12.1 rows 1 and 7): pure over `pg_stock`'s rows.
// ---------------------------------------------------------------------------

/// Valid orders never exceed the initial PostgreSQL stock.
fn within_stock(per_sku: &[SkuStock]) -> Check {
    let oversold = per_sku
        .iter()
        .filter(|(_, total, _, valid)| valid > total)
        .map(|(sku, total, _, valid)| format!("sku {sku}: {valid} valid orders > stock {total}"))
        .collect();
    let (total, valid) = (total_stock(per_sku), valid_orders(per_sku));
    check(
        "valid orders <= initial PostgreSQL stock",
        format!("{valid} valid orders, stock {total}"),
        oversold,
    )
}

/// Stock moves only with its ledger rows: available + valid orders = total.
fn pg_conservation(per_sku: &[SkuStock]) -> Check {
    let broken = per_sku
        .iter()
        .filter(|(_, total, avail, valid)| avail + valid != *total)
        .map(|(sku, total, avail, valid)| {
            format!("sku {sku}: available {avail} + valid {valid} != total {total}")
        })
        .collect();
    let avail: i64 = per_sku.iter().map(|r| r.2).sum();
    let (total, valid) = (total_stock(per_sku), valid_orders(per_sku));
    check(
        "PostgreSQL conservation: available + valid orders = total",
        format!("{avail} + {valid} vs {total}"),
        broken,
    )
}

fn total_stock(per_sku: &[SkuStock]) -> i64 {
    per_sku.iter().map(|r| r.1).sum()
}

fn valid_orders(per_sku: &[SkuStock]) -> i64 {
    per_sku.iter().map(|r| r.3).sum()
}

// ---------------------------------------------------------------------------
// Invariants one query's rows break (§12.1 rows 2, 3, 4 and 6): each query
// lists up to 10 counterexamples; none means the invariant holds.
// ---------------------------------------------------------------------------

/// A check whose counterexamples one query lists (`$1` is the activity).
struct Listed {
    invariant: &'static str,
    evidence: &'static str,
    sql: &'static str,
}

/// Enforced by the partial unique index `orders_one_per_user`.
const ONE_VALID_ORDER_PER_USER: Listed = Listed {
    invariant: "valid orders per user <= 1",
    evidence: "per (activity, user)",
    sql: "SELECT user_id::text FROM orders WHERE activity_id = $1 AND status <> 'CANCELED'
         GROUP BY user_id HAVING count(*) > 1 LIMIT 10",
};

/// Duplicate ledger rows, and `ORDER_CREATED` without its order.
const ONE_EFFECT_PER_MESSAGE: Listed = Listed {
    invariant: "business effect per message_id <= 1",
    evidence: "ledger rows per reservation and reason; every ORDER_CREATED has its order",
    sql: "SELECT l.reservation_id FROM inventory_ledger l WHERE l.activity_id = $1
         GROUP BY l.reservation_id, l.reason HAVING count(*) > 1
         UNION ALL
         SELECT r.message_id FROM reservations r WHERE r.activity_id = $1 AND r.outcome = 'ORDER_CREATED'
           AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.reservation_id = r.reservation_id)
         LIMIT 10",
};

/// A rejection or a canceled order without its task; a valid order with one.
const COMPENSATION_WHERE_OWED: Listed = Listed {
    invariant: "compensations per reservation = 1 where owed, 0 otherwise (<= 1 by key)",
    evidence: "every rejection and every canceled order has one task; no valid order has one",
    sql: "SELECT r.reservation_id FROM reservations r WHERE r.activity_id = $1
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
};

/// A canceled order that was paid; a paid order whose stock went back.
const PAID_NEVER_CANCELED: Listed = Listed {
    invariant: "paid orders canceled = 0",
    evidence: "no canceled order was paid; no paid order gave its stock back",
    sql: "SELECT o.order_id FROM orders o WHERE o.activity_id = $1
           AND (o.status = 'CANCELED' AND o.paid_at IS NOT NULL
                OR o.status = 'PAID' AND EXISTS (
                    SELECT 1 FROM inventory_ledger l
                    WHERE l.reservation_id = o.reservation_id AND l.reason = 'ORDER_CANCELED'))
         LIMIT 10",
};

async fn listed(pool: &PgPool, c: &Listed, activity: ActivityId) -> Result<Check, sqlx::Error> {
    let counterexamples = ids(pool, c.sql, activity).await?;
    Ok(check(c.invariant, c.evidence.into(), counterexamples))
}

async fn ids(pool: &PgPool, sql: &str, activity: ActivityId) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(sql).bind(activity).fetch_all(pool).await
}

// ---------------------------------------------------------------------------
// Compensations released (§12.1 row 5): holds once the pipeline is quiet.
// ---------------------------------------------------------------------------

/// Tasks no longer `PENDING`: the evidence.
const SETTLED_TASKS: &str =
    "SELECT count(*) FROM compensation_tasks WHERE activity_id = $1 AND status <> 'PENDING'";

/// Tasks still `PENDING` or `ORPHANED`, oldest first: the counterexamples.
const UNSETTLED_TASKS: &str =
    "SELECT reservation_id || ' (' || status || ', ' || source || ')' FROM compensation_tasks
             WHERE activity_id = $1 AND status IN ('PENDING', 'ORPHANED')
             ORDER BY created_at LIMIT 10";

async fn compensations_released(pool: &PgPool, activity: ActivityId) -> Result<Check, sqlx::Error> {
    let settled: i64 = sqlx::query_scalar(SETTLED_TASKS)
        .bind(activity)
        .fetch_one(pool)
        .await?;
    let unsettled = ids(pool, UNSETTLED_TASKS, activity).await?;
    Ok(check(
        "compensations released in Redis (once quiet)",
        format!(
            "{settled} settled; PENDING ones are released by the compensation consumer or sweep"
        ),
        unsettled,
    ))
}

// ---------------------------------------------------------------------------
// Redis conservation (§12.1 row 8): holds once the pipeline is quiet.
// ---------------------------------------------------------------------------

/// What Redis holds for the activity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RedisFigures {
    /// Stock left, summed over the SKUs PostgreSQL knows (a missing key is 0).
    stock: i64,
    /// Buyers holding a live reservation.
    live: i64,
    /// Reservations still waiting for a confirmed send.
    pending: u64,
    /// SKUs whose stock key is still there.
    keys_left: usize,
}

async fn read_redis(
    store: &ReservationStore,
    activity: ActivityId,
    per_sku: &[SkuStock],
) -> Result<RedisFigures, ReservationError> {
    let (mut stock, mut keys_left) = (0i64, 0);
    for (sku, ..) in per_sku {
        if let Some(s) = store.stock(activity, *sku).await? {
            stock += s;
            keys_left += 1;
        }
    }
    let live = store.live_reservations(activity).await? as i64;
    let pending = store.pending_count(activity).await?;
    Ok(RedisFigures {
        stock,
        live,
        pending,
        keys_left,
    })
}

/// Redis stock + live reservations = PostgreSQL's initial stock.
fn redis_conservation(r: &RedisFigures, total: i64) -> Check {
    let off_by = r.stock + r.live - total;
    check(
        "Redis conservation: stock + live reservations = initial (once quiet)",
        format!(
            "{} + {} vs {total}; {} reservation(s) still pending send",
            r.stock, r.live, r.pending
        ),
        if off_by == 0 {
            Vec::new()
        } else {
            vec![format!("off by {off_by}")]
        },
    )
}

// ---------------------------------------------------------------------------
// Every accepted reservation decided (§4.5): holds once the pipeline is quiet.
// ---------------------------------------------------------------------------

/// Accepted reservations (the engines' tallies) that are neither decided
/// in PostgreSQL nor held in Redis are lost, unless a restore already
/// counted them as lost unsent with Redis' state (their clients get LOST).
/// `held` is what Redis holds without a valid order: reservations still on
/// their way, and those whose message is in the DLQ (the DLQ alert's). The
/// tallies can only under-count, so this never fails for a reservation
/// that was not accepted (pure).
fn accepted_decided(gap: crate::ops::redis_state::Gap, held: i64, restored_lost: i64) -> Check {
    let held = held.max(0);
    let missing = gap.undecided() - held - restored_lost;
    check(
        "accepted reservations decided (once quiet)",
        format!(
            "accepted {} (engines' tallies), decided {}, {held} held in Redis without an order (on their way, or dead-lettered), {restored_lost} lost unsent with Redis' state (restores)",
            gap.accepted, gap.decided
        ),
        if missing > 0 {
            vec![format!(
                "{missing} accepted reservation(s) neither decided nor in Redis"
            )]
        } else {
            Vec::new()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_reservations_must_be_decided_waiting_or_counted_lost() {
        use crate::ops::redis_state::Gap;
        let gap = |accepted, decided| Gap { accepted, decided };
        assert_eq!(accepted_decided(gap(10, 10), 0, 0).verdict, Verdict::Pass);
        assert_eq!(accepted_decided(gap(10, 8), 2, 0).verdict, Verdict::Pass);
        assert_eq!(accepted_decided(gap(10, 7), 0, 3).verdict, Verdict::Pass);
        // Decided without a tally (a killed engine's last second): not a gap.
        assert_eq!(accepted_decided(gap(8, 10), 0, 0).verdict, Verdict::Pass);
        let lost = accepted_decided(gap(10, 7), 1, 0);
        assert_eq!(lost.verdict, Verdict::Fail);
        assert!(
            lost.counterexamples[0].starts_with("2 accepted"),
            "{lost:?}"
        );
    }

    fn sku(id: i64, total: i64, available: i64, valid: i64) -> SkuStock {
        (SkuId(id), total, available, valid)
    }

    #[test]
    fn stock_checks_pass_on_a_balanced_sale() {
        let per_sku = [sku(1, 10, 4, 6), sku(2, 5, 5, 0)];
        let within = within_stock(&per_sku);
        assert_eq!(within.verdict, Verdict::Pass);
        assert_eq!(within.evidence, "6 valid orders, stock 15");
        let pg = pg_conservation(&per_sku);
        assert_eq!(pg.verdict, Verdict::Pass);
        assert_eq!(pg.evidence, "9 + 6 vs 15");
    }

    #[test]
    fn an_oversold_sku_is_named() {
        let per_sku = [sku(1, 10, 0, 10), sku(2, 5, -1, 6)];
        let within = within_stock(&per_sku);
        assert_eq!(within.verdict, Verdict::Fail);
        assert_eq!(within.counterexamples, ["sku 2: 6 valid orders > stock 5"]);
        assert_eq!(within.evidence, "16 valid orders, stock 15");
    }

    #[test]
    fn stock_moved_without_an_order_breaks_pg_conservation() {
        let pg = pg_conservation(&[sku(1, 10, 3, 6), sku(2, 5, 5, 0)]);
        assert_eq!(pg.verdict, Verdict::Fail);
        assert_eq!(
            pg.counterexamples,
            ["sku 1: available 3 + valid 6 != total 10"]
        );
        assert_eq!(pg.evidence, "8 + 6 vs 15");
    }

    #[test]
    fn redis_conservation_names_the_difference() {
        let quiet = RedisFigures {
            stock: 4,
            live: 6,
            pending: 0,
            keys_left: 1,
        };
        let ok = redis_conservation(&quiet, 10);
        assert_eq!(ok.verdict, Verdict::Pass);
        assert_eq!(
            ok.evidence,
            "4 + 6 vs 10; 0 reservation(s) still pending send"
        );
        let leaked = redis_conservation(&RedisFigures { stock: 3, ..quiet }, 10);
        assert_eq!(leaked.verdict, Verdict::Fail);
        assert_eq!(leaked.counterexamples, ["off by -1"]);
    }

    #[test]
    fn no_sku_means_nothing_to_break() {
        assert_eq!(within_stock(&[]).evidence, "0 valid orders, stock 0");
        assert_eq!(pg_conservation(&[]).verdict, Verdict::Pass);
    }
}
