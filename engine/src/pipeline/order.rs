//! The order lifecycle after creation (docs/architecture.md §8): payment and
//! the cancel of an unpaid order.
//!
//! Both are one conditional `UPDATE` on the order's status, so a payment and
//! a cancel racing on the same order serialize on its row lock and exactly
//! one of them matches: PostgreSQL re-checks the `WHERE` clause against the
//! row the winner committed. Nothing else decides the race.
//!
//! Inputs: an order id (from the pay endpoint, `seckillctl order pay|cancel`,
//! the cancel consumer or the cancel sweep). Outputs, committed with the
//! status change: `event_outbox` rows (`ORDER_PAID`, `ORDER_CANCELED`,
//! `RELEASE_RESERVATION`) and, for a cancel only, the ledger row, the stock
//! unit back in `inventory` and the `compensation_tasks` row. Why an update
//! matched nothing is a pure function of the order row ([`cancel_noop`],
//! [`pay_refusal`]).

use crate::domain::auth::Actor;
use crate::domain::ids::{ActivityId, MessageId, OrderId, ReservationId, SkuId, UserId};
use crate::domain::message::SCHEMA_VERSION;
use crate::domain::message::{
    OrderEvent, RELEASE_RESERVATION_EVENT, ReleaseReservation, TAG_RELEASE_RESERVATION, json,
};
pub use crate::domain::status::CancelNoop;
use crate::domain::status::{CompensationSource, OrderStatus};
use crate::mq::{Names, TopicKind};
use crate::store::audit::{self, Entry};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Postgres, Transaction};

/// The columns every lifecycle statement returns.
const COLUMNS: &str = "order_id, reservation_id, activity_id, sku_id, user_id, status, \
     expires_at, payment_id, paid_at, canceled_at, cancel_reason, aggregate_version, \
     created_at, now() AS tx_now";

/// One order as the lifecycle sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, sqlx::FromRow)]
pub struct OrderRow {
    pub order_id: OrderId,
    pub reservation_id: ReservationId,
    pub activity_id: ActivityId,
    pub sku_id: SkuId,
    pub user_id: UserId,
    pub status: OrderStatus,
    pub expires_at: DateTime<Utc>,
    pub payment_id: Option<String>,
    pub paid_at: Option<DateTime<Utc>>,
    pub canceled_at: Option<DateTime<Utc>>,
    pub cancel_reason: Option<String>,
    pub aggregate_version: i64,
    pub created_at: DateTime<Utc>,
    /// The transaction's clock: what the conditions were evaluated against.
    #[serde(skip)]
    pub tx_now: DateTime<Utc>,
}

/// What a cancel attempt did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CancelOutcome {
    /// This call canceled the order; the stock and the Redis release are
    /// committed with it.
    Canceled { order: Box<OrderRow> },
    NoOp {
        reason: CancelNoop,
        order: Option<Box<OrderRow>>,
    },
}

/// Which cancels are allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelMode {
    /// Only once `expires_at` has passed: the delayed cancel and the sweep.
    IfDue,
    /// Now, whatever the pay window: an operator's decision.
    Now,
}

/// Why the cancel's conditional update matched nothing, from the order as
/// it stands after the update (pure; docs/architecture.md §8).
pub fn cancel_noop(order: Option<&OrderRow>) -> CancelNoop {
    match order {
        None => CancelNoop::UnknownOrder,
        Some(o) => match o.status {
            OrderStatus::Paid => CancelNoop::AlreadyPaid,
            OrderStatus::Canceled => CancelNoop::AlreadyCanceled,
            // Still unpaid, so the only condition that failed is the time.
            OrderStatus::Created | OrderStatus::Paying => CancelNoop::NotYetDue,
        },
    }
}

/// What a payment attempt did. The answer says plainly who won.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PayOutcome {
    /// This call paid the order.
    Paid {
        order: Box<OrderRow>,
    },
    /// An earlier payment won; `order.payment_id` says which.
    AlreadyPaid {
        order: Box<OrderRow>,
    },
    /// The cancel won: the stock went back, and the order cannot be paid.
    Canceled {
        order: Box<OrderRow>,
    },
    /// The pay window closed; the cancel is due and will win.
    WindowClosed {
        order: Box<OrderRow>,
    },
    UnknownOrder,
}

