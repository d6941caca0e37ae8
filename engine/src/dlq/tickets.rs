//! DLQ tickets and entries (docs/architecture.md §9.2): the lifecycle as a pure
//! transition table, and the reads `seckillctl dlq` shows.

use super::key::DlqEntryKey;
use crate::domain::auth::Actor;
use crate::domain::ids::TicketId;
use crate::domain::status::{
    DlqEntryStatus, FailureClass, InboxStatus, OrderStatus, ReservationOutcome, TicketStatus,
};
use crate::store::audit::{self, Entry};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

/// What an operator does to a ticket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TicketAction {
    /// "I have seen it."
    Ack,
    /// Take (or hand over) ownership; acknowledges an OPEN ticket.
    Assign { owner: String },
    /// The fault is fixed: the entries may be replayed.
    Resolve,
    /// Done, with what was done. A ticket whose entries are not all
    /// VERIFIED or DISCARDED closes only with `force` (docs/architecture.md §9.2).
    Close { resolution: String, force: bool },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error("no ticket {0}; list them with `seckillctl dlq ticket list`")]
    Unknown(TicketId),
    #[error("ticket {ticket} is {from}; it cannot be {action}")]
    Refused {
        ticket: TicketId,
        from: TicketStatus,
        action: &'static str,
    },
    #[error("{0} must not be empty")]
    Empty(&'static str),
    #[error(
        "ticket {ticket} still has {unsettled} entr(ies) neither verified nor discarded; replay or discard them, or close it with --force and a --resolution saying why"
    )]
    Unsettled { ticket: TicketId, unsettled: i64 },
}

impl TicketAction {
    fn verb(&self) -> &'static str {
        match self {
            TicketAction::Ack => "acknowledged",
            TicketAction::Assign { .. } => "assigned",
            TicketAction::Resolve => "resolved",
            TicketAction::Close { .. } => "closed",
        }
    }
}

/// The next status, or why not (pure). Repeating an action that already
/// took effect is allowed and changes nothing, so scripts can retry.
pub fn transition(
    ticket: &TicketId,
    from: TicketStatus,
    action: &TicketAction,
) -> Result<TicketStatus, TicketError> {
    use TicketStatus as S;
    let refused = || TicketError::Refused {
        ticket: ticket.clone(),
        from,
        action: action.verb(),
    };
    match (from, action) {
        (S::Closed, _) => Err(refused()),
        (_, TicketAction::Close { .. }) => Ok(S::Closed),
        (S::Open, TicketAction::Ack | TicketAction::Assign { .. }) => Ok(S::Acked),
        (other, TicketAction::Assign { .. }) => Ok(other),
        (S::Acked, TicketAction::Ack) => Ok(S::Acked),
        (S::Open | S::Acked | S::Fixed, TicketAction::Resolve) => Ok(S::Fixed),
        (S::Fixed | S::Replaying | S::Verified, TicketAction::Ack) => Ok(from),
        (S::Replaying | S::Verified, TicketAction::Resolve) => Err(refused()),
    }
}

/// One ticket with its entry counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, sqlx::FromRow)]
pub struct Ticket {
    pub ticket_id: TicketId,
    pub consumer_group: String,
    pub error_class: FailureClass,
    pub status: TicketStatus,
    pub owner: Option<String>,
    pub resolution: Option<String>,
    pub opened_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    /// Entries in the ticket, and those still DEAD.
    pub messages: i64,
    pub dead: i64,
    pub oldest_dead_at: Option<DateTime<Utc>>,
}

const TICKET_COLUMNS: &str = "t.ticket_id, t.consumer_group, t.error_class, t.status, t.owner, t.resolution,
     t.opened_at, t.updated_at, t.closed_at,
     (SELECT count(*) FROM dlq_messages m WHERE m.ticket_id = t.ticket_id) AS messages,
     (SELECT count(*) FROM dlq_messages m WHERE m.ticket_id = t.ticket_id AND m.status = 'DEAD') AS dead,
     (SELECT min(dead_at) FROM dlq_messages m WHERE m.ticket_id = t.ticket_id) AS oldest_dead_at";

