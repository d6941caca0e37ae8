//! `seckillctl engines`: every engine daemon the registry knows, live or
//! dead, with the singleton roles each holds (docs/architecture.md §14.3,
//! §14.4). Input: the pool and `[registry]`; output: one [`EngineView`]
//! per daemon and one [`RoleView`] per singleton, judged on the database's
//! clock.

use crate::config::RegistryConfig;
use crate::decide::liveness::{self, DeadBecause, EngineState, LeaseFacts, RoleState};
use crate::domain::singleton::Singleton;
use crate::store::leases::{self, LeaseRow};
use crate::store::registry;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Debug, Clone, Serialize)]
pub struct EngineView {
    pub id: String,
    pub address: String,
    pub version: String,
    pub state: EngineState,
    pub dead_because: Option<DeadBecause>,
    /// The singletons whose unexpired lease this daemon holds.
    pub roles: Vec<Singleton>,
    pub hostname: String,
    pub pid: i32,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    pub heartbeat_age_ms: i64,
    pub stopped_at: Option<DateTime<Utc>>,
}

/// One elected singleton: who runs it, and whether that is a live daemon.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoleView {
    pub role: Singleton,
    pub state: RoleState,
    pub holder: Option<String>,
    pub acquired_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    /// Times it changed hands since the table was created.
    pub handovers: i64,
}

/// The daemons heard from within `window`, live first, then newest start.
pub async fn list(
    pool: &PgPool,
    cfg: &RegistryConfig,
    window: chrono::Duration,
) -> Result<Vec<EngineView>, sqlx::Error> {
    let leases = leases::list(pool).await?;
    Ok(judge(registry::list(pool, window).await?, &leases, cfg))
}

/// The registry's rows judged live or dead, each with its held roles.
fn judge(
    rows: Vec<registry::EngineRow>,
    leases: &[LeaseRow],
    cfg: &RegistryConfig,
) -> Vec<EngineView> {
    let dead_after = i64::try_from(cfg.dead_after_ms).unwrap_or(i64::MAX);
    let mut views: Vec<EngineView> = rows
        .into_iter()
        .map(|r| {
            let (state, dead_because) =
                liveness::judge(r.stopped_at.is_some(), r.heartbeat_age_ms, dead_after);
            EngineView {
                roles: leases
                    .iter()
                    .filter(|l| l.valid && l.holder == r.engine_id)
                    .map(|l| l.role)
                    .collect(),
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
    views
}

/// Every singleton, whether taken or not, judged against `engines`.
fn roles_of(leases: &[LeaseRow], engines: &[EngineView], ttl_ms: i64) -> Vec<RoleView> {
    let live = |id: &str| {
        engines
            .iter()
            .any(|e| e.id == id && e.state == EngineState::Live)
    };
    Singleton::ALL
        .into_iter()
        .map(|role| {
            let lease = leases.iter().find(|l| l.role == role);
            RoleView {
                role,
                state: liveness::judge_role(
                    lease.map(|l| LeaseFacts {
                        holder: &l.holder,
                        valid: l.valid,
                        expired_ms: l.expired_ms,
                    }),
                    live,
                    ttl_ms,
                ),
                holder: lease.filter(|l| l.valid).map(|l| l.holder.clone()),
                acquired_at: lease.map(|l| l.acquired_at),
                expires_at: lease.map(|l| l.expires_at),
                handovers: lease.map_or(0, |l| l.handovers),
            }
        })
        .collect()
}

/// The daemons and the singletons in one read.
pub async fn with_roles(
    pool: &PgPool,
    cfg: &RegistryConfig,
    window: chrono::Duration,
) -> Result<(Vec<EngineView>, Vec<RoleView>), sqlx::Error> {
    let leases = leases::list(pool).await?;
    let engines = judge(registry::list(pool, window).await?, &leases, cfg);
    let ttl_ms = i64::try_from(cfg.lease_ttl_ms).unwrap_or(i64::MAX);
    let roles = roles_of(&leases, &engines, ttl_ms);
    Ok((engines, roles))
}