impl PayOutcome {
    pub fn label(&self) -> &'static str {
        match self {
            PayOutcome::Paid { .. } => "PAID",
            PayOutcome::AlreadyPaid { .. } => "ALREADY_PAID",
            PayOutcome::Canceled { .. } => "CANCELED",
            PayOutcome::WindowClosed { .. } => "WINDOW_CLOSED",
            PayOutcome::UnknownOrder => "UNKNOWN_ORDER",
        }
    }

    pub fn order(&self) -> Option<&OrderRow> {
        match self {
            PayOutcome::Paid { order }
            | PayOutcome::AlreadyPaid { order }
            | PayOutcome::Canceled { order }
            | PayOutcome::WindowClosed { order } => Some(order),
            PayOutcome::UnknownOrder => None,
        }
    }
}

/// Why the pay's conditional update matched nothing (pure).
pub fn pay_refusal(order: Option<OrderRow>) -> PayOutcome {
    match order {
        None => PayOutcome::UnknownOrder,
        Some(o) => match o.status {
            OrderStatus::Paid => PayOutcome::AlreadyPaid { order: Box::new(o) },
            OrderStatus::Canceled => PayOutcome::Canceled { order: Box::new(o) },
            OrderStatus::Created | OrderStatus::Paying => {
                PayOutcome::WindowClosed { order: Box::new(o) }
            }
        },
    }
}

/// A payment id the pay endpoint and `seckillctl order pay` accept.
pub fn check_payment_id(id: &str) -> Result<(), &'static str> {
    if id.is_empty() || id.len() > 128 {
        Err("payment_id must be 1 to 128 characters")
    } else {
        Ok(())
    }
}

/// Reads one order.
pub async fn get(pool: &PgPool, id: &OrderId) -> Result<Option<OrderRow>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {COLUMNS} FROM orders WHERE order_id = $1"))
        .bind(id)
        .fetch_optional(pool)
        .await
}

/// Reads one order and locks it for the rest of `tx`: the state before a
/// mutation, for its audit row.
async fn get_for_update(
    tx: &mut Transaction<'static, Postgres>,
    id: &OrderId,
) -> Result<Option<OrderRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM orders WHERE order_id = $1 FOR UPDATE"
    ))
    .bind(id)
    .fetch_optional(&mut **tx)
    .await
}

/// Pays an order if it is unpaid and its pay window is open (docs/architecture.md §8.4),
/// with its `ORDER_PAID` event and its audit row (docs/security.md) in the
/// same transaction. A refused payment is audited too: who tried matters
/// most when the cancel won.
pub async fn pay(
    pool: &PgPool,
    names: &Names,
    id: &OrderId,
    payment_id: &str,
    actor: &Actor,
) -> Result<PayOutcome, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let before = get_for_update(&mut tx, id).await?;
    let paid: Option<OrderRow> = sqlx::query_as(&format!(
        "UPDATE orders
         SET status = 'PAID', paid_at = now(), payment_id = $2,
             aggregate_version = aggregate_version + 1, updated_at = now()
         WHERE order_id = $1 AND status IN ('CREATED', 'PAYING') AND expires_at > now()
         RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(payment_id)
    .fetch_optional(&mut *tx)
    .await?;
    let out = match paid {
        Some(order) => {
            let event = order_event(&order);
            insert_outbox(&mut tx, &[event.into_row(names)]).await?;
            PayOutcome::Paid {
                order: Box::new(order),
            }
        }
        None => pay_refusal(before.clone()),
    };
    let entry = Entry::new("order pay", vec![id.to_string(), payment_id.to_owned()])
        .before(&before)
        .after(out.order())
        .outcome(out.label());
    audit::record(&mut tx, actor, &entry).await?;
    tx.commit().await?;
    Ok(out)
}

/// An operator's cancel, now (docs/architecture.md §8.3), with its audit
/// row in the same transaction as the cancel.
pub async fn cancel_by(
    pool: &PgPool,
    names: &Names,
    id: &OrderId,
    reason: &str,
    actor: &Actor,
) -> Result<CancelOutcome, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let before = get_for_update(&mut tx, id).await?;
    let cause = MessageId::generate();
    let out = cancel_in(&mut tx, names, id, CancelMode::Now, reason, cause.as_str()).await?;
    let (label, after) = match &out {
        CancelOutcome::Canceled { order } => ("CANCELED".to_owned(), Some(order.as_ref())),
        CancelOutcome::NoOp { reason, order } => {
            (format!("NOOP_{}", reason.as_str()), order.as_deref())
        }
    };
    let entry = Entry::new("order cancel", vec![id.to_string()])
        .reason(Some(reason))
        .before(&before)
        .after(after)
        .outcome(label);
    audit::record(&mut tx, actor, &entry).await?;
    tx.commit().await?;
    Ok(out)
}