/// One mirrored dead message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct DlqEntry {
    pub consumer_group: String,
    /// The business `message_id`, or what the mirror keyed a message
    /// without one by (docs/architecture.md §9.1).
    pub message_id: DlqEntryKey,
    pub ticket_id: Option<TicketId>,
    pub original_topic: String,
    pub broker_msg_id: String,
    pub error_class: FailureClass,
    pub delivery_attempts: i32,
    pub status: DlqEntryStatus,
    pub replay_count: i32,
    pub dead_at: DateTime<Utc>,
    pub mirrored_at: DateTime<Utc>,
    pub verified_at: Option<DateTime<Utc>>,
    #[serde(skip)]
    pub body: Vec<u8>,
    pub properties: serde_json::Value,
}

const ENTRY_COLUMNS: &str =
    "consumer_group, message_id, ticket_id, original_topic, broker_msg_id, error_class,
     delivery_attempts, status, replay_count, dead_at, mirrored_at, verified_at, body, properties";

pub async fn list_tickets(
    pool: &PgPool,
    status: Option<TicketStatus>,
) -> Result<Vec<Ticket>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {TICKET_COLUMNS} FROM dlq_tickets t
         WHERE $1::ticket_status IS NULL OR t.status = $1
         ORDER BY t.opened_at DESC"
    ))
    .bind(status)
    .fetch_all(pool)
    .await
}

pub async fn get_ticket(pool: &PgPool, id: &TicketId) -> Result<Option<Ticket>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {TICKET_COLUMNS} FROM dlq_tickets t WHERE t.ticket_id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await
}

impl TicketAction {
    /// The command as an audit row names it.
    pub fn command(&self) -> &'static str {
        match self {
            TicketAction::Ack => "dlq ticket ack",
            TicketAction::Assign { .. } => "dlq ticket assign",
            TicketAction::Resolve => "dlq ticket resolve",
            TicketAction::Close { force: false, .. } => "dlq ticket close",
            TicketAction::Close { force: true, .. } => "dlq ticket close --force",
        }
    }
}

/// Applies an operator action, checked against the current status under a
/// row lock, so two operators cannot race a ticket into a wrong state. The
/// audit row, with the ticket before and after, commits with the move
/// (docs/security.md).
pub async fn apply(
    pool: &PgPool,
    id: &TicketId,
    action: &TicketAction,
    actor: &Actor,
) -> Result<Ticket, ApplyError> {
    match action {
        TicketAction::Assign { owner } if owner.trim().is_empty() => {
            return Err(TicketError::Empty("--owner").into());
        }
        TicketAction::Close { resolution, .. } if resolution.trim().is_empty() => {
            return Err(TicketError::Empty("--resolution").into());
        }
        _ => {}
    }
    let mut tx = pool.begin().await?;
    let before = ticket_in(&mut tx, id, "FOR UPDATE OF t")
        .await?
        .ok_or_else(|| TicketError::Unknown(id.clone()))?;
    let to = transition(id, before.status, action)?;
    if let TicketAction::Close { force: false, .. } = action {
        let unsettled: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM dlq_messages
             WHERE ticket_id = $1 AND status NOT IN ('VERIFIED', 'DISCARDED')",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
        if unsettled > 0 {
            return Err(TicketError::Unsettled {
                ticket: id.clone(),
                unsettled,
            }
            .into());
        }
    }
    let (owner, resolution) = match action {
        TicketAction::Assign { owner } => (Some(owner.trim().to_owned()), None),
        TicketAction::Close { resolution, .. } => (None, Some(resolution.trim().to_owned())),
        _ => (None, None),
    };
    sqlx::query(
        "UPDATE dlq_tickets
         SET status = $2, owner = COALESCE($3, owner), resolution = COALESCE($4, resolution),
             updated_at = now(),
             closed_at = CASE WHEN $2 = 'CLOSED' THEN now() ELSE closed_at END
         WHERE ticket_id = $1",
    )
    .bind(id)
    .bind(to)
    .bind(owner)
    .bind(resolution.clone())
    .execute(&mut *tx)
    .await?;
    let after = ticket_in(&mut tx, id, "")
        .await?
        .ok_or_else(|| TicketError::Unknown(id.clone()))?;
    let entry = Entry::new(action.command(), vec![id.to_string()])
        .reason(resolution.as_deref())
        .before(&before)
        .after(&after)
        .outcome(to.as_str());
    audit::record(&mut tx, actor, &entry).await?;
    tx.commit().await?;
    Ok(after)
}

