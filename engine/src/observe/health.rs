//! Probes every component of the stack for real: a query, a PING, a
//! NameServer request and a request to each broker itself (the NameServer
//! keeps a dead broker's route for up to two minutes, so asking it is not
//! enough). Every probe is bounded, so the whole report is ready within the
//! admin timeout even when components are down.
//!
//! Inputs: [`Config`], the client runtime. Output: [`HealthReport`].

use crate::config::Config;
use crate::domain::stats::{CircuitView, StatsView};
use crate::mq::rocket::RocketAdmin;
use crate::store::db;
use crate::store::redis as redis_conn;
use rocketmq_client_rust::ClientRuntime;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a probe found its component down. The text is what on-call reads in
/// the component's row, with the fix where one is known.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{what} did not answer within {limit:?}")]
    Timeout { what: &'static str, limit: Duration },
    #[error(transparent)]
    Db(#[from] db::DbError),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
    #[error(transparent)]
    RedisConnect(#[from] redis_conn::RedisError),
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    #[error("PING answered {0:?}")]
    BadPong(String),
    #[error(transparent)]
    Mq(#[from] crate::mq::rocket::MqError),
    #[error("unknown: the NameServer is down, so no broker can be found")]
    NameServerDown,
    #[error("no broker is registered with the NameServer; start one (`./scripts/stack.sh up`)")]
    NoBroker,
    #[error(
        "no engine answers ({0}); start one with `seckillctl engine run` or point --engine-url at it"
    )]
    NoEngine(reqwest::Error),
}

/// What an up (or degraded) component says of itself.
type Probed = (String, HealthState, Option<String>);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HealthState {
    Up,
    /// Reachable, but not usable as it is (e.g. the schema is behind).
    Degraded,
    Down,
}

#[derive(Debug, Clone, Serialize)]
pub struct ComponentHealth {
    pub component: String,
    pub endpoint: String,
    pub version: Option<String>,
    pub state: HealthState,
    pub latency_ms: u64,
    /// Why it is not up, with the fix where one is known.
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HealthReport {
    pub components: Vec<ComponentHealth>,
}

impl HealthReport {
    pub fn worst(&self) -> HealthState {
        if self.components.iter().any(|c| c.state == HealthState::Down) {
            HealthState::Down
        } else if self
            .components
            .iter()
            .any(|c| c.state == HealthState::Degraded)
        {
            HealthState::Degraded
        } else {
            HealthState::Up
        }
    }
}

fn row(
    component: &str,
    endpoint: &str,
    started: Instant,
    result: Result<Probed, ProbeError>,
) -> ComponentHealth {
    let latency_ms = started.elapsed().as_millis() as u64;
    match result {
        Ok((version, state, detail)) => ComponentHealth {
            component: component.into(),
            endpoint: endpoint.into(),
            version: Some(version),
            state,
            latency_ms,
            detail,
        },
        Err(e) => ComponentHealth {
            component: component.into(),
            endpoint: endpoint.into(),
            version: None,
            state: HealthState::Down,
            latency_ms,
            detail: Some(e.to_string()),
        },
    }
}

async fn within<T>(
    limit: Duration,
    what: &'static str,
    fut: impl Future<Output = Result<T, ProbeError>>,
) -> Result<T, ProbeError> {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or(Err(ProbeError::Timeout { what, limit }))
}

async fn postgres(cfg: &Config) -> ComponentHealth {
    let started = Instant::now();
    let endpoint = cfg.database_url_redacted();
    let result = within(cfg.admin_timeout(), "PostgreSQL", async {
        let pool = db::connect_unchecked(cfg).await?;
        let version: String = sqlx::query_scalar("SHOW server_version")
            .fetch_one(&pool)
            .await?;
        let version = version.split_whitespace().next().unwrap_or("?").to_owned();
        let schema = db::status(&pool).await?;
        pool.close().await;
        Ok(match db::verdict(&schema) {
            Ok(()) => (version, HealthState::Up, None),
            Err(e) => (version, HealthState::Degraded, Some(e.to_string())),
        })
    })
    .await;
    row("postgresql", &endpoint, started, result)
}

async fn redis(cfg: &Config) -> ComponentHealth {
    let started = Instant::now();
    let endpoint = cfg.redis_url_redacted();
    let result = within(cfg.admin_timeout(), "Redis", async {
        let mut conn = redis_conn::connect(cfg).await?;
        let pong: String = redis::cmd("PING").query_async(&mut conn).await?;
        if pong != "PONG" {
            return Err(ProbeError::BadPong(pong));
        }
        let version = redis_conn::server_version(&mut conn).await?;
        let persistence = redis_conn::persistence(&mut conn).await;
        let row = persistence_row(version, &persistence, cfg.redis.expect_persistence);
        Ok(match conn.cluster_nodes().await? {
            None => row,
            Some(nodes) => cluster_row(row, &nodes, cfg.redis.wait_replicas),
        })
    })
    .await;
    row("redis", &endpoint, started, result)
}

/// The Redis row with its persistence mode, degraded only when the
/// configuration expects persistence and Redis keeps nothing (pure).
fn persistence_row(version: String, p: &redis_conn::Persistence, expected: bool) -> Probed {
    let lacking = matches!(p, redis_conn::Persistence::None);
    if expected && lacking {
        return (
            version,
            HealthState::Degraded,
            Some(format!(
                "persistence: {p}, but [redis] expect_persistence is set; turn on AOF (`CONFIG SET appendonly yes`), or a restart loses every activity's state (runbooks/redis_state_lost.md)"
            )),
        );
    }
    (version, HealthState::Up, Some(format!("persistence: {p}")))
}

/// The Redis row of a cluster (pure): its shape, and degraded when a node
/// failed, a slot has no master, or a master has no live replica while
/// reservations are meant to wait for one (docs/architecture.md §4.6).
fn cluster_row(
    (version, state, detail): Probed,
    nodes: &[redis_conn::ClusterNode],
    wait_replicas: u32,
) -> Probed {
    use redis_conn::NodeRole;
    let live = |n: &&redis_conn::ClusterNode| !n.failed;
    let masters: Vec<_> = nodes
        .iter()
        .filter(live)
        .filter(|n| n.role == NodeRole::Master && !n.slots.is_empty())
        .collect();
    let replicas = nodes
        .iter()
        .filter(live)
        .filter(|n| n.role == NodeRole::Replica)
        .count();
    let mut problems = Vec::new();
    for n in nodes.iter().filter(|n| n.failed) {
        problems.push(format!("node {} failed", n.addr));
    }
    let served: u32 = masters
        .iter()
        .flat_map(|m| &m.slots)
        .map(|(lo, hi)| u32::from(hi.saturating_sub(*lo)) + 1)
        .sum();
    if served < 16_384 {
        problems.push(format!(
            "{} of 16384 slots have no live master: their activities refuse reservations",
            16_384 - served
        ));
    }
    if wait_replicas > 0 {
        for m in &masters {
            let has = nodes
                .iter()
                .filter(live)
                .filter(|r| r.master_id.as_deref() == Some(m.id.as_str()))
                .count();
            if (has as u32) < wait_replicas {
                problems.push(format!(
                    "master {} has {has} live replica(s) of {wait_replicas} wanted: its reservations are answered unreplicated, and its failure would lose them (restart the replica: ./scripts/stack.sh up --cluster)",
                    m.addr
                ));
            }
        }
    }
    let shape = format!("cluster: {} masters, {replicas} replicas", masters.len());
    let detail = match detail {
        Some(d) => format!("{shape}; {d}"),
        None => shape,
    };
    if problems.is_empty() {
        (version, state, Some(detail))
    } else {
        (
            version,
            HealthState::Degraded,
            Some(format!("{}; {detail}", problems.join("; "))),
        )
    }
}

async fn rocketmq(cfg: &Config, rt: Arc<ClientRuntime>) -> Vec<ComponentHealth> {
    let limit = cfg.admin_timeout();
    let started = Instant::now();
    let admin = match RocketAdmin::start(rt, &cfg.namesrv_addr, limit).await {
        Ok(a) => a,
        Err(e) => {
            return vec![row(
                "rocketmq-namesrv",
                &cfg.namesrv_addr,
                started,
                Err(e.into()),
            )];
        }
    };
    let ns = within(limit, "NameServer", async {
        admin.ping_namesrv().await?;
        Ok(("-".to_owned(), HealthState::Up, None))
    })
    .await;
    let ns_up = ns.is_ok();
    let mut rows = vec![row("rocketmq-namesrv", &cfg.namesrv_addr, started, ns)];
    if !ns_up {
        rows.push(row(
            "rocketmq-broker",
            "?",
            started,
            Err(ProbeError::NameServerDown),
        ));
        admin.shutdown().await;
        return rows;
    }
    let started = Instant::now();
    match admin.brokers().await {
        Ok(brokers) if brokers.is_empty() => rows.push(row(
            "rocketmq-broker",
            "?",
            started,
            Err(ProbeError::NoBroker),
        )),
        Ok(brokers) => {
            for b in brokers {
                let started = Instant::now();
                let r = within(limit, "broker", async {
                    let v = admin.broker_version(&b.addr).await?;
                    Ok((v, HealthState::Up, None))
                })
                .await;
                rows.push(row(
                    &format!("rocketmq-broker {}", b.name),
                    &b.addr,
                    started,
                    r,
                ));
            }
        }
        Err(e) => rows.push(row("rocketmq-broker", "?", started, Err(e.into()))),
    }
    admin.shutdown().await;
    rows
}

/// The `DLQ > 0` alert (docs/architecture.md §11.2, §9): degraded while any
/// mirrored message is still dead. Left out when the schema cannot be read
/// (the postgresql row already says why).
async fn dlq_alert(cfg: &Config) -> Option<ComponentHealth> {
    let started = Instant::now();
    let counts = within(cfg.admin_timeout(), "PostgreSQL", async {
        let pool = db::connect(cfg).await?;
        let counts: (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(DISTINCT ticket_id) FROM dlq_messages WHERE status = 'DEAD'",
        )
        .fetch_one(&pool)
        .await?;
        pool.close().await;
        Ok(counts)
    })
    .await
    .ok()?;
    let (state, detail) = match counts {
        (0, _) => (HealthState::Up, None),
        (dead, tickets) => (
            HealthState::Degraded,
            Some(format!(
                "DLQ > 0: {dead} dead message(s) in {tickets} ticket(s); `seckillctl dlq ticket list`; runbook runbooks/dlq.md"
            )),
        ),
    };
    Some(row(
        "alert: dlq",
        "dlq_messages",
        started,
        Ok((format!("{} dead", counts.0), state, detail)),
    ))
}

/// Every engine daemon (docs/architecture.md §14.3, §14.4): a row per
/// daemon the console reads (every live one of the registry, or
/// `--engine-url`'s list), a row per daemon the registry holds as dead,
/// and a row per elected singleton. Not part of [`check`]: the stack is
/// healthy without an engine between sales; the operator's `health` adds
/// them.
///
/// One daemon of several not answering, or fallen silent, is a finding
/// (degraded); only when none answers is the engine down. A daemon that
/// stopped cleanly is no finding at all: a rolling restart must not page.
pub async fn engines(cfg: &Config) -> Vec<ComponentHealth> {
    let limit = cfg.admin_timeout();
    let registry = within(limit, "PostgreSQL", async {
        let pool = db::connect_unchecked(cfg).await?;
        let window = chrono::Duration::from_std(super::DEAD_SHOWN).unwrap_or(chrono::Duration::MAX);
        let read = crate::ops::engines::with_roles(&pool, &cfg.registry, window).await;
        pool.close().await;
        Ok(read?)
    })
    .await
    .ok();
    let rows = registry.as_ref().map(|(e, _)| e.as_slice());
    let plan = super::engines::plan(&cfg.engine_urls, rows, &cfg.engine_url);
    let http = cfg.engine_http();
    let mut out = super::engines::each(plan.ask, |t| {
        let (cfg, http) = (cfg.clone(), http.clone());
        async move { engine_at(&cfg, &http, &t.url, t.id.as_deref()).await }
    })
    .await;
    if out.iter().any(|r| r.state != HealthState::Down) {
        for r in out.iter_mut().filter(|r| r.state == HealthState::Down) {
            r.state = HealthState::Degraded;
        }
    }
    for (t, why) in plan.dead.iter().zip(&plan.dead_because) {
        out.push(dead_row(t, *why));
    }
    if let Some((engines, roles)) = &registry {
        let live = engines
            .iter()
            .filter(|e| e.state == crate::decide::liveness::EngineState::Live)
            .count();
        out.extend(roles.iter().filter_map(|r| role_row(r, live, cfg)));
    }
    out
}

/// `engine <id>` when the registry names it, else `engine`.
fn engine_name(id: Option<&str>) -> String {
    id.map_or_else(|| "engine".to_owned(), |id| format!("engine {id}"))
}

/// A daemon the registry holds as dead: a finding when it fell silent,
/// nothing to act on when it stopped cleanly.
fn dead_row(t: &super::engines::Target, why: super::engines::Seen) -> ComponentHealth {
    let ago = t
        .heartbeat_age_ms
        .map_or("?".to_owned(), |ms| format!("{:.0} s", ms as f64 / 1000.0));
    let (state, detail) = match why {
        super::engines::Seen::Stopped => (
            HealthState::Up,
            format!("stopped cleanly {ago} ago; not counted"),
        ),
        _ => (
            HealthState::Degraded,
            format!(
                "dead: silent for {ago} (killed, hung, or cut off from PostgreSQL); its queues and pending sends moved to the live daemons; runbook runbooks/engine-dead.md"
            ),
        ),
    };
    ComponentHealth {
        component: engine_name(t.id.as_deref()),
        endpoint: t.url.clone(),
        version: t.version.clone(),
        state,
        latency_ms: 0,
        detail: Some(detail),
    }
}

/// An elected singleton: held by a live daemon, or a finding.
fn role_row(
    r: &crate::ops::engines::RoleView,
    live: usize,
    cfg: &Config,
) -> Option<ComponentHealth> {
    use crate::decide::liveness::RoleState;
    let (state, detail) = match (r.state, &r.holder) {
        (RoleState::Held, Some(h)) => (HealthState::Up, format!("run by {h}")),
        (RoleState::HandingOver, _) => (
            HealthState::Up,
            "handed over: its holder gave it back; a live daemon takes it on its next heartbeat"
                .to_owned(),
        ),
        (RoleState::HolderDead, Some(h)) => (
            HealthState::Degraded,
            format!(
                "its holder {h} is dead; a live daemon takes it within [registry] lease_ttl_ms ({} ms); runbook runbooks/singleton-unowned.md",
                cfg.registry.lease_ttl_ms
            ),
        ),
        // No live daemon: the engine rows say so already.
        _ if live == 0 => return None,
        _ => (
            HealthState::Degraded,
            format!(
                "no daemon runs it while {live} are live; runbook runbooks/singleton-unowned.md"
            ),
        ),
    };
    Some(ComponentHealth {
        component: format!("singleton {}", r.role),
        endpoint: "singleton_leases".to_owned(),
        version: None,
        state,
        latency_ms: 0,
        detail: Some(detail),
    })
}

/// One daemon: its `/readyz`, then its send circuit.
async fn engine_at(
    cfg: &Config,
    http: &reqwest::Client,
    url: &str,
    id: Option<&str>,
) -> ComponentHealth {
    let started = Instant::now();
    let result = within(cfg.admin_timeout(), "the engine", async {
        let resp = http
            .get(format!("{url}/readyz"))
            .send()
            .await
            .map_err(ProbeError::NoEngine)?;
        Ok(if resp.status().is_success() {
            // The send circuit says whether this engine can reach the
            // broker now (docs/architecture.md §6.7).
            let stats = http.get(format!("{url}/v1/stats")).send().await.ok();
            let refused = stats
                .as_ref()
                .map(|r| r.status())
                .filter(|s| *s == 401 || *s == 403);
            let circuit = match stats {
                Some(r) if r.status().is_success() => {
                    r.json::<StatsView>().await.ok().map(|s| s.circuit)
                }
                _ => None,
            };
            if let Some(status) = refused {
                (
                    "-".to_owned(),
                    HealthState::Degraded,
                    Some(format!(
                        "/v1/stats answered {status}: set SECKILL_TOKEN (or [auth] token_file) to a reader token (`seckillctl auth token create --role reader`)"
                    )),
                )
            } else {
                match circuit.as_ref().and_then(circuit_detail) {
                    Some(detail) => ("-".to_owned(), HealthState::Degraded, Some(detail)),
                    None => ("-".to_owned(), HealthState::Up, None),
                }
            }
        } else {
            (
                "-".to_owned(),
                HealthState::Degraded,
                Some(format!(
                    "/readyz answered {} (starting or shutting down)",
                    resp.status()
                )),
            )
        })
    })
    .await;
    row(&engine_name(id), url, started, result)
}

/// What an open send circuit means for on-call, or `None` while it is closed.
pub fn circuit_detail(c: &CircuitView) -> Option<String> {
    if c.state == "CLOSED" {
        return None;
    }
    Some(format!(
        "send circuit {} for {:.0} s: the broker does not answer; {} message(s) held, pending in Redis until it does (docs/architecture.md §6.7)",
        c.state,
        c.open_for_s.unwrap_or(0.0),
        c.held
    ))
}

/// Probes everything concurrently.
pub async fn check(cfg: &Config, rt: Arc<ClientRuntime>) -> HealthReport {
    let (pg, rd, mq, dlq) =
        tokio::join!(postgres(cfg), redis(cfg), rocketmq(cfg, rt), dlq_alert(cfg));
    let mut components = vec![pg, rd];
    components.extend(mq);
    components.extend(dlq);
    components.push(auth(cfg));
    HealthReport { components }
}

/// The token gate as configured (docs/security.md): `open` is for local
/// experiments, and says so.
pub fn auth(cfg: &Config) -> ComponentHealth {
    let (state, detail) = auth_row(cfg.auth.mode);
    ComponentHealth {
        component: "auth".to_owned(),
        endpoint: "-".to_owned(),
        version: None,
        state,
        latency_ms: 0,
        detail: Some(detail.to_owned()),
    }
}

fn auth_row(mode: crate::config::AuthMode) -> (HealthState, &'static str) {
    match mode {
        crate::config::AuthMode::Token => (
            HealthState::Up,
            "mode token: every API route needs a bearer token",
        ),
        crate::config::AuthMode::Open => (
            HealthState::Degraded,
            "[auth] mode = \"open\": the engine answers anyone, orders can be paid and tickets replayed without a token; set mode = \"token\" outside local experiments",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_gate_warns() {
        assert_eq!(auth_row(crate::config::AuthMode::Token).0, HealthState::Up);
        let (state, detail) = auth_row(crate::config::AuthMode::Open);
        assert_eq!(state, HealthState::Degraded);
        assert!(detail.contains("mode = \"token\""));
    }

    #[test]
    fn no_persistence_warns_only_where_it_is_expected() {
        use redis_conn::Persistence;
        let (_, state, detail) = persistence_row("7".into(), &Persistence::None, false);
        assert_eq!(state, HealthState::Up);
        assert!(detail.unwrap().contains("none"));
        let (_, state, detail) = persistence_row("7".into(), &Persistence::None, true);
        assert_eq!(state, HealthState::Degraded);
        assert!(detail.unwrap().contains("appendonly"));
        let aof = Persistence::Aof {
            appendfsync: "everysec".into(),
        };
        let (_, state, detail) = persistence_row("7".into(), &aof, true);
        assert_eq!(state, HealthState::Up);
        assert_eq!(detail.unwrap(), "persistence: aof (appendfsync everysec)");
    }

    #[test]
    fn a_cluster_row_names_failed_nodes_unserved_slots_and_lone_masters() {
        use redis_conn::parse_cluster_nodes;
        let healthy = parse_cluster_nodes(
            "a 127.0.0.1:7001@1 master - 0 0 1 connected 0-8191\n\
             b 127.0.0.1:7002@1 master - 0 0 2 connected 8192-16383\n\
             c 127.0.0.1:7003@1 slave a 0 0 1 connected\n\
             d 127.0.0.1:7004@1 slave b 0 0 2 connected\n",
        );
        let up = (
            "7".to_owned(),
            HealthState::Up,
            Some("persistence: x".to_owned()),
        );
        let (_, state, detail) = cluster_row(up.clone(), &healthy, 1);
        assert_eq!(state, HealthState::Up);
        assert_eq!(
            detail.unwrap(),
            "cluster: 2 masters, 2 replicas; persistence: x"
        );
        // b died and d took over: d serves its slots, with no replica left.
        let failed_over = parse_cluster_nodes(
            "a 127.0.0.1:7001@1 master - 0 0 1 connected 0-8191\n\
             b 127.0.0.1:7002@1 master,fail - 0 0 2 disconnected\n\
             c 127.0.0.1:7003@1 slave a 0 0 1 connected\n\
             d 127.0.0.1:7004@1 master - 0 0 3 connected 8192-16383\n",
        );
        let (_, state, detail) = cluster_row(up.clone(), &failed_over, 1);
        let detail = detail.unwrap();
        assert_eq!(state, HealthState::Degraded);
        assert!(detail.contains("node 127.0.0.1:7002 failed"), "{detail}");
        assert!(
            detail.contains("master 127.0.0.1:7004 has 0 live replica"),
            "{detail}"
        );
        assert!(!detail.contains("7001 has"), "{detail}");
        // Without waits a lone master is not a problem of the sale's.
        let (_, _, detail) = cluster_row(up.clone(), &failed_over, 0);
        assert!(!detail.unwrap().contains("live replica"));
        // Before the failover: b's slots have no live master.
        let down = parse_cluster_nodes(
            "a 127.0.0.1:7001@1 master - 0 0 1 connected 0-8191\n\
             b 127.0.0.1:7002@1 master,fail? - 0 0 2 connected 8192-16383\n",
        );
        let (_, state, detail) = cluster_row(up, &down, 0);
        assert_eq!(state, HealthState::Degraded);
        assert!(detail.unwrap().contains("8192 of 16384 slots"));
    }

    #[test]
    fn an_open_circuit_degrades_the_engine_with_the_outage_in_words() {
        let closed = CircuitView::default();
        assert_eq!(circuit_detail(&closed), None);
        let open = CircuitView {
            state: "OPEN".into(),
            open_for_s: Some(7.4),
            opened: 1,
            held: 320,
            probes: 4,
        };
        let d = circuit_detail(&open).expect("an open circuit is news");
        assert!(
            d.contains("OPEN for 7 s") && d.contains("320 message(s) held"),
            "{d}"
        );
    }
}