/// Cancels an unpaid order in `tx` (docs/architecture.md §8.3). Only when the status
/// changes does the same transaction write the ledger row, give the unit
/// back to `inventory`, open the compensation task and queue the Redis
/// release and the `ORDER_CANCELED` event. `cause` is the message (or the
/// sweep's own id) recorded on the ledger row.
///
/// The statements run in this order, all in `tx`: the conditional update;
/// then either the read that says why it matched nothing, or the stock
/// return (one statement) and the event's outbox row.
pub async fn cancel_in(
    tx: &mut Transaction<'static, Postgres>,
    names: &Names,
    id: &OrderId,
    mode: CancelMode,
    reason: &str,
    cause: &str,
) -> Result<CancelOutcome, sqlx::Error> {
    let mut owed = StockOwed::default();
    let out = cancel_owing(tx, names, id, mode, reason, cause, &mut owed).await?;
    owed.give_back(tx).await?;
    Ok(out)
}

/// Units a transaction has taken back from canceled orders (their ledger
/// rows written) and not yet added to `inventory`, per (activity, SKU).
///
/// Every cancel of a sale's SKU updates the same inventory row, and the
/// row stays locked until the transaction commits: a batch of cancels that
/// updated it one by one would hold it for the whole batch and make every
/// other cancel wait (docs/architecture.md §8.2). Adding the batch's units
/// in one statement at its end holds it for one statement and the commit.
#[derive(Debug, Default)]
pub struct StockOwed(std::collections::BTreeMap<(ActivityId, SkuId), i64>);

impl StockOwed {
    /// Adds the units to `inventory` in `tx`, in key order (so two batches
    /// lock the rows in the same order), and forgets them.
    pub async fn give_back(
        &mut self,
        tx: &mut Transaction<'static, Postgres>,
    ) -> Result<(), sqlx::Error> {
        for ((activity, sku), n) in std::mem::take(&mut self.0) {
            sqlx::query(
                "UPDATE inventory SET available_stock = available_stock + $3, updated_at = now()
                 WHERE activity_id = $1 AND sku_id = $2",
            )
            .bind(activity)
            .bind(sku)
            .bind(n)
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }
}

/// [`cancel_in`] with the inventory update left in `owed`: the caller
/// runs [`StockOwed::give_back`] in the same transaction before it commits.
pub async fn cancel_owing(
    tx: &mut Transaction<'static, Postgres>,
    names: &Names,
    id: &OrderId,
    mode: CancelMode,
    reason: &str,
    cause: &str,
    owed: &mut StockOwed,
) -> Result<CancelOutcome, sqlx::Error> {
    let Some(order) = cancel_if_unpaid(tx, id, mode, reason).await? else {
        return cancel_matched_nothing(tx, id).await;
    };
    let release = release_message(&order, reason, MessageId::generate());
    let (stocked, comp) = return_stock(tx, names, &order, cause, reason, &release).await?;
    if stocked != 1 || comp != 1 {
        tracing::error!(
            order_id = %order.order_id, reservation_id = %order.reservation_id, stocked, comp,
            "canceled an order whose stock was already returned or compensated; not returning it twice"
        );
    }
    *owed.0.entry((order.activity_id, order.sku_id)).or_default() += stocked;
    insert_outbox(tx, &[order_event(&order).into_row(names)]).await?;
    Ok(CancelOutcome::Canceled {
        order: Box::new(order),
    })
}

/// The conditional cancel: the one statement that makes payment and cancel
/// exclusive (docs/architecture.md §8.4). Both lock the order row and
/// PostgreSQL re-checks the `WHERE` against the winner's commit, so it must
/// stay a single `UPDATE ... WHERE status IN (...)`, never a read then a
/// write. `CancelMode::Now` drops only the time condition. Returns the
/// canceled order, or `None` if it matched nothing.
async fn cancel_if_unpaid(
    tx: &mut Transaction<'static, Postgres>,
    id: &OrderId,
    mode: CancelMode,
    reason: &str,
) -> Result<Option<OrderRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE orders
         SET status = 'CANCELED', canceled_at = now(), cancel_reason = $2,
             aggregate_version = aggregate_version + 1, updated_at = now()
         WHERE order_id = $1 AND status IN ('CREATED', 'PAYING')
           AND ($3 OR expires_at <= now())
         RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(reason)
    .bind(mode == CancelMode::Now)
    .fetch_optional(&mut **tx)
    .await
}

