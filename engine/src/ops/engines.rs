//! `seckillctl engines`: every engine daemon the registry knows, live or
//! dead (docs/architecture.md §14.3). Input: the pool and `[registry]`;
//! output: one [`EngineView`] per daemon, judged on the database's clock.

use crate::config::RegistryConfig;
use crate::decide::liveness::{self, DeadBecause, EngineState};
use crate::store::registry;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

#[derive(Debug, Clone, Serialize)]
pub struct EngineView {
    pub id: String,
    pub address: String,
    pub version: String,
    pub state: EngineState,
    pub dead_because: Option<DeadBecause>,
    pub hostname: String,
    pub pid: i32,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    pub heartbeat_age_ms: i64,
    pub stopped_at: Option<DateTime<Utc>>,
}

/// The daemons heard from within `window`, live first, then newest start.
pub async fn list(
    pool: &PgPool,
    cfg: &RegistryConfig,
    window: chrono::Duration,
) -> Result<Vec<EngineView>, sqlx::Error> {
    let dead_after = i64::try_from(cfg.dead_after_ms).unwrap_or(i64::MAX);
    let mut views: Vec<EngineView> = registry::list(pool, window)
        .await?
        .into_iter()
        .map(|r| {
            let (state, dead_because) =
                liveness::judge(r.stopped_at.is_some(), r.heartbeat_age_ms, dead_after);
            EngineView {
                id: r.engine_id,
                address: r.address,
                version: r.version,
                state,
                dead_because,
                hostname: r.hostname,
                pid: r.pid,
                started_at: r.started_at,
                heartbeat_at: r.heartbeat_at,
                heartbeat_age_ms: r.heartbeat_age_ms,
                stopped_at: r.stopped_at,
            }
        })
        .collect();
    // Stable: the registry's order (newest start first) within each state.
    views.sort_by_key(|v| v.state != EngineState::Live);
    Ok(views)
}
