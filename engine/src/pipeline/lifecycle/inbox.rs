//! The inbox steps of a one-message transaction (docs/architecture.md §5, §7).

use crate::domain::status::InboxStatus;
use sqlx::{PgPool, Postgres, Transaction};

/// Claims `message_id` for `group` in `tx`. False when the message was
/// consumed before (or is being consumed by a concurrent delivery, which
/// this insert waits for): the caller writes nothing and ACKs.
pub async fn claim(
    tx: &mut Transaction<'static, Postgres>,
    group: &str,
    message_id: &str,
    delivery_attempt: i32,
    replay_id: Option<&str>,
) -> Result<bool, sqlx::Error> {
    let row: Option<String> = sqlx::query_scalar(
        "INSERT INTO consumer_inbox (consumer_group, message_id, status, delivery_attempt, replay_id)
         VALUES ($1, $2, 'PROCESSING', $3, $4)
         ON CONFLICT (consumer_group, message_id) DO NOTHING
         RETURNING message_id",
    )
    .bind(group)
    .bind(message_id)
    .bind(delivery_attempt)
    .bind(replay_id)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(row.is_some())
}

/// Records the verdict of a claimed message, in the same transaction.
pub async fn finish(
    tx: &mut Transaction<'static, Postgres>,
    group: &str,
    message_id: &str,
    status: InboxStatus,
    result_code: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE consumer_inbox SET status = $3, result_code = $4, updated_at = now()
         WHERE consumer_group = $1 AND message_id = $2",
    )
    .bind(group)
    .bind(message_id)
    .bind(status)
    .bind(result_code)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// True when `group` already consumed `message_id` (read-only).
pub async fn seen(pool: &PgPool, group: &str, message_id: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM consumer_inbox WHERE consumer_group = $1 AND message_id = $2)",
    )
    .bind(group)
    .bind(message_id)
    .fetch_one(pool)
    .await
}
