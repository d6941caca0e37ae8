//! Redis connection with bounded connect and response timeouts, so a dead
//! Redis is reported instead of waited on.

use crate::config::Config;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use secrecy::ExposeSecret;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("invalid Redis URL {url}: {source}")]
    BadUrl {
        url: String,
        source: redis::RedisError,
    },
    #[error("cannot reach Redis at {url}: {source}; is the stack up? (`./scripts/stack.sh up`)")]
    Unreachable {
        url: String,
        source: redis::RedisError,
    },
    #[error(transparent)]
    Command(#[from] redis::RedisError),
}

pub async fn connect(cfg: &Config) -> Result<ConnectionManager, RedisError> {
    let url = cfg.redis_url_redacted();
    let client = redis::Client::open(cfg.redis_url.expose_secret()).map_err(|source| {
        RedisError::BadUrl {
            url: url.clone(),
            source,
        }
    })?;
    let timeout = cfg.admin_timeout();
    let mgr_cfg = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(500));
    ConnectionManager::new_with_config(client, mgr_cfg)
        .await
        .map_err(|source| RedisError::Unreachable { url, source })
}

/// `redis_version` from `INFO server`.
pub async fn server_version(conn: &mut ConnectionManager) -> Result<String, RedisError> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned())
}
