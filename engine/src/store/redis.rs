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

/// How the Redis in use keeps its data across a restart (docs/architecture.md
/// §4.5): without persistence a restart loses every activity's state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Persistence {
    Aof {
        appendfsync: String,
    },
    Rdb {
        save: String,
    },
    None,
    /// `CONFIG GET` is not allowed (a managed Redis, say).
    Unknown,
}

impl std::fmt::Display for Persistence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Persistence::Aof { appendfsync } => write!(f, "aof (appendfsync {appendfsync})"),
            Persistence::Rdb { save } => write!(f, "rdb snapshots only (save {save})"),
            Persistence::None => f.write_str("none: a restart loses every key"),
            Persistence::Unknown => f.write_str("unknown (CONFIG GET refused)"),
        }
    }
}

/// The mode from `CONFIG GET appendonly`, `appendfsync` and `save` (pure).
pub fn persistence_mode(
    appendonly: Option<&str>,
    appendfsync: Option<&str>,
    save: Option<&str>,
) -> Persistence {
    match (appendonly, save) {
        (None, None) => Persistence::Unknown,
        (Some("yes"), _) => Persistence::Aof {
            appendfsync: appendfsync.unwrap_or("?").to_owned(),
        },
        (_, Some(s)) if !s.trim().is_empty() => Persistence::Rdb {
            save: s.trim().to_owned(),
        },
        _ => Persistence::None,
    }
}

/// Reads [`Persistence`]; a refused `CONFIG GET` is `Unknown`, not an error.
pub async fn persistence(conn: &mut ConnectionManager) -> Persistence {
    async fn get(conn: &mut ConnectionManager, key: &str) -> Option<String> {
        let kv: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(key)
            .query_async(conn)
            .await
            .ok()?;
        kv.into_iter().nth(1)
    }
    let appendonly = get(conn, "appendonly").await;
    let appendfsync = get(conn, "appendfsync").await;
    let save = get(conn, "save").await;
    persistence_mode(
        appendonly.as_deref(),
        appendfsync.as_deref(),
        save.as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistence_reads_aof_first_then_snapshots() {
        assert_eq!(
            persistence_mode(Some("yes"), Some("everysec"), Some("")),
            Persistence::Aof {
                appendfsync: "everysec".into()
            }
        );
        assert_eq!(
            persistence_mode(Some("no"), Some("everysec"), Some("3600 1 300 100")),
            Persistence::Rdb {
                save: "3600 1 300 100".into()
            }
        );
        assert_eq!(
            persistence_mode(Some("no"), Some("everysec"), Some("")),
            Persistence::None
        );
        assert_eq!(persistence_mode(None, None, None), Persistence::Unknown);
        assert!(Persistence::None.to_string().contains("loses"));
    }
}