/// One ticket read in `tx`; `lock` is `FOR UPDATE OF t` for the read that
/// decides the move, so two operators cannot race it.
async fn ticket_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    id: &TicketId,
    lock: &str,
) -> Result<Option<Ticket>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {TICKET_COLUMNS} FROM dlq_tickets t WHERE t.ticket_id = $1 {lock}"
    ))
    .bind(id)
    .fetch_optional(&mut **tx)
    .await
}

/// Gives every ownerless live ticket of a routed error class to its team
/// (`[dlq] owners`). Returns the tickets routed; a class that names no
/// error class is reported once per call, never routed.
pub async fn route_owners(
    pool: &PgPool,
    owners: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<(TicketId, String)>, sqlx::Error> {
    let mut routed = Vec::new();
    for (class, team) in owners {
        let Some(class) = FailureClass::ALL.iter().find(|c| c.as_str() == class) else {
            tracing::warn!(class = %class, "[dlq] owners names no error class; one of {:?}", FailureClass::ALL.iter().map(|c| c.as_str()).collect::<Vec<_>>());
            continue;
        };
        let ids: Vec<TicketId> = sqlx::query_scalar(
            "UPDATE dlq_tickets SET owner = $2, updated_at = now()
             WHERE error_class = $1 AND owner IS NULL AND status <> 'CLOSED'
             RETURNING ticket_id",
        )
        .bind(class)
        .bind(team)
        .fetch_all(pool)
        .await?;
        routed.extend(ids.into_iter().map(|t| (t, team.clone())));
    }
    Ok(routed)
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Ticket(#[from] TicketError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

pub async fn list_entries(
    pool: &PgPool,
    group: Option<&str>,
    ticket: Option<&TicketId>,
    status: Option<DlqEntryStatus>,
) -> Result<Vec<DlqEntry>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {ENTRY_COLUMNS} FROM dlq_messages
         WHERE ($1::text IS NULL OR consumer_group = $1)
           AND ($2::text IS NULL OR ticket_id = $2)
           AND ($3::dlq_entry_status IS NULL OR status = $3)
         ORDER BY dead_at DESC
         LIMIT 1000"
    ))
    .bind(group)
    .bind(ticket)
    .bind(status)
    .fetch_all(pool)
    .await
}

/// One failure a consumer recorded before asking for a retry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct FailureRecord {
    pub error_class: FailureClass,
    pub detail: String,
    pub delivery_attempt: i32,
    pub failed_at: DateTime<Utc>,
}

/// Where the business stands for a dead message: what an operator needs
/// before deciding on a replay.
#[derive(Debug, Clone, Serialize)]
pub struct EntryDetail {
    pub entry: DlqEntry,
    /// The body as text (it is JSON for every seckill topic).
    pub body: String,
    pub failures: Vec<FailureRecord>,
    /// The group's inbox row for this message_id, if any: (status, result code).
    pub inbox: Option<(InboxStatus, Option<String>)>,
    /// The order and reservation the body names, as PostgreSQL has them.
    pub order_status: Option<OrderStatus>,
    pub reservation_outcome: Option<ReservationOutcome>,
}

