//! `dlq discard` (docs/architecture.md §9.2): ends a dead message on
//! purpose, without its effect. A poison message may never be replayable;
//! on-call needs a clean way to end it that cannot race a copy of it.
//!
//! One transaction, fenced where it matters:
//! - the entry row is locked, and the entry state machine must allow the
//!   discard (not VERIFIED, not REPLAYING, no replay in flight);
//! - the group's inbox row for the `message_id` is written: any copy still
//!   in the retry topic or replayed later becomes a no-op, so a message
//!   never ends with both its effect and a compensation. If the inbox row
//!   exists the effect happened, and the discard is refused;
//! - for an order message, the reservation is decided (`RELEASED`) and
//!   compensated once, so the buyer is told no and the stock goes back:
//!   refused if the reservation was decided by another message.
//! - one `replay_audit` row (decision DISCARDED) with the operator and reason.

use super::entry::{EntryMove, MoveFacts, next};
use crate::domain::auth::Actor;
use crate::domain::ids::{MessageId, ReplayId};
use crate::domain::message::{
    RELEASE_RESERVATION_EVENT, ReleaseReservation, SCHEMA_VERSION, TAG_RELEASE_RESERVATION, json,
    parse_order_create,
};
use crate::domain::status::{
    CompensationSource, DlqEntryStatus, InboxStatus, ReplayDecision, ReplayOutcome,
};
use crate::mq::{Names, TopicKind};
use crate::pipeline::order::{OutboxRow, insert_outbox};
use crate::store::audit::{self, Entry};
use serde::Serialize;
use sqlx::PgPool;

/// Result code of a discarded message's inbox row.
pub const DISCARDED: &str = "DISCARDED";

