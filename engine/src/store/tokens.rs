//! Bearer tokens in PostgreSQL (`api_tokens`, docs/security.md "Tokens"):
//! only a SHA-256 of each secret is kept; the secret is returned once, by
//! [`create`]. Every change writes its audit row in the same transaction.

use crate::domain::auth::{self, Actor, Role};
use crate::store::audit::{self, Entry};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("bad token name {name:?}: {why}")]
    BadName { name: String, why: &'static str },
    #[error("a token named {0:?} exists already; pick another name or revoke it first")]
    Exists(String),
    #[error("no token named {0:?}; `seckillctl auth token list` shows them")]
    Unknown(String),
    #[error("token {0:?} is revoked already")]
    AlreadyRevoked(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A token as listed: never its secret, nor its digest.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct TokenRow {
    pub name: String,
    pub role: String,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    pub revoked_at: Option<DateTime<Utc>>,
    pub revoked_by: Option<String>,
}

/// A token the daemon accepts: its digest, name and role.
#[derive(Debug, Clone)]
pub struct ActiveToken {
    pub digest: String,
    pub name: String,
    pub role: Role,
}

/// Issues a token and returns its secret, the only time it exists outside
/// the caller's hands.
pub async fn create(
    pool: &PgPool,
    name: &str,
    role: Role,
    actor: &Actor,
) -> Result<String, TokenError> {
    auth::check_token_name(name).map_err(|why| TokenError::BadName {
        name: name.to_owned(),
        why,
    })?;
    let secret = auth::new_token();
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO api_tokens (name, role, token_sha256, created_by) VALUES ($1, $2, $3, $4)
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(name)
    .bind(role.as_str())
    .bind(auth::token_digest(&secret))
    .bind(&actor.name)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Err(TokenError::Exists(name.to_owned()));
    }
    let entry = Entry::new("auth token create", vec![name.to_owned()])
        .after(serde_json::json!({ "name": name, "role": role }))
        .outcome("CREATED");
    audit::record(&mut tx, actor, &entry).await?;
    tx.commit().await?;
    Ok(secret)
}

pub async fn list(pool: &PgPool, include_revoked: bool) -> Result<Vec<TokenRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT name, role, created_at, created_by, revoked_at, revoked_by FROM api_tokens
         WHERE $1 OR revoked_at IS NULL ORDER BY created_at, name",
    )
    .bind(include_revoked)
    .fetch_all(pool)
    .await
}

/// Revokes a token; the daemons stop accepting it at their next refresh.
pub async fn revoke(
    pool: &PgPool,
    name: &str,
    actor: &Actor,
    reason: Option<&str>,
) -> Result<TokenRow, TokenError> {
    let mut tx = pool.begin().await?;
    let before: Option<TokenRow> = sqlx::query_as(
        "SELECT name, role, created_at, created_by, revoked_at, revoked_by FROM api_tokens
         WHERE name = $1 FOR UPDATE",
    )
    .bind(name)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(before) = before else {
        return Err(TokenError::Unknown(name.to_owned()));
    };
    if before.revoked_at.is_some() {
        return Err(TokenError::AlreadyRevoked(name.to_owned()));
    }
    let after: TokenRow = sqlx::query_as(
        "UPDATE api_tokens SET revoked_at = now(), revoked_by = $2 WHERE name = $1
         RETURNING name, role, created_at, created_by, revoked_at, revoked_by",
    )
    .bind(name)
    .bind(&actor.name)
    .fetch_one(&mut *tx)
    .await?;
    let entry = Entry::new("auth token revoke", vec![name.to_owned()])
        .reason(reason)
        .before(&before)
        .after(&after)
        .outcome("REVOKED");
    audit::record(&mut tx, actor, &entry).await?;
    tx.commit().await?;
    Ok(after)
}

/// Every unrevoked token, for the daemon's gate. A role this build does not
/// know (a newer build's) is skipped: it grants nothing here.
pub async fn active(pool: &PgPool) -> Result<Vec<ActiveToken>, sqlx::Error> {
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT token_sha256, name, role FROM api_tokens WHERE revoked_at IS NULL")
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(digest, name, role)| {
            role.parse()
                .ok()
                .map(|role| ActiveToken { digest, name, role })
        })
        .collect())
}
