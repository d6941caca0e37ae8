//! The operator audit log (`operator_audit`, docs/security.md "What is
//! audited"): who, which command, which targets, why, the state before and
//! after, the outcome and the time.
//!
//! Two ways in, chosen by where the change lives:
//! - a change in PostgreSQL calls [`record`] on its own transaction, so the
//!   row and the change commit or roll back together;
//! - a change elsewhere (Redis, the broker) calls [`open`] first (a PENDING
//!   intent, committed before anything is touched) and [`complete`] after:
//!   a crash in between leaves the intent for the next reader to see.

use crate::domain::auth::Actor;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

/// An `operator_audit` row's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
#[sqlx(transparent)]
#[serde(transparent)]
pub struct AuditId(pub i64);

impl std::fmt::Display for AuditId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The outcome of an intent that has not finished (yet, or ever).
pub const PENDING: &str = "PENDING";

/// One mutation, as the caller describes it.
#[derive(Debug, Clone, Default)]
pub struct Entry {
    /// The command as an operator would type it: `order cancel`,
    /// `dlq ticket ack`, `POST /v1/orders/{id}/pay`.
    pub command: String,
    /// Every id it touched (order, ticket, activity, message, token name).
    pub targets: Vec<String>,
    pub reason: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
    /// What came of it: a label of the command's own (`CANCELED`,
    /// `NOOP_PAID`, `VERIFIED`), or `REFUSED` / `FAILED`.
    pub outcome: String,
}

impl Entry {
    pub fn new(command: impl Into<String>, targets: Vec<String>) -> Self {
        Entry {
            command: command.into(),
            targets,
            ..Default::default()
        }
    }

    pub fn reason(mut self, reason: Option<&str>) -> Self {
        self.reason = reason.map(str::to_owned);
        self
    }

    pub fn before(mut self, v: impl Serialize) -> Self {
        self.before = serde_json::to_value(v).ok();
        self
    }

    pub fn after(mut self, v: impl Serialize) -> Self {
        self.after = serde_json::to_value(v).ok();
        self
    }

    pub fn outcome(mut self, o: impl Into<String>) -> Self {
        self.outcome = o.into();
        self
    }
}

/// Writes a finished row on the caller's transaction.
pub async fn record(
    conn: &mut PgConnection,
    actor: &Actor,
    e: &Entry,
) -> Result<AuditId, sqlx::Error> {
    insert(conn, actor, e, true).await
}

/// Writes and commits a PENDING intent before a change outside PostgreSQL.
pub async fn open(pool: &PgPool, actor: &Actor, e: &Entry) -> Result<AuditId, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let e = Entry {
        outcome: PENDING.to_owned(),
        after: None,
        ..e.clone()
    };
    insert(&mut conn, actor, &e, false).await
}

/// Completes an intent with the state after and the outcome.
pub async fn complete(
    pool: &PgPool,
    id: AuditId,
    after: Option<Value>,
    outcome: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE operator_audit SET after = $2, outcome = $3, finished_at = now()
         WHERE audit_id = $1",
    )
    .bind(id)
    .bind(after)
    .bind(outcome)
    .execute(pool)
    .await?;
    Ok(())
}

/// Completes an intent with what came of the change: the value it produced
/// as the state after (`OK`), or the error (`FAILED`).
pub async fn finish<T: Serialize, E: std::fmt::Display>(
    pool: &PgPool,
    id: AuditId,
    done: &Result<T, E>,
) -> Result<(), sqlx::Error> {
    let (after, outcome) = match done {
        Ok(v) => (serde_json::to_value(v).ok(), "OK"),
        Err(e) => (
            Some(serde_json::json!({ "error": format!("{e:#}") })),
            "FAILED",
        ),
    };
    complete(pool, id, after, outcome).await
}

async fn insert(
    conn: &mut PgConnection,
    actor: &Actor,
    e: &Entry,
    finished: bool,
) -> Result<AuditId, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO operator_audit (actor, role, via, command, targets, reason, before, after,
                                     outcome, finished_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, CASE WHEN $10 THEN now() END)
         RETURNING audit_id",
    )
    .bind(&actor.name)
    .bind(actor.role.as_str())
    .bind(actor.via.as_str())
    .bind(&e.command)
    .bind(&e.targets)
    .bind(&e.reason)
    .bind(&e.before)
    .bind(&e.after)
    .bind(&e.outcome)
    .bind(finished)
    .fetch_one(conn)
    .await
}

/// One row as `seckillctl audit list` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct AuditRow {
    pub audit_id: AuditId,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub role: String,
    pub via: String,
    pub command: String,
    pub targets: Vec<String>,
    pub reason: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
    pub outcome: String,
    pub finished_at: Option<DateTime<Utc>>,
}

/// Which rows to read: newest first, at most `limit`.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub since: Option<DateTime<Utc>>,
    pub actor: Option<String>,
    pub target: Option<String>,
    pub command: Option<String>,
    pub limit: i64,
}

pub async fn list(pool: &PgPool, f: &Filter) -> Result<Vec<AuditRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT audit_id, at, actor, role, via, command, targets, reason, before, after,
                outcome, finished_at
         FROM operator_audit
         WHERE ($1::timestamptz IS NULL OR at >= $1)
           AND ($2::text IS NULL OR actor = $2)
           AND ($3::text IS NULL OR targets @> ARRAY[$3::text])
           AND ($4::text IS NULL OR command = $4)
         ORDER BY audit_id DESC
         LIMIT $5",
    )
    .bind(f.since)
    .bind(&f.actor)
    .bind(&f.target)
    .bind(&f.command)
    .bind(f.limit.max(1))
    .fetch_all(pool)
    .await
}