#[derive(Debug, Clone)]
pub struct DiscardRequest {
    pub message_id: MessageId,
    pub group: Option<String>,
    pub reason: String,
    /// Who asks: named on the `replay_audit` row and on the
    /// `operator_audit` row (docs/security.md).
    pub actor: Actor,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct DiscardReport {
    pub consumer_group: String,
    pub message_id: MessageId,
    pub audit_id: ReplayId,
    /// For an order message: the reservation released and compensated.
    pub compensated: bool,
    pub detail: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DiscardError {
    #[error("--reason is required and must not be empty: say why this message is ended")]
    NoReason,
    #[error("no dead message {0}; list them with `seckillctl dlq list`")]
    Unknown(MessageId),
    #[error("{id} is dead in several groups ({groups}); choose one with --group")]
    Ambiguous { id: MessageId, groups: String },
    #[error("{id} cannot be discarded: {why}")]
    Refused { id: MessageId, why: String },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Discards one dead message (see the module).
pub async fn discard(
    pool: &PgPool,
    names: &Names,
    req: &DiscardRequest,
) -> Result<DiscardReport, DiscardError> {
    if req.reason.trim().is_empty() {
        return Err(DiscardError::NoReason);
    }
    let id = &req.message_id;
    let refused = |why: String| DiscardError::Refused {
        id: id.clone(),
        why,
    };
    let mut tx = pool.begin().await?;
    let rows: Vec<(String, DlqEntryStatus, Vec<u8>, i32)> = sqlx::query_as(
        "SELECT consumer_group, status, body, replay_count FROM dlq_messages
         WHERE message_id = $1 AND ($2::text IS NULL OR consumer_group = $2) FOR UPDATE",
    )
    .bind(id)
    .bind(&req.group)
    .fetch_all(&mut *tx)
    .await?;
    let (group, status, body, replay_count) = match rows.len() {
        0 => return Err(DiscardError::Unknown(id.clone())),
        1 => rows.into_iter().next().expect("one row"),
        _ => {
            return Err(DiscardError::Ambiguous {
                id: id.clone(),
                groups: rows
                    .iter()
                    .map(|r| r.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    };
    let in_flight: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM replay_audit
                        WHERE consumer_group = $1 AND message_id = $2 AND decision = 'SENT'
                          AND outcome = 'PENDING' AND created_at > now() - interval '10 minutes')",
    )
    .bind(&group)
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    let facts = MoveFacts {
        include_replayed: false,
        in_flight,
    };
    let to = next(status, EntryMove::Discard, facts).map_err(|e| refused(e.to_string()))?;
    if status == DlqEntryStatus::Discarded {
        return Err(refused("it was discarded already".into()));
    }
    // The fence: the inbox row makes every later copy a no-op.
    let fenced: Option<String> = sqlx::query_scalar(
        "INSERT INTO consumer_inbox (consumer_group, message_id, status, result_code, delivery_attempt)
         VALUES ($1, $2, $3, $4, 0)
         ON CONFLICT (consumer_group, message_id) DO NOTHING RETURNING message_id",
    )
    .bind(&group)
    .bind(id)
    .bind(InboxStatus::Rejected)
    .bind(DISCARDED)
    .fetch_optional(&mut *tx)
    .await?;
    if fenced.is_none() {
        return Err(refused(
            "the consumer applied it already (its inbox row exists); the verifier marks it VERIFIED"
                .into(),
        ));
    }
    let order_group = names.group(TopicKind::OrderCreate);
    let compensated = group == order_group;
    if compensated {
        let m = parse_order_create(&body)
            .map_err(|e| refused(format!("its body does not parse ({e}); nothing to release")))?;
        let decided = sqlx::query(
            "INSERT INTO reservations (reservation_id, message_id, request_id, order_id, activity_id,
                                       sku_id, user_id, outcome, valid_until, reserved_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'RELEASED', $8, $9)
             ON CONFLICT (reservation_id) DO NOTHING",
        )
        .bind(&m.reservation_id)
        .bind(&m.message_id)
        .bind(&m.request_id)
        .bind(&m.order_id)
        .bind(m.activity_id)
        .bind(m.sku_id)
        .bind(m.user_id)
        .bind(m.reservation_valid_until)
        .bind(m.reservation_created_at)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if decided == 0 {
            return Err(refused(
                "its reservation was decided by another message; nothing to end".into(),
            ));
        }
        let why = format!("discarded: {}", req.reason.trim());
        sqlx::query(
            "INSERT INTO compensation_tasks (reservation_id, activity_id, sku_id, user_id, source, reason)
             VALUES ($1, $2, $3, $4, 'BUSINESS_REJECTION', $5)",
        )
        .bind(&m.reservation_id)
        .bind(m.activity_id)
        .bind(m.sku_id)
        .bind(m.user_id)
        .bind(&why)
        .execute(&mut *tx)
        .await?;
        let release = ReleaseReservation {
            schema_version: SCHEMA_VERSION,
            event_type: RELEASE_RESERVATION_EVENT.to_owned(),
            message_id: MessageId::generate(),
            reservation_id: m.reservation_id.clone(),
            activity_id: m.activity_id,
            sku_id: m.sku_id,
            user_id: m.user_id,
            source: CompensationSource::BusinessRejection,
            reason: why,
            created_at: chrono::Utc::now(),
        };
        insert_outbox(
            &mut tx,
            &[OutboxRow {
                message_id: release.message_id.clone(),
                topic: names.topic(TopicKind::InventoryCompensate),
                tag: TAG_RELEASE_RESERVATION,
                key: m.reservation_id.to_string(),
                payload: json(&release),
                deliver_at: None,
            }],
        )
        .await?;
    }
    sqlx::query(
        "UPDATE dlq_messages SET status = $3 WHERE consumer_group = $1 AND message_id = $2",
    )
    .bind(&group)
    .bind(id)
    .bind(to)
    .execute(&mut *tx)
    .await?;
    let audit_id = ReplayId::generate();
    sqlx::query(
        "INSERT INTO replay_audit (replay_id, consumer_group, message_id, ticket_id, operator, reason,
                                   checks, decision, outcome, replay_count, finished_at)
         SELECT $1, $2, $3, ticket_id, $4, $5, '[]', $6, $7, $8, now()
         FROM dlq_messages WHERE consumer_group = $2 AND message_id = $3",
    )
    .bind(&audit_id)
    .bind(&group)
    .bind(id)
    .bind(&req.actor.name)
    .bind(req.reason.trim())
    .bind(ReplayDecision::Discarded)
    .bind(ReplayOutcome::NotSent)
    .bind(replay_count)
    .execute(&mut *tx)
    .await?;
    // And the operator audit log, in the same transaction (docs/security.md).
    let entry = Entry::new("dlq discard", vec![id.to_string(), group.clone()])
        .reason(Some(req.reason.trim()))
        .before(serde_json::json!({ "status": status, "replay_count": replay_count }))
        .after(serde_json::json!({ "status": to, "compensated": compensated }))
        .outcome("DISCARDED");
    audit::record(&mut tx, &req.actor, &entry).await?;
    tx.commit().await?;
    super::verifier::tickets_follow(pool).await?;
    Ok(DiscardReport {
        consumer_group: group,
        message_id: id.clone(),
        audit_id,
        compensated,
        detail: if compensated {
            "reservation RELEASED and compensated once: the buyer is told no, the stock goes back"
                .into()
        } else {
            "ended; a later copy of it is a no-op (inbox)".into()
        },
    })
}
