//! The governor's verifier (docs/architecture.md §9.2): closes the loop a
//! replay leaves open. Every pass re-checks the entries not yet settled
//! (DEAD, REPLAYING, REPLAYED) and marks VERIFIED those whose business
//! effect now exists, whoever produced it: the replay, the broker's own
//! redelivery of the replayed copy once the fault was fixed, or the
//! scanner's re-send of the same `message_id`. Then every ticket follows
//! its entries ([`super::entry::ticket_after`]).

use super::entry::{EntryMove, MoveFacts, next};
use crate::domain::ids::{MessageId, TicketId};
use crate::domain::status::DlqEntryStatus;
use crate::mq::{Names, TopicKind};
use sqlx::PgPool;

/// Entries re-checked per pass, oldest first.
const PASS_LIMIT: i64 = 500;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Entries that became VERIFIED: (group, message id).
    pub verified: Vec<(String, MessageId)>,
    /// Tickets whose entries are all VERIFIED or DISCARDED.
    pub tickets_verified: Vec<TicketId>,
    /// VERIFIED tickets with a dead entry again.
    pub tickets_reopened: Vec<TicketId>,
}

/// Whether the message's business effect exists (`None`: this kind keeps
/// no record to tell by, the projection). An inbox row past PROCESSING is
/// the consumer's verdict; for an order message the reservation must also
/// be decided with its effect: an order, or a rejection compensated once.
pub async fn effect_exists(
    pool: &PgPool,
    kind: Option<TopicKind>,
    group: &str,
    message_id: &MessageId,
) -> Result<Option<bool>, sqlx::Error> {
    if kind.is_none_or(|k| !k.has_inbox()) {
        return Ok(None);
    }
    let done: Option<bool> = sqlx::query_scalar(
        "SELECT status <> 'PROCESSING' FROM consumer_inbox WHERE consumer_group = $1 AND message_id = $2",
    )
    .bind(group)
    .bind(message_id)
    .fetch_optional(pool)
    .await?;
    if done != Some(true) {
        return Ok(Some(false));
    }
    if kind != Some(TopicKind::OrderCreate) {
        return Ok(Some(true));
    }
    let decided: bool = sqlx::query_scalar(
        "WITH body AS (SELECT convert_from(body, 'UTF8')::jsonb ->> 'reservation_id' AS rsv
                       FROM dlq_messages WHERE consumer_group = $1 AND message_id = $2)
         SELECT EXISTS (
             SELECT 1 FROM body JOIN reservations r ON r.reservation_id = body.rsv
             WHERE r.outcome = 'ORDER_CREATED'
                   AND EXISTS (SELECT 1 FROM orders o WHERE o.reservation_id = r.reservation_id)
                OR r.outcome <> 'ORDER_CREATED'
                   AND EXISTS (SELECT 1 FROM compensation_tasks c WHERE c.reservation_id = r.reservation_id))",
    )
    .bind(group)
    .bind(message_id)
    .fetch_one(pool)
    .await?;
    Ok(Some(decided))
}

/// Moves one entry to VERIFIED if it is still where `from` says (a
/// concurrent replay or mirror wins otherwise). True when it moved.
pub async fn mark_verified(
    pool: &PgPool,
    group: &str,
    message_id: &MessageId,
    from: DlqEntryStatus,
) -> Result<bool, sqlx::Error> {
    let Ok(to) = next(from, EntryMove::EffectSeen, MoveFacts::default()) else {
        return Ok(false);
    };
    let moved = sqlx::query(
        "UPDATE dlq_messages SET status = $4, verified_at = coalesce(verified_at, now())
         WHERE consumer_group = $1 AND message_id = $2 AND status = $3",
    )
    .bind(group)
    .bind(message_id)
    .bind(from)
    .bind(to)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(moved == 1)
}

/// One pass: the entries, then the tickets.
pub async fn verify_once(pool: &PgPool, names: &Names) -> Result<VerifyReport, sqlx::Error> {
    let mut report = VerifyReport::default();
    let open: Vec<(String, String, DlqEntryStatus)> = sqlx::query_as(
        "SELECT consumer_group, message_id, status FROM dlq_messages
         WHERE status IN ('DEAD', 'REPLAYING', 'REPLAYED')
         ORDER BY dead_at LIMIT $1",
    )
    .bind(PASS_LIMIT)
    .fetch_all(pool)
    .await?;
    for (group, key, status) in open {
        // A key that is not a message id (a foreign message) has no
        // effect to look for.
        let Ok(id) = MessageId::parse(&key) else {
            continue;
        };
        let kind = TopicKind::ALL
            .into_iter()
            .find(|k| names.group(*k) == group);
        if effect_exists(pool, kind, &group, &id).await? == Some(true)
            && mark_verified(pool, &group, &id, status).await?
        {
            tracing::info!(group = %group, message_id = %id, from = %status, "dead message verified: its effect exists");
            report.verified.push((group, id));
        }
    }
    let (verified, reopened) = tickets_follow(pool).await?;
    report.tickets_verified = verified;
    report.tickets_reopened = reopened;
    Ok(report)
}

/// Every live ticket follows its entries ([`super::entry::ticket_after`]):
/// VERIFIED when all are VERIFIED or DISCARDED, OPEN again (owner kept)
/// when a VERIFIED ticket has an unsettled entry. Returns (verified,
/// reopened).
pub async fn tickets_follow(pool: &PgPool) -> Result<(Vec<TicketId>, Vec<TicketId>), sqlx::Error> {
    let verified: Vec<TicketId> = sqlx::query_scalar(
        "UPDATE dlq_tickets t SET status = 'VERIFIED', updated_at = now()
         WHERE t.status NOT IN ('VERIFIED', 'CLOSED')
           AND EXISTS (SELECT 1 FROM dlq_messages m WHERE m.ticket_id = t.ticket_id)
           AND NOT EXISTS (SELECT 1 FROM dlq_messages m WHERE m.ticket_id = t.ticket_id
                           AND m.status NOT IN ('VERIFIED', 'DISCARDED'))
         RETURNING t.ticket_id",
    )
    .fetch_all(pool)
    .await?;
    let reopened: Vec<TicketId> = sqlx::query_scalar(
        "UPDATE dlq_tickets t SET status = 'OPEN', updated_at = now()
         WHERE t.status = 'VERIFIED'
           AND EXISTS (SELECT 1 FROM dlq_messages m WHERE m.ticket_id = t.ticket_id
                       AND m.status NOT IN ('VERIFIED', 'DISCARDED'))
         RETURNING t.ticket_id",
    )
    .fetch_all(pool)
    .await?;
    for t in &verified {
        tracing::info!(ticket_id = %t, "ticket VERIFIED: every entry verified or discarded");
    }
    for t in &reopened {
        tracing::warn!(ticket_id = %t, "ticket reopened: an entry is dead again or new");
    }
    Ok((verified, reopened))
}
