//! This daemon in the engine registry (docs/architecture.md §14.3): its row
//! written once it serves, a heartbeat every `[registry] heartbeat_ms` until
//! shutdown, and its stop marked on the way out, so `seckillctl engines`
//! shows it dead at once rather than after `dead_after_ms`. A daemon killed
//! outright stops beating and is judged dead by its silence.

use crate::config::RegistryConfig;
use crate::store::registry::{self, Registration};
use sqlx::PgPool;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// This process as the registry knows it.
pub(super) fn identity(engine_id: String, address: String) -> Registration {
    Registration {
        engine_id,
        address,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "?".to_owned()),
        pid: i32::try_from(std::process::id()).unwrap_or(-1),
    }
}

/// Registers and beats until `cancel`; a failed beat is logged and tried
/// again on the next one (PostgreSQL away for a moment must not stop the
/// daemon, only make it look silent).
pub(super) async fn register(
    pool: &PgPool,
    me: &Registration,
    cfg: &RegistryConfig,
    cancel: CancellationToken,
) -> Result<(), sqlx::Error> {
    registry::register(pool, me).await?;
    tracing::info!(engine_id = %me.engine_id, address = %me.address, "registered in the engine registry");
    let (pool, id) = (pool.clone(), me.engine_id.clone());
    let every = Duration::from_millis(cfg.heartbeat_ms.max(100));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
            if let Err(e) = registry::heartbeat(&pool, &id).await {
                tracing::warn!(error = %e, "the registry heartbeat failed; trying again");
            }
        }
    });
    Ok(())
}

/// Marks the stop; best effort, the silence says the same later.
pub(super) async fn stopped(pool: &PgPool, engine_id: &str) {
    if let Err(e) = registry::stop(pool, engine_id).await {
        tracing::warn!(error = %e, "could not mark this engine stopped in the registry");
    }
}