/// The no-op answer: reads the order as it stands after the update, in the
/// same transaction, and says why nothing matched ([`cancel_noop`]).
async fn cancel_matched_nothing(
    tx: &mut Transaction<'static, Postgres>,
    id: &OrderId,
) -> Result<CancelOutcome, sqlx::Error> {
    let order: Option<OrderRow> =
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM orders WHERE order_id = $1"))
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
    Ok(CancelOutcome::NoOp {
        reason: cancel_noop(order.as_ref()),
        order: order.map(Box::new),
    })
}

/// The Redis release a cancellation queues (docs/architecture.md §8.5), stamped
/// with the transaction's clock (pure).
fn release_message(order: &OrderRow, reason: &str, release_id: MessageId) -> ReleaseReservation {
    ReleaseReservation {
        schema_version: SCHEMA_VERSION,
        event_type: RELEASE_RESERVATION_EVENT.to_owned(),
        message_id: release_id,
        reservation_id: order.reservation_id.clone(),
        activity_id: order.activity_id,
        sku_id: order.sku_id,
        user_id: order.user_id,
        source: CompensationSource::Cancellation,
        reason: reason.to_owned(),
        created_at: order.tx_now,
    }
}

/// Takes the canceled order's unit back, in one statement: the ledger row
/// (+1), the `CANCELLATION` compensation task and its `RELEASE_RESERVATION`
/// outbox row (docs/architecture.md §8.3). Returns how many ledger rows and
/// compensation tasks it wrote (1 and 1 normally); the caller adds the
/// ledger's units to `inventory` ([`StockOwed`]) in the same transaction.
///
/// The ledger's UNIQUE (reservation_id, reason) makes the stock step
/// idempotent by construction; the status guard of [`cancel_if_unpaid`]
/// already makes it once-only, so a conflict here would mean a hand-edited
/// row.
async fn return_stock(
    tx: &mut Transaction<'static, Postgres>,
    names: &Names,
    order: &OrderRow,
    cause: &str,
    reason: &str,
    release: &ReleaseReservation,
) -> Result<(i64, i64), sqlx::Error> {
    sqlx::query_as(
        "WITH ledger AS (
             INSERT INTO inventory_ledger (reservation_id, order_id, activity_id, sku_id, reason, delta, message_id)
             VALUES ($1, $2, $3, $4, 'ORDER_CANCELED', 1, $5)
             ON CONFLICT (reservation_id, reason) DO NOTHING
             RETURNING reservation_id
         ), comp AS (
             INSERT INTO compensation_tasks (reservation_id, activity_id, sku_id, user_id, source, reason)
             SELECT $1, $3, $4, $6, 'CANCELLATION', $7 FROM ledger
             ON CONFLICT (reservation_id) DO NOTHING
             RETURNING reservation_id
         ), release AS (
             INSERT INTO event_outbox (message_id, topic, tag, message_key, payload)
             SELECT $8, $9, $10, $1, $11 FROM comp
         )
         SELECT (SELECT count(*) FROM ledger), (SELECT count(*) FROM comp)",
    )
    .bind(&order.reservation_id)
    .bind(&order.order_id)
    .bind(order.activity_id)
    .bind(order.sku_id)
    .bind(cause)
    .bind(order.user_id)
    .bind(reason)
    .bind(&release.message_id)
    .bind(names.topic(TopicKind::InventoryCompensate))
    .bind(TAG_RELEASE_RESERVATION)
    .bind(json(release))
    .fetch_one(&mut **tx)
    .await
}

/// Cancels one order in its own transaction (the sweep and the CLI).
pub async fn cancel(
    pool: &PgPool,
    names: &Names,
    id: &OrderId,
    mode: CancelMode,
    reason: &str,
) -> Result<CancelOutcome, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let cause = MessageId::generate();
    let out = cancel_in(&mut tx, names, id, mode, reason, cause.as_str()).await?;
    tx.commit().await?;
    Ok(out)
}

/// An activity's CREATED orders (what a bench may pay).
pub async fn unpaid_ids(pool: &PgPool, activity: ActivityId) -> Result<Vec<OrderId>, sqlx::Error> {
    sqlx::query_scalar("SELECT order_id FROM orders WHERE activity_id = $1 AND status = 'CREATED'")
        .bind(activity)
        .fetch_all(pool)
        .await
}

