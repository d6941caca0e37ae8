//! The engine registry's table (docs/architecture.md §14.3): a daemon's
//! row written on start, its heartbeat, its clean stop, and the list the
//! console reads. Input: the pool and the daemon's identity; output:
//! [`EngineRow`]s with the heartbeat's age on the database's clock.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

/// Who a daemon is, as it registers.
#[derive(Debug, Clone)]
pub struct Registration {
    pub engine_id: String,
    /// The API address on-call and the console reach it at.
    pub address: String,
    pub version: String,
    pub hostname: String,
    pub pid: i32,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct EngineRow {
    pub engine_id: String,
    pub address: String,
    pub version: String,
    pub hostname: String,
    pub pid: i32,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    pub stopped_at: Option<DateTime<Utc>>,
    /// now() − heartbeat_at, on the database's clock.
    pub heartbeat_age_ms: i64,
}

pub async fn register(pool: &PgPool, r: &Registration) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO engine_instances (engine_id, address, version, hostname, pid)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&r.engine_id)
    .bind(&r.address)
    .bind(&r.version)
    .bind(&r.hostname)
    .bind(r.pid)
    .execute(pool)
    .await?;
    Ok(())
}

/// The daemon is alive. A row marked stopped stays stopped.
pub async fn heartbeat(pool: &PgPool, engine_id: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE engine_instances SET heartbeat_at = now()
         WHERE engine_id = $1 AND stopped_at IS NULL",
    )
    .bind(engine_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// A clean shutdown: dead at once, not after `dead_after_ms`.
pub async fn stop(pool: &PgPool, engine_id: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE engine_instances SET stopped_at = now()
         WHERE engine_id = $1 AND stopped_at IS NULL",
    )
    .bind(engine_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// Every daemon heard from within `window`, newest start first.
pub async fn list(pool: &PgPool, window: chrono::Duration) -> Result<Vec<EngineRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT engine_id, address, version, hostname, pid, started_at, heartbeat_at, stopped_at,
                (extract(epoch FROM now() - heartbeat_at) * 1000)::bigint AS heartbeat_age_ms
         FROM engine_instances
         WHERE heartbeat_at > now() - make_interval(secs => $1)
         ORDER BY started_at DESC, engine_id",
    )
    .bind(window.num_milliseconds() as f64 / 1000.0)
    .fetch_all(pool)
    .await
}
