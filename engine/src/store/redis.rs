//! The Redis connection: one server or a Redis Cluster, chosen by the URL
//! (docs/scaling.md §3), with bounded connect and response timeouts, so a
//! dead Redis is reported instead of waited on.
//!
//! Input: `redis_url`, either one `redis://` URL (one server, through a
//! reconnecting [`ConnectionManager`]) or a comma-separated list of cluster
//! nodes (the `cluster-async` client, which follows MOVED and ASK and
//! re-reads the slot map after a failover). Output: a [`RedisConn`] that
//! every caller uses the same way, since both sides are a
//! [`ConnectionLike`].
//!
//! On a cluster every key of one activity carries the activity's hash tag
//! (`{prefix:activity}`, reservation/mod.rs `Keys`), so its scripts and
//! pipelines stay in one slot (docs/architecture.md §4.6).

use crate::config::Config;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use secrecy::ExposeSecret;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("invalid Redis URL {url}: {source}")]
    BadUrl {
        url: String,
        source: redis::RedisError,
    },
    #[error(
        "cannot reach Redis at {url}: {source}; is the stack up? (`./scripts/stack.sh up`, or `up --cluster` for a cluster)"
    )]
    Unreachable {
        url: String,
        source: redis::RedisError,
    },
    #[error(transparent)]
    Command(#[from] redis::RedisError),
}

/// What `redis_url` names (pure): one server, or the seed nodes of a Redis
/// Cluster. A comma makes it a cluster, so a one-node seed list is written
/// with a trailing comma.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Single(String),
    Cluster(Vec<String>),
}

impl Target {
    pub fn parse(url: &str) -> Target {
        if !url.contains(',') {
            return Target::Single(url.trim().to_owned());
        }
        Target::Cluster(
            url.split(',')
                .map(str::trim)
                .filter(|node| !node.is_empty())
                .map(|node| {
                    if node.contains("://") {
                        node.to_owned()
                    } else {
                        format!("redis://{node}")
                    }
                })
                .collect(),
        )
    }
}

/// One server or a cluster, used alike. Cheap to clone: both sides are
/// multiplexed handles.
#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RedisConn::Single(_) => "RedisConn::Single",
            RedisConn::Cluster(_) => "RedisConn::Cluster",
        })
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

impl RedisConn {
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConn::Cluster(_))
    }

    /// Runs a keyless command (`WAIT`) on the master that owns `key`'s slot:
    /// on a cluster the client would otherwise send it to every master.
    pub async fn on_master_of(&mut self, key: &str, cmd: &Cmd) -> redis::RedisResult<Value> {
        match self {
            RedisConn::Single(c) => cmd.query_async(c).await,
            RedisConn::Cluster(c) => {
                let route = Route::with_key(key, SlotAddr::Master);
                c.route_command(
                    cmd.clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await
            }
        }
    }

    /// Runs a server-wide read (`INFO`, `CONFIG GET`) on one master: the
    /// cluster's nodes are set up alike (scripts/stack.sh), and one answer
    /// is what the callers show.
    async fn on_one_master<T: redis::FromRedisValue>(
        &mut self,
        cmd: &Cmd,
    ) -> redis::RedisResult<T> {
        match self {
            RedisConn::Single(c) => cmd.query_async(c).await,
            RedisConn::Cluster(c) => {
                let v = c
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
                    )
                    .await?;
                Ok(redis::from_redis_value(v)?)
            }
        }
    }
}

/// One node of a Redis Cluster, as `CLUSTER NODES` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClusterNode {
    pub id: String,
    /// `host:port`.
    pub addr: String,
    pub role: NodeRole,
    /// A replica's master.
    pub master_id: Option<String>,
    /// Flagged `fail` or `pfail` by the cluster.
    pub failed: bool,
    /// A master's slot ranges, inclusive.
    pub slots: Vec<(u16, u16)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeRole {
    Master,
    Replica,
}

impl ClusterNode {
    pub fn port(&self) -> Option<u16> {
        self.addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok())
    }

    pub fn owns(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|(lo, hi)| (*lo..=*hi).contains(&slot))
    }
}

