//! Pure views over one or two [`Sample`]s: rates come from the difference
//! between consecutive samples, so every view is testable with literals.

use super::{GroupSample, Sample, Source};
use crate::config::Config;
use crate::decide::alerts::{AlertInputs, Ratio};
use crate::decide::backlog::{self, Drain, Level};
use crate::decide::scale::{BudgetInputs, ScaleInputs};
use crate::domain::ids::ActivityId;
use crate::mq::{Names, TopicKind};
use serde::Serialize;
use std::collections::BTreeMap;

fn dt_s(prev: &Sample, cur: &Sample) -> Option<f64> {
    let dt = (cur.at_ms - prev.at_ms) as f64 / 1000.0;
    (dt > 0.0).then_some(dt)
}

fn rate(prev: i64, cur: i64, dt: f64) -> f64 {
    // Offsets can move back when a topic is recreated: never a negative rate.
    ((cur - prev) as f64 / dt).max(0.0)
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BacklogRow {
    pub group: String,
    pub topic: String,
    pub lag_messages: i64,
    pub lag_seconds: f64,
    pub retry_lag_messages: i64,
    /// Messages handed to the engine's handler and not yet answered
    /// (order-create only, from a running engine).
    pub inflight: Option<i64>,
    pub consume_per_s: Option<f64>,
    pub produce_per_s: Option<f64>,
    /// docs/architecture.md §10.2; unknown until two samples give rates.
    pub drain: Option<Drain>,
    pub seconds_to_oldest_expiry: Option<f64>,
    pub verdict: Level,
    /// The lag broker by broker (`backlog --by-broker`).
    pub per_broker: Vec<crate::mq::BrokerLag>,
}

pub fn backlog(prev: Option<&Sample>, cur: &Sample, names: &Names) -> Vec<BacklogRow> {
    let order_group = names.group(TopicKind::OrderCreate);
    cur.groups
        .iter()
        .map(|g| {
            let before: Option<(&GroupSample, f64)> = prev.and_then(|p| {
                let dt = dt_s(p, cur)?;
                p.groups
                    .iter()
                    .find(|x| x.group == g.group)
                    .map(|x| (x, dt))
            });
            let consume = before.map(|(b, dt)| rate(b.consumer_offsets, g.consumer_offsets, dt));
            let produce = before.map(|(b, dt)| rate(b.broker_offsets, g.broker_offsets, dt));
            let drain = match (consume, produce) {
                _ if g.lag_messages <= 0 => Some(Drain::Empty),
                (Some(c), Some(p)) => Some(backlog::drain(g.lag_messages as f64, c, p)),
                _ => None,
            };
            let to_expiry = g
                .oldest_valid_until_ms
                .map(|v| (v - cur.at_ms) as f64 / 1000.0);
            let is_order = g.group == order_group;
            BacklogRow {
                group: g.group.clone(),
                topic: g.topic.clone(),
                lag_messages: g.lag_messages,
                lag_seconds: g.lag_seconds,
                retry_lag_messages: g.retry_lag_messages,
                inflight: is_order
                    .then(|| cur.engine.as_ref().map(|e| e.consume.inflight))
                    .flatten(),
                consume_per_s: consume,
                produce_per_s: produce,
                drain,
                seconds_to_oldest_expiry: to_expiry,
                verdict: backlog::verdict(g.lag_seconds, drain.unwrap_or(Drain::Empty), to_expiry),
                per_broker: g.per_broker.clone(),
            }
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingRow {
    pub activity_id: ActivityId,
    pub count: u64,
    pub oldest_age_s: Option<f64>,
    /// Negative: overdue for the scanner.
    pub next_due_in_s: Option<f64>,
    pub seconds_to_oldest_expiry: Option<f64>,
    pub attempts: BTreeMap<u32, u64>,
    pub expiring: u64,
    pub truncated: bool,
    pub verdict: Level,
}

pub fn pending(cur: &Sample) -> Vec<PendingRow> {
    let secs = |ms: i64| ms as f64 / 1000.0;
    cur.pending
        .iter()
        .map(|p| {
            let age = p.oldest_created_ms.map(|c| secs(cur.at_ms - c).max(0.0));
            PendingRow {
                activity_id: p.activity_id,
                count: p.count,
                oldest_age_s: age,
                next_due_in_s: p.next_due_ms.map(|d| secs(d - cur.at_ms)),
                seconds_to_oldest_expiry: p.oldest_valid_until_ms.map(|v| secs(v - cur.at_ms)),
                attempts: p.attempts.clone(),
                expiring: p.expiring,
                truncated: p.truncated,
                verdict: backlog::PENDING_OLDEST_AGE.level(age.unwrap_or(0.0)),
            }
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolRow {
    pub size: u32,
    pub idle: u32,
    pub in_use: u32,
    pub max: u32,
    pub acquire_wait_p95_ms: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerRow {
    pub active: i64,
    pub idle_in_transaction: i64,
    pub lock_waiters: i64,
    pub io_wait_share: f64,
    pub commits_per_s: Option<f64>,
    pub wal_bytes_per_s: Option<f64>,
    pub longest_tx_s: f64,
    pub connections: i64,
    pub max_connections: i64,
    pub autovacuum: Option<bool>,
    /// Dead row versions in the tables every order rewrites, and their
    /// share of all versions there: what autovacuum has yet to reclaim.
    pub churn_dead_rows: i64,
    pub churn_dead_share: f64,
}

/// Dead versions as a share of all; 0 for empty tables.
pub fn dead_share(dead: i64, live: i64) -> f64 {
    let all = dead.max(0) + live.max(0);
    if all == 0 {
        0.0
    } else {
        dead.max(0) as f64 / all as f64
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PgView {
    /// The engine's pool (from a running engine).
    pub pool: Option<PoolRow>,
    pub order_tx_p99_ms: Option<f64>,
    pub server: Option<ServerRow>,
}

pub fn pg(prev: Option<&Sample>, cur: &Sample) -> PgView {
    let pool = cur.engine.as_ref().map(|e| PoolRow {
        size: e.pool.size,
        idle: e.pool.idle,
        in_use: e.pool.size.saturating_sub(e.pool.idle),
        max: e.pool.max,
        acquire_wait_p95_ms: e.consume.pool_wait.p95_ms,
    });
    let server = cur.pg.as_ref().map(|s| {
        let before = prev.and_then(|p| Some((p.pg.as_ref()?, dt_s(p, cur)?)));
        ServerRow {
            active: s.active,
            idle_in_transaction: s.idle_in_transaction,
            lock_waiters: s.lock_waiters,
            io_wait_share: if s.active > 0 {
                s.io_waiters as f64 / s.active as f64
            } else {
                0.0
            },
            commits_per_s: before.map(|(b, dt)| rate(b.commits, s.commits, dt)),
            wal_bytes_per_s: before.map(|(b, dt)| ((s.wal_bytes - b.wal_bytes) / dt).max(0.0)),
            longest_tx_s: s.longest_tx_s,
            connections: s.connections,
            max_connections: s.max_connections,
            autovacuum: s.autovacuum,
            churn_dead_rows: s.churn_dead_rows,
            churn_dead_share: dead_share(s.churn_dead_rows, s.churn_live_rows),
        }
    });
    PgView {
        pool,
        order_tx_p99_ms: cur.engine.as_ref().map(|e| e.consume.tx.p99_ms),
        server,
    }
}

/// One daemon's row (`--by-engine`, the TUI's engines panel).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineRow {
    pub id: Option<String>,
    pub url: String,
    pub version: Option<String>,
    pub seen: super::engines::Seen,
    pub roles: Vec<crate::domain::singleton::Singleton>,
    pub heartbeat_age_ms: Option<i64>,
    /// Order messages in its handler now.
    pub inflight: Option<i64>,
    pub orders_created: Option<u64>,
    pub pool_in_use: Option<u32>,
    pub pool_max: Option<u32>,
    pub pool_wait_p95_ms: Option<f64>,
    pub order_tx_p99_ms: Option<f64>,
    pub send_circuit: Option<String>,
    pub admitting: Option<bool>,
    pub error: Option<String>,
}

pub fn engines(cur: &Sample) -> Vec<EngineRow> {
    cur.engines
        .iter()
        .map(|e| {
            let s = e.stats.as_ref();
            EngineRow {
                id: e.id.clone(),
                url: e.url.clone(),
                version: e.version.clone(),
                seen: e.seen,
                roles: e.roles.clone(),
                heartbeat_age_ms: e.heartbeat_age_ms,
                inflight: s.map(|s| s.consume.inflight),
                orders_created: s.map(|s| s.consume.created),
                pool_in_use: s.map(|s| s.pool.size.saturating_sub(s.pool.idle)),
                pool_max: s.map(|s| s.pool.max),
                pool_wait_p95_ms: s.map(|s| s.consume.pool_wait.p95_ms),
                order_tx_p99_ms: s.map(|s| s.consume.tx.p99_ms),
                send_circuit: s.map(|s| s.circuit.state.clone()),
                admitting: s.map(|s| s.governor.admission_open),
                error: e.error.clone(),
            }
        })
        .collect()
}

/// Unconsumed reservations near expiry: in Redis (not yet sent) and in
/// the order-create backlog (sent, not yet consumed).
pub fn expiring(s: &Sample) -> u64 {
    s.pending.iter().map(|p| p.expiring).sum::<u64>()
        + s.groups.iter().map(|g| g.expiring).sum::<u64>()
}

fn ratio(prev: Option<(u64, u64)>, cur: (u64, u64)) -> Ratio {
    let (bad, total) = match prev {
        Some((pb, pt)) => (cur.0.saturating_sub(pb), cur.1.saturating_sub(pt)),
        None => cur,
    };
    Ratio { bad, total }
}

/// The worst group's lag that held across the window: per group the
/// lesser of its two readings (docs/architecture.md §11.2). A stuck group's
/// lag only grows, so it fires one window later; a queue that merely moved
/// between daemons, waiting a second for its new owner's first pull, does
/// not page anyone. A group first seen now counts at its current reading.
fn sustained_lag(prev: Option<&Sample>, cur: &Sample) -> f64 {
    cur.groups
        .iter()
        .map(|g| {
            prev.and_then(|p| p.groups.iter().find(|b| b.group == g.group))
                .map_or(g.lag_seconds, |b| b.lag_seconds.min(g.lag_seconds))
        })
        .fold(0.0, f64::max)
}

pub fn alert_inputs(prev: Option<&Sample>, cur: &Sample) -> AlertInputs {
    let rocket_ok = cur.error(Source::Rocketmq).is_none();
    let redis_ok = cur.error(Source::Redis).is_none();
    let pending_age = redis_ok.then(|| {
        cur.pending
            .iter()
            .filter_map(|p| p.oldest_created_ms)
            .map(|c| ((cur.at_ms - c) as f64 / 1000.0).max(0.0))
            .fold(0.0, f64::max)
    });
    let engine_before = prev.and_then(|p| p.engine.as_ref());
    let sends = |e: &crate::domain::stats::StatsView| {
        (
            e.publish_unknown,
            e.publish_confirmed + e.publish_unknown + e.publish_definite_failure,
        )
    };
    let acks = |e: &crate::domain::stats::StatsView| {
        (e.consume.retried, e.consume.acked + e.consume.retried)
    };
    AlertInputs {
        pending_oldest_age_s: pending_age,
        consumer_lag_s: rocket_ok.then(|| {
            let before = prev.filter(|p| p.error(Source::Rocketmq).is_none());
            sustained_lag(before, cur)
        }),
        send_unknown: cur
            .engine
            .as_ref()
            .map(|e| ratio(engine_before.map(sends), sends(e))),
        ack_failure: cur
            .engine
            .as_ref()
            .map(|e| ratio(engine_before.map(acks), acks(e))),
        dlq_dead: cur.dlq.as_ref().map(|d| d.dead),
        dlq_oldest_age_s: cur.dlq.as_ref().and_then(|d| d.oldest_dead_age_s),
        pool_wait_p95_ms: cur.engine.as_ref().map(|e| e.consume.pool_wait.p95_ms),
        order_tx_p99_ms: cur.engine.as_ref().map(|e| e.consume.tx.p99_ms),
        expiring: (rocket_ok && redis_ok).then(|| expiring(cur)),
        expiring_before: prev
            .filter(|p| p.error(Source::Rocketmq).is_none() && p.error(Source::Redis).is_none())
            .map(expiring),
        redis_state_lost: cur.error(Source::RedisState).is_none().then(|| {
            cur.redis_lost
                .iter()
                .map(|r| format!("activity {} ({})", r.activity_id, r.state.as_str()))
                .collect()
        }),
    }
}

/// The docs/architecture.md §10.8 inputs, for `scale advise` and the daemon's admission control.
/// `rows` and `pg` are [`backlog`] and [`pg`] of the same two samples: the
/// caller has them already.
pub fn scale_inputs(
    prev: Option<&Sample>,
    cur: &Sample,
    rows: &[BacklogRow],
    pg: &PgView,
    cfg: &Config,
    names: &Names,
) -> ScaleInputs {
    let order_group = names.group(TopicKind::OrderCreate);
    let order = rows.iter().find(|r| r.group == order_group);
    let growth = match (order, prev) {
        (Some(r), Some(p)) => p
            .groups
            .iter()
            .find(|g| g.group == order_group)
            .and_then(|g| Some((r.lag_messages - g.lag_messages) as f64 / dt_s(p, cur)?))
            .unwrap_or(0.0),
        _ => 0.0,
    };
    let pending_expiry = cur
        .pending
        .iter()
        .filter_map(|p| p.oldest_valid_until_ms)
        .min()
        .map(|v| (v - cur.at_ms) as f64 / 1000.0);
    let to_expiry = match (
        order.and_then(|r| r.seconds_to_oldest_expiry),
        pending_expiry,
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    ScaleInputs {
        lag_seconds: order.map_or(0.0, |r| r.lag_seconds),
        lag_growth_per_s: growth,
        drain: order.and_then(|r| r.drain).unwrap_or(Drain::Empty),
        seconds_to_oldest_expiry: to_expiry,
        expiring: expiring(cur),
        near_horizon_s: cfg.alerts.expiry_horizon_s,
        pool_wait_p95_ms: pg.pool.as_ref().map(|p| p.acquire_wait_p95_ms),
        tx_p99_ms: pg.order_tx_p99_ms,
        io_wait_share: pg.server.as_ref().map(|s| s.io_wait_share),
        lock_waiters: pg.server.as_ref().map(|s| s.lock_waiters),
        longest_tx_s: pg.server.as_ref().map(|s| s.longest_tx_s),
        broker_uptime_s: cur.broker_uptime_s,
        budget: BudgetInputs {
            safe_pg_concurrency: cfg
                .governor
                .safe_pg_concurrency
                .unwrap_or(cfg.pg.max_connections),
            order_share: cfg.consumer.pg_share,
            // The registry's live daemons when it has any (an old schema, or
            // a console without PostgreSQL, falls back to the static figure).
            instances: cur
                .live_engines
                .filter(|n| *n > 0)
                .unwrap_or(cfg.governor.instances)
                .max(1),
            // Per instance: the busiest daemon's (the merged view adds
            // the daemons' limits up).
            threads_per_instance: cur
                .engines
                .iter()
                .filter_map(|e| e.stats.as_ref())
                .map(|e| e.governor.limit)
                .max()
                .or(cur.engine.as_ref().map(|e| e.governor.limit))
                .unwrap_or(cfg.consumer_threads()),
            pools_max: cur.engine.as_ref().map(|e| e.pool.max),
            server_max_connections: cur.pg.as_ref().map(|s| s.max_connections),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::{PendingSample, PgServerSample};
    use super::*;

    fn group(names: &Names, broker: i64, consumer: i64, lag_s: f64) -> GroupSample {
        GroupSample {
            group: names.group(TopicKind::OrderCreate),
            topic: names.topic(TopicKind::OrderCreate),
            lag_messages: broker - consumer,
            lag_seconds: lag_s,
            retry_lag_messages: 0,
            retry_lag_seconds: 0.0,
            broker_offsets: broker,
            consumer_offsets: consumer,
            oldest_valid_until_ms: None,
            expiring: 0,
            per_broker: Vec::new(),
            queues: Vec::new(),
        }
    }

    fn sample(at_ms: i64, groups: Vec<GroupSample>) -> Sample {
        Sample {
            at_ms,
            groups,
            pending: vec![],
            pg: None,
            dlq: None,
            engine: None,
            engines: Vec::new(),
            broker_uptime_s: None,
            redis_lost: vec![],
            live_engines: None,
            errors: vec![],
        }
    }

    #[test]
    fn the_budget_counts_the_registrys_live_engines_over_the_static_figure() {
        let n = Names::new("T_");
        let mut cfg = Config::default();
        cfg.governor.instances = 12;
        let mut cur = sample(0, vec![group(&n, 0, 0, 0.0)]);
        let inputs = |cur: &Sample| {
            let rows = backlog(None, cur, &n);
            scale_inputs(None, cur, &rows, &pg(None, cur), &cfg, &n)
        };
        assert_eq!(
            inputs(&cur).budget.instances,
            12,
            "no registry: the static figure"
        );
        cur.live_engines = Some(3);
        assert_eq!(inputs(&cur).budget.instances, 3);
        cur.live_engines = Some(0);
        assert_eq!(
            inputs(&cur).budget.instances,
            12,
            "an empty registry says nothing"
        );
    }

    #[test]
    fn rates_and_drain_come_from_two_samples() {
        let n = Names::new("T_");
        // The docs/architecture.md §10.1 burst, half a second in: 10,000 produced, 2,000 consumed.
        let a = sample(0, vec![group(&n, 0, 0, 0.0)]);
        let b = sample(500, vec![group(&n, 10_000, 2_000, 0.5)]);
        let rows = backlog(Some(&a), &b, &n);
        assert_eq!(rows[0].produce_per_s, Some(20_000.0));
        assert_eq!(rows[0].consume_per_s, Some(4_000.0));
        assert_eq!(rows[0].lag_messages, 8_000);
        assert_eq!(rows[0].drain, Some(Drain::Never), "still producing faster");
        assert_eq!(rows[0].verdict, Level::Critical);
        // Production stops: the next second consumes 4,000 and produces nothing.
        let c = sample(1_500, vec![group(&n, 10_000, 6_000, 0.9)]);
        let rows = backlog(Some(&b), &c, &n);
        assert_eq!(rows[0].drain, Some(Drain::In(1.0)), "4,000 left at 4,000/s");
        assert_eq!(rows[0].verdict, Level::Ok);
        // One sample: no rates, the verdict by lag alone.
        let rows = backlog(None, &c, &n);
        assert_eq!((rows[0].consume_per_s, rows[0].drain), (None, None));
    }

    #[test]
    fn the_lag_alert_reads_what_held_across_the_window() {
        let n = Names::new("T_");
        let at = |lag| sample(0, vec![group(&n, 10, 0, lag)]);
        let lag = |prev: Option<&Sample>, cur: &Sample| alert_inputs(prev, cur).consumer_lag_s;
        // A queue that moved: one reading high, the next one low again.
        assert_eq!(lag(Some(&at(0.4)), &at(2.7)), Some(0.4));
        assert_eq!(lag(Some(&at(2.7)), &at(0.4)), Some(0.4));
        // A stuck group keeps growing: it fires one window later.
        assert_eq!(lag(Some(&at(2.6)), &at(3.6)), Some(2.6));
        // One sample, or a group not there before: the reading as it is.
        assert_eq!(lag(None, &at(2.7)), Some(2.7));
        assert_eq!(lag(Some(&sample(0, vec![])), &at(2.7)), Some(2.7));
        // The broker unread before: that reading says nothing.
        let mut blind = at(0.1);
        blind.errors.push(super::super::SourceError {
            source: Source::Rocketmq,
            error: "down".into(),
        });
        assert_eq!(lag(Some(&blind), &at(2.7)), Some(2.7));
    }

    #[test]
    fn pending_age_and_pg_rates() {
        let mut a = sample(10_000, vec![]);
        a.pending.push(PendingSample {
            activity_id: ActivityId(7),
            count: 2,
            oldest_created_ms: Some(6_000),
            next_due_ms: Some(9_000),
            oldest_valid_until_ms: Some(40_000),
            attempts: BTreeMap::from([(0, 1), (2, 1)]),
            expiring: 0,
            truncated: false,
        });
        let rows = pending(&a);
        assert_eq!(rows[0].oldest_age_s, Some(4.0));
        assert_eq!(rows[0].next_due_in_s, Some(-1.0));
        assert_eq!(rows[0].verdict, Level::Critical);
        assert_eq!(alert_inputs(None, &a).pending_oldest_age_s, Some(4.0));

        let server = |commits, wal| PgServerSample {
            active: 4,
            idle_in_transaction: 0,
            lock_waiters: 1,
            io_waiters: 2,
            longest_tx_s: 0.1,
            max_connections: 100,
            connections: 10,
            commits,
            wal_bytes: wal,
            autovacuum: Some(false),
            churn_dead_rows: 300,
            churn_live_rows: 100,
        };
        a.pg = Some(server(100, 1_000.0));
        let mut b = sample(12_000, vec![]);
        b.pg = Some(server(700, 5_000.0));
        let v = pg(Some(&a), &b);
        let s = v.server.unwrap();
        assert_eq!(s.commits_per_s, Some(300.0));
        assert_eq!(s.wal_bytes_per_s, Some(2_000.0));
        assert_eq!(s.io_wait_share, 0.5);
        assert_eq!((s.autovacuum, s.churn_dead_rows), (Some(false), 300));
        assert_eq!(s.churn_dead_share, 0.75);
        assert_eq!(dead_share(0, 0), 0.0);
        assert_eq!(dead_share(-1, 10), 0.0, "a negative count reads as none");
        assert!(v.pool.is_none(), "no engine, no pool figures");
    }
}
