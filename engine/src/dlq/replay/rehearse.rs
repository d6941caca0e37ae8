//! `dlq replay --rehearse` (docs/architecture.md §9.3): what a replay would
//! do, not only whether it may. The order consumer's own transaction runs
//! for the dead message inside PostgreSQL, its effects are read back in the
//! same transaction, and everything is rolled back. Nothing is sent to the
//! broker and nothing is kept; a database error the replay would hit (the
//! fault not fixed yet) is shown as the consumer would meet it.

use super::single::ReplayError;
use crate::domain::ids::{MessageId, OrderId, SkuId};
use crate::domain::message::parse_order_create;
use crate::domain::status::{
    CompensationSource, CompensationStatus, OrderStatus, ReservationOutcome,
};
use crate::mq::{Names, TopicKind};
use crate::pipeline::consume::{MessageOutcome, Parsed, rehearse_in};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// What the consumer's transaction decided, or the error it hit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "verdict",
    content = "detail",
    rename_all = "SCREAMING_SNAKE_CASE"
)]
pub enum RehearsedVerdict {
    /// It would create this order.
    Created(OrderId),
    /// It would reject the reservation (and compensate it once).
    Rejected(String),
    /// The message (or its reservation) was applied before: a no-op.
    AlreadyApplied(String),
    /// The transaction failed: the replay would fail the same way now.
    Fails(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct RehearsedOrder {
    pub order_id: OrderId,
    pub status: OrderStatus,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct RehearsedLedger {
    pub reason: String,
    pub delta: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct RehearsedOutbox {
    pub topic: String,
    pub tag: String,
    pub message_key: String,
    pub deliver_at: Option<DateTime<Utc>>,
}

/// Everything the replay would write, read inside the rolled-back
/// transaction.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rehearsal {
    pub consumer_group: String,
    pub message_id: MessageId,
    pub verdict: RehearsedVerdict,
    pub order: Option<RehearsedOrder>,
    pub reservation_outcome: Option<ReservationOutcome>,
    /// (sku, available before, available after).
    pub stock: Option<(SkuId, i64, i64)>,
    pub ledger: Vec<RehearsedLedger>,
    pub compensations: Vec<(CompensationSource, CompensationStatus)>,
    pub outbox: Vec<RehearsedOutbox>,
}

#[derive(Debug, thiserror::Error)]
pub enum RehearseError {
    #[error(transparent)]
    Replay(#[from] ReplayError),
    #[error(
        "a rehearsal runs the order consumer's transaction; {group} is not the order-create group: use --dry-run for its pre-checks"
    )]
    NotOrderCreate { group: String },
    #[error("the dead body does not parse ({0}); it can be inspected, not rehearsed")]
    Malformed(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Rehearses the replay of one dead message of the order-create group.
pub async fn rehearse(
    pool: &PgPool,
    names: &Names,
    message_id: &MessageId,
    group: Option<&str>,
) -> Result<Rehearsal, RehearseError> {
    let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(
        "SELECT consumer_group, body FROM dlq_messages
         WHERE message_id = $1 AND ($2::text IS NULL OR consumer_group = $2)",
    )
    .bind(message_id)
    .bind(group)
    .fetch_all(pool)
    .await?;
    let (group, body) = match rows.len() {
        0 => return Err(ReplayError::Unknown(message_id.clone()).into()),
        1 => rows.into_iter().next().expect("one row"),
        _ => {
            return Err(ReplayError::Ambiguous {
                id: message_id.clone(),
                groups: rows
                    .iter()
                    .map(|r| r.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }
            .into());
        }
    };
    if group != names.group(TopicKind::OrderCreate) {
        return Err(RehearseError::NotOrderCreate { group });
    }
    let msg = parse_order_create(&body).map_err(|e| RehearseError::Malformed(e.to_string()))?;
    let (rsv, activity, sku) = (msg.reservation_id.clone(), msg.activity_id, msg.sku_id);
    let mut tx = pool.begin().await?;
    let before: Option<i64> = sqlx::query_scalar(
        "SELECT available_stock FROM inventory WHERE activity_id = $1 AND sku_id = $2",
    )
    .bind(activity)
    .bind(sku)
    .fetch_optional(&mut *tx)
    .await?;
    let parsed = [Parsed::new(msg)];
    let mut report = Rehearsal {
        consumer_group: group.clone(),
        message_id: message_id.clone(),
        verdict: RehearsedVerdict::Fails(String::new()),
        order: None,
        reservation_outcome: None,
        stock: None,
        ledger: Vec::new(),
        compensations: Vec::new(),
        outbox: Vec::new(),
    };
    let outcome = match rehearse_in(&mut tx, &group, names, &parsed).await {
        Ok(mut outcomes) => outcomes.pop(),
        Err(e) => {
            report.verdict = RehearsedVerdict::Fails(e.to_string());
            tx.rollback().await?;
            return Ok(report);
        }
    };
    report.verdict = match outcome {
        Some(MessageOutcome::Created { order_id }) => RehearsedVerdict::Created(order_id),
        Some(MessageOutcome::Rejected(r)) => RehearsedVerdict::Rejected(r.outcome().to_string()),
        Some(MessageOutcome::AlreadyProcessed) | None => {
            RehearsedVerdict::AlreadyApplied("this message_id is in the inbox already".into())
        }
        Some(MessageOutcome::DuplicateReservation) => RehearsedVerdict::AlreadyApplied(
            "its reservation was decided under another message_id".into(),
        ),
    };
    report.order =
        sqlx::query_as("SELECT order_id, status, expires_at FROM orders WHERE reservation_id = $1")
            .bind(&rsv)
            .fetch_optional(&mut *tx)
            .await?;
    report.reservation_outcome =
        sqlx::query_scalar("SELECT outcome FROM reservations WHERE reservation_id = $1")
            .bind(&rsv)
            .fetch_optional(&mut *tx)
            .await?;
    let after: Option<i64> = sqlx::query_scalar(
        "SELECT available_stock FROM inventory WHERE activity_id = $1 AND sku_id = $2",
    )
    .bind(activity)
    .bind(sku)
    .fetch_optional(&mut *tx)
    .await?;
    report.stock = before.zip(after).map(|(b, a)| (sku, b, a));
    report.ledger = sqlx::query_as(
        "SELECT reason::text AS reason, delta FROM inventory_ledger WHERE reservation_id = $1 ORDER BY ledger_id",
    )
    .bind(&rsv)
    .fetch_all(&mut *tx)
    .await?;
    report.compensations =
        sqlx::query_as("SELECT source, status FROM compensation_tasks WHERE reservation_id = $1")
            .bind(&rsv)
            .fetch_all(&mut *tx)
            .await?;
    // Rows this transaction wrote carry its start time: now().
    report.outbox = sqlx::query_as(
        "SELECT topic, tag, message_key, deliver_at FROM event_outbox
         WHERE created_at = now() ORDER BY outbox_id",
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.rollback().await?;
    Ok(report)
}
