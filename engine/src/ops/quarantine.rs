//! The quarantine, governable (docs/architecture.md §7.3): the messages a
//! consumer refused as malformed, what it said of each, and their discard
//! by an operator, audited in the same transaction (docs/security.md).
//!
//! A quarantined message is never retried and has no effect to undo, so a
//! discard only records that someone looked and why; the row stays, for
//! the record.

use crate::domain::auth::Actor;
use crate::domain::status::QuarantineReason;
use crate::store::audit::{self, Entry};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// One quarantined message as on-call reads it; the body in [`Detail`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Quarantined {
    pub quarantine_id: i64,
    pub consumer_group: String,
    pub topic: String,
    pub message_id: Option<String>,
    pub broker_msg_id: Option<String>,
    pub reason: QuarantineReason,
    pub detail: String,
    pub body_bytes: i32,
    pub created_at: DateTime<Utc>,
    pub discarded_at: Option<DateTime<Utc>>,
    pub discarded_by: Option<String>,
    pub discard_reason: Option<String>,
}

/// One message with its body and properties.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Detail {
    #[serde(flatten)]
    pub row: Quarantined,
    /// The body as text where it is UTF-8 (lossy otherwise), cut at
    /// [`SHOWN_BODY`] bytes: a quarantined body may be anything, any size.
    pub body: String,
    pub body_truncated: bool,
    pub properties: serde_json::Value,
}

/// How much of a body `show` prints.
pub const SHOWN_BODY: usize = 64 * 1024;

/// Which rows to read, newest first.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub group: Option<String>,
    pub reason: Option<QuarantineReason>,
    /// Discarded ones too.
    pub all: bool,
    pub limit: i64,
}

const COLUMNS: &str =
    "quarantine_id, consumer_group, topic, message_id, broker_msg_id, reason, detail,
    octet_length(body) AS body_bytes, created_at, discarded_at, discarded_by, discard_reason";

pub async fn list(pool: &PgPool, f: &Filter) -> Result<Vec<Quarantined>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM message_quarantine
         WHERE ($1::text IS NULL OR consumer_group = $1)
           AND ($2::quarantine_reason IS NULL OR reason = $2)
           AND ($3 OR discarded_at IS NULL)
         ORDER BY quarantine_id DESC LIMIT $4"
    ))
    .bind(&f.group)
    .bind(f.reason)
    .bind(f.all)
    .bind(f.limit.max(1))
    .fetch_all(pool)
    .await
}

/// How many are quarantined and not discarded, per reason.
pub async fn counts(pool: &PgPool) -> Result<Vec<(QuarantineReason, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT reason, count(*) FROM message_quarantine WHERE discarded_at IS NULL
         GROUP BY reason ORDER BY reason",
    )
    .fetch_all(pool)
    .await
}

pub async fn show(pool: &PgPool, id: i64) -> Result<Option<Detail>, sqlx::Error> {
    let Some(row) = sqlx::query_as::<_, Quarantined>(&format!(
        "SELECT {COLUMNS} FROM message_quarantine WHERE quarantine_id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let (body, properties): (Vec<u8>, serde_json::Value) = sqlx::query_as(&format!(
        "SELECT substring(body FROM 1 FOR {SHOWN_BODY}), properties FROM message_quarantine WHERE quarantine_id = $1"
    ))
    .bind(id)
    .fetch_one(pool)
    .await?;
    Ok(Some(Detail {
        body_truncated: row.body_bytes as usize > SHOWN_BODY,
        body: String::from_utf8_lossy(&body).into_owned(),
        properties,
        row,
    }))
}

#[derive(Debug, thiserror::Error)]
pub enum QuarantineError {
    #[error("no quarantined message {0}; list them with `seckillctl quarantine list`")]
    Unknown(i64),
    #[error("quarantined message {id} was discarded already, by {by} at {at}: {reason}")]
    AlreadyDiscarded {
        id: i64,
        by: String,
        at: DateTime<Utc>,
        reason: String,
    },
    #[error("--reason must say why it is discarded")]
    NoReason,
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Marks one message discarded, with the row before and after on the
/// audit row of the same transaction. Refused once discarded: the first
/// word stays.
pub async fn discard(
    pool: &PgPool,
    id: i64,
    reason: &str,
    actor: &Actor,
) -> Result<Quarantined, QuarantineError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(QuarantineError::NoReason);
    }
    let mut tx = pool.begin().await?;
    let select = format!("SELECT {COLUMNS} FROM message_quarantine WHERE quarantine_id = $1");
    let before: Quarantined = sqlx::query_as(&format!("{select} FOR UPDATE"))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(QuarantineError::Unknown(id))?;
    if let (Some(at), by, why) = (
        before.discarded_at,
        &before.discarded_by,
        &before.discard_reason,
    ) {
        return Err(QuarantineError::AlreadyDiscarded {
            id,
            by: by.clone().unwrap_or_default(),
            at,
            reason: why.clone().unwrap_or_default(),
        });
    }
    sqlx::query(
        "UPDATE message_quarantine SET discarded_at = now(), discarded_by = $2, discard_reason = $3
         WHERE quarantine_id = $1",
    )
    .bind(id)
    .bind(&actor.name)
    .bind(reason)
    .execute(&mut *tx)
    .await?;
    let after: Quarantined = sqlx::query_as(&select).bind(id).fetch_one(&mut *tx).await?;
    let mut targets = vec![id.to_string(), before.consumer_group.clone()];
    targets.extend(before.message_id.clone());
    let entry = Entry::new("quarantine discard", targets)
        .reason(Some(reason))
        .before(&before)
        .after(&after)
        .outcome("DISCARDED");
    audit::record(&mut tx, actor, &entry).await?;
    tx.commit().await?;
    Ok(after)
}