/// Every mirrored copy of one dead message (one per group it died in). The
/// key may be foreign (§9.1): such an entry can be inspected, not replayed.
pub async fn show_entries(
    pool: &PgPool,
    message_id: &DlqEntryKey,
) -> Result<Vec<EntryDetail>, sqlx::Error> {
    let entries: Vec<DlqEntry> = sqlx::query_as(&format!(
        "SELECT {ENTRY_COLUMNS} FROM dlq_messages WHERE message_id = $1 ORDER BY consumer_group"
    ))
    .bind(message_id)
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let failures: Vec<FailureRecord> = sqlx::query_as(
            "SELECT error_class, detail, delivery_attempt, failed_at FROM consumer_failures
             WHERE consumer_group = $1 AND message_id = $2 ORDER BY failed_at",
        )
        .bind(&entry.consumer_group)
        .bind(message_id)
        .fetch_all(pool)
        .await?;
        let inbox: Option<(InboxStatus, Option<String>)> = sqlx::query_as(
            "SELECT status, result_code FROM consumer_inbox WHERE consumer_group = $1 AND message_id = $2",
        )
        .bind(&entry.consumer_group)
        .bind(message_id)
        .fetch_optional(pool)
        .await?;
        let body: serde_json::Value = serde_json::from_slice(&entry.body).unwrap_or_default();
        // The body is the dead copy's, unvalidated: its ids are looked up
        // as text, and a body that names none shows nothing.
        let order_status: Option<OrderStatus> = match body["order_id"].as_str() {
            Some(id) => {
                sqlx::query_scalar("SELECT status FROM orders WHERE order_id = $1")
                    .bind(id)
                    .fetch_optional(pool)
                    .await?
            }
            None => None,
        };
        let reservation_outcome: Option<ReservationOutcome> = match body["reservation_id"].as_str()
        {
            Some(id) => {
                sqlx::query_scalar("SELECT outcome FROM reservations WHERE reservation_id = $1")
                    .bind(id)
                    .fetch_optional(pool)
                    .await?
            }
            None => None,
        };
        out.push(EntryDetail {
            body: String::from_utf8_lossy(&entry.body).into_owned(),
            entry,
            failures,
            inbox,
            order_status,
            reservation_outcome,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use TicketStatus as S;

    fn close() -> TicketAction {
        TicketAction::Close {
            resolution: "fixed the SKU row".into(),
            force: false,
        }
    }

    fn assign() -> TicketAction {
        TicketAction::Assign {
            owner: "alice".into(),
        }
    }

    #[test]
    fn the_lifecycle_moves_forward_and_repeats_are_harmless() {
        let id = TicketId::generate();
        let t = |from, a: &TicketAction| transition(&id, from, a);
        assert_eq!(t(S::Open, &TicketAction::Ack), Ok(S::Acked));
        assert_eq!(t(S::Acked, &TicketAction::Ack), Ok(S::Acked));
        assert_eq!(t(S::Open, &assign()), Ok(S::Acked));
        assert_eq!(t(S::Fixed, &assign()), Ok(S::Fixed));
        assert_eq!(t(S::Acked, &TicketAction::Resolve), Ok(S::Fixed));
        assert_eq!(t(S::Open, &TicketAction::Resolve), Ok(S::Fixed));
        assert_eq!(t(S::Verified, &close()), Ok(S::Closed));
        assert_eq!(t(S::Open, &close()), Ok(S::Closed));
    }

    #[test]
    fn a_closed_ticket_refuses_everything_and_says_why() {
        let id = TicketId::generate();
        for a in [TicketAction::Ack, assign(), TicketAction::Resolve, close()] {
            let e = transition(&id, S::Closed, &a).unwrap_err();
            assert!(e.to_string().contains(&format!("{id} is CLOSED")), "{e}");
        }
        assert!(transition(&id, S::Replaying, &TicketAction::Resolve).is_err());
    }
}