/// Unpaid orders whose pay window closed more than `grace` ago: their
/// delayed cancel is late or lost (DLQ, a dropped outbox row), so the
/// sweep cancels them itself. Oldest first, at most `limit`.
pub async fn overdue(
    pool: &PgPool,
    grace: std::time::Duration,
    limit: i64,
) -> Result<Vec<OrderId>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT order_id FROM orders
         WHERE status IN ('CREATED', 'PAYING')
           AND expires_at <= now() - make_interval(secs => $1)
         ORDER BY expires_at
         LIMIT $2",
    )
    .bind(grace.as_secs_f64())
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// The order's event right after a change: its status and version.
fn order_event(o: &OrderRow) -> OrderEvent {
    OrderEvent {
        schema_version: SCHEMA_VERSION,
        event_type: OrderEvent::event_type_for(o.status).to_owned(),
        message_id: MessageId::generate(),
        order_id: o.order_id.clone(),
        reservation_id: o.reservation_id.clone(),
        activity_id: o.activity_id,
        sku_id: o.sku_id,
        user_id: o.user_id,
        status: o.status,
        aggregate_version: o.aggregate_version,
        occurred_at: o.tx_now,
    }
}

/// An `event_outbox` row to insert.
pub struct OutboxRow {
    pub message_id: MessageId,
    pub topic: String,
    pub tag: &'static str,
    pub key: String,
    pub payload: serde_json::Value,
    pub deliver_at: Option<DateTime<Utc>>,
}

impl OrderEvent {
    /// The outbox row that publishes this event on ORDER_EVENT.
    pub fn into_row(self, names: &Names) -> OutboxRow {
        OutboxRow {
            message_id: self.message_id.clone(),
            topic: names.topic(TopicKind::OrderEvent),
            tag: OrderEvent::event_type_for(self.status),
            key: self.order_id.to_string(),
            payload: json(&self),
            deliver_at: None,
        }
    }
}

/// Inserts outbox rows in one statement.
pub async fn insert_outbox(
    tx: &mut Transaction<'static, Postgres>,
    rows: &[OutboxRow],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO event_outbox (message_id, topic, tag, message_key, payload, deliver_at)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::timestamptz[])",
    )
    .bind(rows.iter().map(|r| r.message_id.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.topic.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.tag).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.key.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.payload.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.deliver_at).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: OrderStatus) -> OrderRow {
        let now = Utc::now();
        OrderRow {
            order_id: OrderId::generate(),
            reservation_id: ReservationId::generate(),
            activity_id: ActivityId(1),
            sku_id: SkuId(1),
            user_id: UserId(1),
            status,
            expires_at: now,
            payment_id: None,
            paid_at: None,
            canceled_at: None,
            cancel_reason: None,
            aggregate_version: 1,
            created_at: now,
            tx_now: now,
        }
    }

    #[test]
    fn a_cancel_that_matched_nothing_says_why() {
        assert_eq!(cancel_noop(None), CancelNoop::UnknownOrder);
        assert_eq!(
            cancel_noop(Some(&row(OrderStatus::Paid))),
            CancelNoop::AlreadyPaid
        );
        assert_eq!(
            cancel_noop(Some(&row(OrderStatus::Canceled))),
            CancelNoop::AlreadyCanceled
        );
        assert_eq!(
            cancel_noop(Some(&row(OrderStatus::Created))),
            CancelNoop::NotYetDue
        );
        assert_eq!(
            cancel_noop(Some(&row(OrderStatus::Paying))),
            CancelNoop::NotYetDue
        );
    }

    #[test]
    fn a_refused_payment_names_the_winner() {
        assert_eq!(pay_refusal(None).label(), "UNKNOWN_ORDER");
        assert_eq!(
            pay_refusal(Some(row(OrderStatus::Paid))).label(),
            "ALREADY_PAID"
        );
        assert_eq!(
            pay_refusal(Some(row(OrderStatus::Canceled))).label(),
            "CANCELED"
        );
        assert_eq!(
            pay_refusal(Some(row(OrderStatus::Created))).label(),
            "WINDOW_CLOSED"
        );
    }

    #[test]
    fn every_status_has_its_event_type() {
        assert_eq!(
            OrderEvent::event_type_for(OrderStatus::Created),
            "ORDER_CREATED"
        );
        assert_eq!(OrderEvent::event_type_for(OrderStatus::Paid), "ORDER_PAID");
        assert_eq!(
            OrderEvent::event_type_for(OrderStatus::Canceled),
            "ORDER_CANCELED"
        );
    }
}