/// `CLUSTER NODES` text as nodes (pure). A line that does not parse is
/// skipped, not fatal: this is a view.
pub fn parse_cluster_nodes(text: &str) -> Vec<ClusterNode> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [id, addr, flags, master_id, ..] = fields[..] else {
                return None;
            };
            let flags: Vec<&str> = flags.split(',').collect();
            let role = if flags.contains(&"master") {
                NodeRole::Master
            } else if flags.contains(&"slave") {
                NodeRole::Replica
            } else {
                return None;
            };
            let slots = fields
                .get(8..)
                .unwrap_or_default()
                .iter()
                // `[slot->-id]` and `[slot-<-id]`: a slot on the move.
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(ClusterNode {
                id: id.to_owned(),
                addr: addr.split('@').next().unwrap_or(addr).to_owned(),
                role,
                master_id: (master_id != "-").then(|| master_id.to_owned()),
                failed: flags.iter().any(|f| f.contains("fail")),
                slots,
            })
        })
        .collect()
}

impl RedisConn {
    /// The cluster's nodes as one of them sees them; `None` on one server.
    pub async fn cluster_nodes(&mut self) -> Result<Option<Vec<ClusterNode>>, RedisError> {
        if !self.is_cluster() {
            return Ok(None);
        }
        let text: String = self
            .on_one_master(redis::cmd("CLUSTER").arg("NODES"))
            .await?;
        Ok(Some(parse_cluster_nodes(&text)))
    }
}

pub async fn connect(cfg: &Config) -> Result<RedisConn, RedisError> {
    let url = cfg.redis_url_redacted();
    let timeout = cfg.admin_timeout();
    match Target::parse(cfg.redis_url.expose_secret()) {
        Target::Single(one) => {
            let client = redis::Client::open(one).map_err(|source| RedisError::BadUrl {
                url: url.clone(),
                source,
            })?;
            let mgr_cfg = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(500));
            ConnectionManager::new_with_config(client, mgr_cfg)
                .await
                .map(RedisConn::Single)
                .map_err(|source| RedisError::Unreachable { url, source })
        }
        Target::Cluster(nodes) => {
            // The client retries a command through MOVED, ASK, TRYAGAIN and
            // a master's failover (re-reading the slot map), with backoff up
            // to about the time a replica needs to take over
            // (cluster-node-timeout plus the election; docs/scaling.md §3).
            let client = ClusterClient::builder(nodes)
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(8)
                .min_retry_wait(50)
                .max_retry_wait(1_000)
                .build()
                .map_err(|source| RedisError::BadUrl {
                    url: url.clone(),
                    source,
                })?;
            client
                .get_async_connection()
                .await
                .map(RedisConn::Cluster)
                .map_err(|source| RedisError::Unreachable { url, source })
        }
    }
}

/// `redis_version` from `INFO server`.
pub async fn server_version(conn: &mut RedisConn) -> Result<String, RedisError> {
    let info: String = conn.on_one_master(redis::cmd("INFO").arg("server")).await?;
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
pub async fn persistence(conn: &mut RedisConn) -> Persistence {
    async fn get(conn: &mut RedisConn, key: &str) -> Option<String> {
        let kv: Vec<String> = conn
            .on_one_master(redis::cmd("CONFIG").arg("GET").arg(key))
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
    fn cluster_nodes_parse_roles_slots_and_failures() {
        let text = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7002@17002 master,fail - 0 0 2 disconnected 5461 5462-10922 [5463->-c3]
c3 127.0.0.1:7005@17005 slave a1 0 0 1 connected
garbage
";
        let nodes = parse_cluster_nodes(text);
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].role, NodeRole::Master);
        assert_eq!(nodes[0].port(), Some(7001));
        assert!(nodes[0].owns(5460) && !nodes[0].owns(5461));
        assert!(nodes[1].failed && nodes[1].owns(5461) && nodes[1].owns(10922));
        assert_eq!(nodes[1].slots, vec![(5461, 5461), (5462, 10922)]);
        assert_eq!(nodes[2].role, NodeRole::Replica);
        assert_eq!(nodes[2].master_id.as_deref(), Some("a1"));
        assert!(nodes[2].slots.is_empty() && !nodes[2].failed);
    }

    #[test]
    fn a_comma_makes_a_cluster() {
        assert_eq!(
            Target::parse("redis://127.0.0.1:6379/"),
            Target::Single("redis://127.0.0.1:6379/".into())
        );
        assert_eq!(
            Target::parse("redis://127.0.0.1:7000, 127.0.0.1:7001,"),
            Target::Cluster(vec![
                "redis://127.0.0.1:7000".into(),
                "redis://127.0.0.1:7001".into()
            ])
        );
        assert_eq!(
            Target::parse("127.0.0.1:7000,"),
            Target::Cluster(vec!["redis://127.0.0.1:7000".into()])
        );
        assert_eq!(
            crate::config::redact_urls("redis://:pw@a:7000,redis://:pw@b:7001"),
            "redis://:***@a:7000,redis://:***@b:7001"
        );
    }

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
