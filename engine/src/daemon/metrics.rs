//! `/metrics` (docs/architecture.md §11.1): OpenMetrics text, encoded by the
//! `prometheus-client` crate.
//!
//! Three sources, one registry built per scrape:
//! - the traffic families ([`Meters`]): every send and every delivery by
//!   topic, group and outcome, with their latency histograms, recorded at
//!   the message-queue boundary;
//! - the order transaction's and the pool wait's histograms, fed with the
//!   same samples as the windows the alerts read;
//! - a [`Collector`] over a [`Scrape`]: the engine's counters and the
//!   governor's latest tick (lag, pending, DLQ, alerts), read as they stand
//!   at the scrape. The governor ticks once as the daemon starts, so these
//!   are only missing when a source could not be read.
//!
//! Why the crate and not the hand-written text this file used to hold: it
//! gives histograms (a window's percentiles cannot be summed over engines
//! or time, a histogram's buckets can), escapes labels and writes the
//! format's details (`_total`, `# EOF`) as Prometheus expects them.

use crate::daemon::governor::Tick;
use crate::decide::alerts::AlertState;
use crate::domain::meters::{Meters, label_value};
use crate::domain::stats::StatsView;
use crate::mq::position::{Positions, Queues};
use crate::mq::{Names, TopicKind};
use crate::observe::{GroupSample, Sample as TickSample};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The content type of the text [`render`] returns.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every docs/architecture.md §11.1 name, as the samples carry it: a
/// counter's with `_total`, a histogram's without its `_bucket`, `_sum`
/// and `_count`.
pub const METRIC_NAMES: [&str; 26] = [
    "mq_publish_total",
    "mq_publish_latency_seconds",
    "mq_publish_unknown_total",
    "reservation_mq_pending",
    "reservation_mq_pending_oldest_age_seconds",
    "reservation_resend_total",
    "mq_send_circuit_open",
    "mq_send_circuit_held_total",
    "mq_consume_total",
    "mq_consume_process_seconds",
    "mq_consumer_inflight",
    "mq_consumer_ready",
    "mq_consumer_lag_messages",
    "mq_consumer_lag_seconds",
    "mq_ack_failure_total",
    "mq_duplicate_message_total",
    "mq_business_reject_total",
    "mq_dlq_messages",
    "mq_dlq_oldest_age_seconds",
    "mq_dlq_replay_total",
    "order_tx_latency_seconds",
    "pg_pool_wait_seconds",
    "pg_pool_acquired",
    "pg_deadlock_total",
    "pg_serialization_retry_total",
    "inventory_condition_update_miss_total",
];

/// The `replay_outcome` enum of the schema.
const REPLAY_OUTCOMES: [&str; 6] = [
    "PENDING",
    "VERIFIED",
    "SEND_FAILED",
    "SEND_UNKNOWN",
    "VERIFY_FAILED",
    "NOT_SENT",
];

/// What one scrape reads besides the live families.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub names: Names,
    pub stats: StatsView,
    pub tick: Option<Arc<Tick>>,
    /// Reservations and releases answered before a Redis replica held
    /// them (docs/architecture.md §4.6).
    pub redis_unreplicated: u64,
    /// `mq_consumer_ready`, group by group ([`ready`]).
    pub ready: Vec<Ready>,
}

/// Messages of one group waiting on the broker in the queues this process
/// was assigned, not yet handed to its listener.
#[derive(Debug, Clone, PartialEq)]
pub struct Ready {
    pub group: String,
    pub topic: String,
    pub messages: i64,
}

/// Everything `/metrics` shows.
pub struct Parts<'a> {
    pub meters: &'a Meters,
    pub order_tx: Option<&'a Histogram>,
    pub pool_wait: Option<&'a Histogram>,
    pub scrape: Scrape,
}

/// The whole `/metrics` body.
pub fn render(parts: Parts<'_>) -> String {
    let mut r = Registry::default();
    parts.meters.register(&mut r);
    if let Some(h) = parts.order_tx {
        r.register(
            "order_tx_latency_seconds",
            "One order transaction, BEGIN to COMMIT",
            h.clone(),
        );
    }
    if let Some(h) = parts.pool_wait {
        r.register(
            "pg_pool_wait_seconds",
            "Waiting for a pooled connection (with BEGIN), order transactions",
            h.clone(),
        );
    }
    r.register_collector(Box::new(parts.scrape));
    let mut out = String::with_capacity(16 * 1024);
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &r);
    out
}

/// `mq_consumer_ready` of every group the tick read, for this process:
/// its queue assignment (`positions`) and what its listeners hold
/// (`meters`, over the group's topic and its `%RETRY%`).
pub fn readiness(tick: Option<&Tick>, positions: &Positions, meters: &Meters) -> Vec<Ready> {
    let groups = tick.map(|t| t.sample.groups.as_slice()).unwrap_or(&[]);
    groups
        .iter()
        .filter_map(|g| {
            let inflight = meters.inflight_of(&g.group, &g.topic)
                + meters.inflight_of(&g.group, &crate::mq::topics::retry_topic(&g.group));
            ready(g, |topic| positions.assigned(&g.group, topic), inflight)
        })
        .collect()
}

/// `mq_consumer_ready` of one group (§11.1): over the queues the client's
/// last rebalance gave this process (`assigned`, by topic: the group's
/// topic and its `%RETRY%`), the messages after the consumer's position,
/// less those the listener holds now. `None` while the client has not said
/// what it was given, or no tick has read the group's queues.
pub fn ready(
    g: &GroupSample,
    assigned: impl Fn(&str) -> Option<Queues>,
    inflight: i64,
) -> Option<Ready> {
    let topics: HashSet<&str> = g.queues.iter().map(|q| q.topic.as_str()).collect();
    let given: HashMap<&str, Queues> = topics
        .into_iter()
        .filter_map(|t| assigned(t).map(|q| (t, q)))
        .collect();
    if given.is_empty() {
        return None;
    }
    let mine: i64 = g
        .queues
        .iter()
        .filter(|q| {
            given
                .get(q.topic.as_str())
                .is_some_and(|s| s.contains(&(q.broker.clone(), q.queue_id)))
        })
        .map(|q| q.messages)
        .sum();
    Some(Ready {
        group: g.group.clone(),
        topic: g.topic.clone(),
        messages: (mine - inflight).max(0),
    })
}

// ---------------------------------------------------------------------------
// The scrape-time families, one function per group of the §11.1 table.
// ---------------------------------------------------------------------------

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for f in [
            self.producer(),
            self.consumer(),
            self.dlq(),
            self.postgres(),
            self.engine(),
        ]
        .iter()
        .flatten()
        {
            f.encode(&mut enc)?;
        }
        Ok(())
    }
}

impl Scrape {
    fn sample(&self) -> Option<&TickSample> {
        self.tick.as_deref().map(|t| &t.sample)
    }

    /// Reservations still waiting for a confirmed send, the scanner's
    /// re-sends and the send circuit (§6).
    fn producer(&self) -> Vec<Family> {
        let s = &self.stats;
        let sample = self.sample();
        vec![
            Family::gauge(
                "reservation_mq_pending",
                "Reservations waiting for a confirmed send",
            )
            .level_if_read(Labels::new(), sample.map(pending_total)),
            Family::gauge(
                "reservation_mq_pending_oldest_age_seconds",
                "Age of the oldest pending reservation",
            )
            .level_if_read(Labels::new(), sample.map(oldest_pending_age_s)),
            Family::counter("reservation_resend", "Scanner re-sends by outcome")
                .count(labels([("outcome", "CONFIRMED")]), s.resend.confirmed)
                .count(labels([("outcome", "UNKNOWN")]), s.resend.unknown)
                .count(
                    labels([("outcome", "DEFINITE_FAILURE")]),
                    s.resend.definite_failure,
                )
                .count(labels([("outcome", "EXPIRED")]), s.resend.expired),
            Family::gauge(
                "mq_send_circuit_open",
                "1 while the send circuit holds sends back: the broker does not answer (§6.7)",
            )
            .level(
                Labels::new(),
                f64::from(u8::from(s.circuit.state != "CLOSED")),
            ),
            Family::counter(
                "mq_send_circuit_held",
                "Messages the open circuit kept from sending; they stayed pending in Redis",
            )
            .count(Labels::new(), s.circuit.held),
        ]
    }

    /// What waits on the broker per group, duplicates and business
    /// rejections (§7, §8).
    fn consumer(&self) -> Vec<Family> {
        let (c, l, names) = (&self.stats.consume, &self.stats.lifecycle, &self.names);
        let groups = self.sample().map(|s| s.groups.as_slice()).unwrap_or(&[]);
        let of = |kind: TopicKind| {
            labels([("topic", &names.topic(kind)), ("group", &names.group(kind))])
        };
        let with = |kind: TopicKind, reason: &'static str| {
            labels([
                ("topic", &names.topic(kind)),
                ("group", &names.group(kind)),
                ("reason", reason),
            ])
        };
        let per_group = |f: fn(&GroupSample) -> f64| {
            groups
                .iter()
                .map(move |g| (group_labels(&g.group, &g.topic), Value::Level(f(g))))
        };
        vec![
            Family::gauge(
                "mq_consumer_ready",
                "Messages waiting on the broker in the queues this engine's client was assigned, not yet handed to its listener",
            )
            .samples(self.ready.iter().map(|r| {
                (
                    group_labels(&r.group, &r.topic),
                    Value::Level(r.messages as f64),
                )
            })),
            Family::gauge(
                "mq_consumer_lag_messages",
                "Unconsumed messages of the group, %RETRY% included",
            )
            .samples(per_group(|g| g.lag_messages as f64)),
            Family::gauge(
                "mq_consumer_lag_seconds",
                "Age of the oldest unconsumed message of the group, %RETRY% included",
            )
            .samples(per_group(|g| g.lag_seconds)),
            Family::counter(
                "mq_duplicate_message",
                "Deliveries whose effect had already happened (the group's inbox, or the reservation, said so)",
            )
            .count(
                of(TopicKind::OrderCreate),
                c.duplicates + c.duplicate_reservation,
            )
            .count(of(TopicKind::OrderTimeout), l.cancel_duplicates)
            .count(of(TopicKind::InventoryCompensate), l.release_duplicates),
            Family::counter(
                "mq_business_reject",
                "Reservations turned down by the order transaction, by reason",
            )
            .count(with(TopicKind::OrderCreate, "NO_STOCK"), c.rejected_no_stock)
            .count(
                with(TopicKind::OrderCreate, "DUPLICATE_USER"),
                c.rejected_duplicate_user,
            )
            .count(with(TopicKind::OrderCreate, "EXPIRED"), c.rejected_expired)
            .count(with(TopicKind::OrderCreate, "QUARANTINED"), c.quarantined),
        ]
    }

    /// Dead messages and operator replays (§9), from the governor's tick.
    fn dlq(&self) -> Vec<Family> {
        let dlq = self.sample().and_then(|s| s.dlq.as_ref());
        // Every outcome of `replay_outcome`, zero included, once the DLQ is read.
        let replays = dlq.into_iter().flat_map(|d| {
            REPLAY_OUTCOMES.iter().map(|k| {
                let n = d.replays.get(*k).copied().unwrap_or(0);
                (labels([("result", k)]), Value::Count(n))
            })
        });
        vec![
            Family::gauge(
                "mq_dlq_messages",
                "Dead messages not yet replayed or discarded",
            )
            .level_if_read(Labels::new(), dlq.map(|d| d.dead as f64)),
            Family::gauge(
                "mq_dlq_oldest_age_seconds",
                "Age of the oldest dead message",
            )
            .level_if_read(
                Labels::new(),
                dlq.map(|d| d.oldest_dead_age_s.unwrap_or(0.0)),
            ),
            Family::counter(
                "mq_dlq_replay",
                "Operator replays by outcome (replay_audit)",
            )
            .samples(replays),
        ]
    }

    /// The pool the order transaction waits on, and what went wrong in it
    /// (§7, §10.11).
    fn postgres(&self) -> Vec<Family> {
        let (c, pool) = (&self.stats.consume, &self.stats.pool);
        vec![
            Family::gauge("pg_pool_acquired", "Pool connections in use")
                .level(Labels::new(), pool.size.saturating_sub(pool.idle) as f64),
            Family::counter("pg_deadlock", "Order transactions that hit a deadlock")
                .count(Labels::new(), c.deadlocks),
            Family::counter(
                "pg_serialization_retry",
                "Order transactions retried on a serialization failure",
            )
            .count(Labels::new(), c.serialization_failures),
            Family::counter(
                "inventory_condition_update_miss",
                "Conditional stock decrements that found no stock",
            )
            .count(Labels::new(), c.rejected_no_stock),
        ]
    }

    /// The governor (docs/architecture.md §10) and the alerts of §11.2.
    fn engine(&self) -> Vec<Family> {
        let g = &self.stats.governor;
        let alerts = self.tick.iter().flat_map(|k| {
            k.alerts.iter().filter_map(|a| {
                alert_level(a.state).map(|v| (labels([("alert", a.metric)]), Value::Level(v)))
            })
        });
        vec![
            Family::gauge(
                "seckill_admission_open",
                "1 while new reservations are admitted",
            )
            .level(Labels::new(), if g.admission_open { 1.0 } else { 0.0 }),
            Family::counter(
                "seckill_admission_trips",
                "Times admission control closed",
            )
            .count(Labels::new(), g.admission_trips),
            Family::counter(
                "seckill_admission_refused",
                "Reservations refused while closed",
            )
            .count(Labels::new(), g.admission_refused),
            Family::counter(
                "seckill_redis_unreplicated_writes",
                "Reservations and releases answered before a Redis replica acknowledged them (§4.6): a failover now could lose them",
            )
            .count(Labels::new(), self.redis_unreplicated),
            Family::gauge(
                "seckill_consumer_concurrency_limit",
                "Order transactions allowed at once (never above the budget)",
            )
            .level(Labels::new(), g.limit as f64),
            Family::gauge(
                "seckill_alert_state",
                "Alerts of docs/architecture.md §11.2: 0 ok, 1 warning, 2 critical",
            )
            .samples(alerts),
        ]
    }
}

// ---------------------------------------------------------------------------
// Figures derived from the governor's tick: pure, so the families above
// read as plain lists.
// ---------------------------------------------------------------------------

/// Reservations waiting for a confirmed send, over every activity.
fn pending_total(s: &TickSample) -> f64 {
    s.pending.iter().map(|a| a.count as f64).sum()
}

/// Age of the oldest pending reservation; 0 with none (or one stamped
/// after the sample, by clock skew).
fn oldest_pending_age_s(s: &TickSample) -> f64 {
    s.pending
        .iter()
        .filter_map(|p| p.oldest_created_ms)
        .map(|c| ((s.at_ms - c) as f64 / 1000.0).max(0.0))
        .fold(0.0, f64::max)
}

/// `seckill_alert_state`: 0 ok, 1 warning, 2 critical; an alert without
/// data has no sample rather than a reassuring 0 (§11.2).
fn alert_level(state: AlertState) -> Option<f64> {
    match state {
        AlertState::NoData => None,
        AlertState::Critical => Some(2.0),
        AlertState::Warn => Some(1.0),
        AlertState::Ok => Some(0.0),
    }
}

// ---------------------------------------------------------------------------
// One scrape-time family: its descriptor, then its samples (none at all is
// allowed: the family is still declared).
// ---------------------------------------------------------------------------

type Labels = Vec<(&'static str, String)>;

fn labels<const N: usize>(pairs: [(&'static str, &str); N]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, label_value(v))).collect()
}

fn group_labels(group: &str, topic: &str) -> Labels {
    labels([("group", group), ("topic", topic)])
}

#[derive(Debug, Clone, Copy)]
enum Value {
    Count(u64),
    Level(f64),
}

struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, Value)>,
}

impl Family {
    fn counter(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            kind: MetricType::Counter,
            samples: Vec::new(),
        }
    }

    fn gauge(name: &'static str, help: &'static str) -> Self {
        Self {
            kind: MetricType::Gauge,
            ..Self::counter(name, help)
        }
    }

    fn count(mut self, labels: Labels, n: u64) -> Self {
        self.samples.push((labels, Value::Count(n)));
        self
    }

    fn level(mut self, labels: Labels, v: f64) -> Self {
        self.samples.push((labels, Value::Level(v)));
        self
    }

    /// A tick-fed sample: none while the source could not be read.
    fn level_if_read(self, labels: Labels, v: Option<f64>) -> Self {
        match v {
            Some(v) => self.level(labels, v),
            None => self,
        }
    }

    fn samples(mut self, samples: impl IntoIterator<Item = (Labels, Value)>) -> Self {
        self.samples.extend(samples);
        self
    }

    fn encode(&self, enc: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        // OpenMetrics HELP text ends in a full stop, as the registered
        // families' do.
        let help = format!("{}.", self.help);
        let mut m = enc.encode_descriptor(self.name, &help, None, self.kind)?;
        for (labels, v) in &self.samples {
            if labels.is_empty() {
                write_value(&mut m, *v)?;
            } else {
                write_value(&mut m.encode_family(labels)?, *v)?;
            }
        }
        Ok(())
    }
}

fn write_value(
    m: &mut prometheus_client::encoding::MetricEncoder<'_>,
    v: Value,
) -> Result<(), std::fmt::Error> {
    match v {
        Value::Count(n) => m.encode_counter::<NoLabelSet, u64, u64>(&n, None),
        Value::Level(x) => m.encode_gauge(&x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::alerts::Alert;
    use crate::decide::backlog::Drain;
    use crate::decide::scale::{Advice, BudgetInputs, ScaleInputs};
    use crate::domain::ids::ActivityId;
    use crate::domain::stats::{ConsumeView, GovernorView, Percentiles, PoolView, ResendView};
    use crate::mq::QueueBacklog;
    use crate::observe::{DlqSample, GroupSample, PendingSample, Sample};
    use std::collections::HashSet;

    /// A fixed input touching every family: distinct figures per field so a
    /// mis-wired sample shows, label values that need escaping, a pending
    /// entry from the future (its age clamps to 0), an unknown replay
    /// outcome (left out), and one alert per state.
    fn fixture_stats() -> StatsView {
        let p = |p50_ms, p95_ms, p99_ms| Percentiles {
            count: 9,
            p50_ms,
            p95_ms,
            p99_ms,
            p999_ms: 99.0,
            max_ms: 100.0,
        };
        StatsView {
            circuit: crate::domain::stats::CircuitView {
                state: "OPEN".to_owned(),
                open_for_s: Some(2.5),
                opened: 1,
                held: 15,
                probes: 3,
            },
            publish_confirmed: 1001,
            publish_unknown: 3,
            publish_definite_failure: 2,
            publish_batches: 40,
            publish_handed_to_scanner: 1,
            scanner_resent: 5,
            resend: ResendView {
                confirmed: 11,
                unknown: 12,
                definite_failure: 13,
                expired: 14,
            },
            send_latency: p(1.5, 7.25, 12.0),
            lifecycle: Default::default(),
            consume: ConsumeView {
                inflight: 7,
                acked: 990,
                retried: 4,
                created: 900,
                duplicates: 6,
                duplicate_reservation: 8,
                rejected_no_stock: 21,
                rejected_duplicate_user: 22,
                rejected_expired: 23,
                quarantined: 24,
                deadlocks: 25,
                serialization_failures: 26,
                process: p(0.25, 0.5, 0.75),
                process_sum_s: 1.125,
                process_count: 994,
                tx: p(3.0, 30.0, 300.5),
                tx_sum_s: 12.5,
                tx_count: 930,
                pool_wait: p(0.001, 0.02, 120.0),
                pool_wait_sum_s: 0.0625,
                pool_wait_count: 931,
            },
            pool: PoolView {
                size: 10,
                idle: 3,
                max: 16,
            },
            governor: GovernorView {
                admission_open: false,
                admission_reason: Some("lag".into()),
                admission_trips: 2,
                admission_recoveries: 1,
                admission_refused: 31,
                limit: 6,
                budget: 8,
            },
            positions: Vec::new(),
        }
    }

    /// The governor's advice is not rendered; any will do.
    fn calm_advice() -> Advice {
        crate::decide::scale::advise(&ScaleInputs {
            lag_seconds: 0.2,
            lag_growth_per_s: 0.0,
            drain: Drain::Empty,
            seconds_to_oldest_expiry: None,
            expiring: 0,
            near_horizon_s: 30.0,
            pool_wait_p95_ms: None,
            tx_p99_ms: None,
            io_wait_share: None,
            lock_waiters: None,
            longest_tx_s: None,
            broker_uptime_s: None,
            budget: BudgetInputs {
                safe_pg_concurrency: 240,
                order_share: 0.7,
                instances: 12,
                threads_per_instance: 8,
                pools_max: None,
                server_max_connections: None,
            },
        })
    }

    fn fixture_tick() -> Tick {
        let at_ms = 1_700_000_000_000;
        let group = |group: &str, topic: &str, lag_messages, lag_seconds| GroupSample {
            group: group.into(),
            topic: topic.into(),
            lag_messages,
            lag_seconds,
            retry_lag_messages: 0,
            retry_lag_seconds: 0.0,
            broker_offsets: 0,
            consumer_offsets: 0,
            oldest_valid_until_ms: None,
            expiring: 0,
            per_broker: Vec::new(),
            queues: Vec::new(),
        };
        let pending = |activity, count, oldest_created_ms| PendingSample {
            activity_id: ActivityId(activity),
            count,
            oldest_created_ms,
            next_due_ms: None,
            oldest_valid_until_ms: None,
            attempts: Default::default(),
            expiring: 0,
            truncated: false,
        };
        let alert = |metric, state| Alert {
            metric,
            value: None,
            shown: String::new(),
            state,
            thresholds: String::new(),
            runbook: "",
        };
        Tick {
            sample: Sample {
                at_ms,
                groups: vec![
                    group("sk_order_cg", "sk_ORDER_CREATE", 120, 1.25),
                    group("sk_cancel_cg", "sk_ORDER_CANCEL", 0, 0.0),
                    group("odd\"g\\\nx", "t", 3, 12345.678),
                ],
                pending: vec![
                    pending(1, 5, Some(at_ms - 1500)),
                    pending(2, 2, None),
                    pending(3, 1, Some(at_ms + 500)),
                ],
                pg: None,
                dlq: Some(DlqSample {
                    dead: 2,
                    open_tickets: 1,
                    oldest_dead_age_s: Some(42.5),
                    replays: [("VERIFIED", 3), ("SEND_FAILED", 1), ("BOGUS", 9)]
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect(),
                }),
                engine: None,
                engines: Vec::new(),
                broker_uptime_s: None,
                redis_lost: vec![],
                live_engines: None,
                errors: Vec::new(),
            },
            advice: calm_advice(),
            alerts: vec![
                alert("mq_dlq_messages", AlertState::NoData),
                alert("mq_consumer_lag_seconds", AlertState::Ok),
                alert("pg_pool_wait_seconds_p95", AlertState::Warn),
                alert("order_tx_latency_seconds_p99", AlertState::Critical),
            ],
        }
    }

    fn names() -> Names {
        Names::new("sk_")
    }

    fn scrape(tick: Option<Tick>) -> Scrape {
        let mut stats = fixture_stats();
        stats.lifecycle.cancel_duplicates = 41;
        stats.lifecycle.release_duplicates = 42;
        Scrape {
            names: names(),
            stats,
            tick: tick.map(Arc::new),
            redis_unreplicated: 5,
            ready: vec![Ready {
                group: "sk_order_cg".into(),
                topic: "sk_ORDER_CREATE".into(),
                messages: 113,
            }],
        }
    }

    fn render_scrape(tick: Option<Tick>) -> String {
        render(Parts {
            meters: &Meters::default(),
            order_tx: None,
            pool_wait: None,
            scrape: scrape(tick),
        })
    }

    /// The scrape-time lines for the fixture: each figure lands in its own
    /// family under its own labels, label values are escaped, the unknown
    /// replay outcome and the alert without data are left out.
    #[test]
    fn the_scrape_families_carry_the_fixture() {
        let t = render_scrape(Some(fixture_tick()));
        let n = names();
        let (order_t, order_g) = (
            n.topic(TopicKind::OrderCreate),
            n.group(TopicKind::OrderCreate),
        );
        let (cancel_t, cancel_g) = (
            n.topic(TopicKind::OrderTimeout),
            n.group(TopicKind::OrderTimeout),
        );
        let expected = [
            "# HELP reservation_mq_pending Reservations waiting for a confirmed send.".to_owned(),
            "# TYPE reservation_mq_pending gauge".into(),
            "reservation_mq_pending 8.0".into(),
            "reservation_mq_pending_oldest_age_seconds 1.5".into(),
            "# TYPE reservation_resend counter".into(),
            "reservation_resend_total{outcome=\"CONFIRMED\"} 11".into(),
            "reservation_resend_total{outcome=\"EXPIRED\"} 14".into(),
            "mq_send_circuit_open 1.0".into(),
            "mq_send_circuit_held_total 15".into(),
            "mq_consumer_ready{group=\"sk_order_cg\",topic=\"sk_ORDER_CREATE\"} 113.0".into(),
            "mq_consumer_lag_messages{group=\"sk_order_cg\",topic=\"sk_ORDER_CREATE\"} 120.0"
                .into(),
            "mq_consumer_lag_seconds{group=\"odd\\\"g\\\\\\nx\",topic=\"t\"} 12345.678".into(),
            format!("mq_duplicate_message_total{{topic=\"{order_t}\",group=\"{order_g}\"}} 14"),
            format!("mq_duplicate_message_total{{topic=\"{cancel_t}\",group=\"{cancel_g}\"}} 41"),
            format!(
                "mq_business_reject_total{{topic=\"{order_t}\",group=\"{order_g}\",reason=\"NO_STOCK\"}} 21"
            ),
            format!(
                "mq_business_reject_total{{topic=\"{order_t}\",group=\"{order_g}\",reason=\"QUARANTINED\"}} 24"
            ),
            "mq_dlq_messages 2.0".into(),
            "mq_dlq_oldest_age_seconds 42.5".into(),
            "mq_dlq_replay_total{result=\"PENDING\"} 0".into(),
            "mq_dlq_replay_total{result=\"VERIFIED\"} 3".into(),
            "mq_dlq_replay_total{result=\"SEND_FAILED\"} 1".into(),
            "pg_pool_acquired 7.0".into(),
            "pg_deadlock_total 25".into(),
            "pg_serialization_retry_total 26".into(),
            "inventory_condition_update_miss_total 21".into(),
            "seckill_admission_open 0.0".into(),
            "seckill_admission_trips_total 2".into(),
            "seckill_admission_refused_total 31".into(),
            "seckill_redis_unreplicated_writes_total 5".into(),
            "seckill_consumer_concurrency_limit 6.0".into(),
            "seckill_alert_state{alert=\"mq_consumer_lag_seconds\"} 0.0".into(),
            "seckill_alert_state{alert=\"pg_pool_wait_seconds_p95\"} 1.0".into(),
            "seckill_alert_state{alert=\"order_tx_latency_seconds_p99\"} 2.0".into(),
        ];
        let lines: HashSet<&str> = t.lines().collect();
        for e in &expected {
            assert!(lines.contains(e.as_str()), "no line {e:?} in:\n{t}");
        }
        assert!(!t.contains("BOGUS"), "{t}");
        assert!(!t.contains("alert=\"mq_dlq_messages\""), "{t}");
        assert!(t.ends_with("# EOF\n"), "{t}");
    }

    /// Without a tick the tick-fed families are declared with no samples.
    #[test]
    fn without_a_tick_only_the_tick_fed_samples_go() {
        const TICK_FED: [&str; 8] = [
            "reservation_mq_pending",
            "reservation_mq_pending_oldest_age_seconds",
            "mq_consumer_lag_messages",
            "mq_consumer_lag_seconds",
            "mq_dlq_messages",
            "mq_dlq_oldest_age_seconds",
            "mq_dlq_replay_total",
            "seckill_alert_state",
        ];
        let t = render_scrape(None);
        for name in TICK_FED {
            let family = name.strip_suffix("_total").unwrap_or(name);
            assert!(
                t.contains(&format!("# TYPE {family} ")),
                "{family} undeclared"
            );
            assert!(
                !t.lines()
                    .any(|l| l.starts_with(&format!("{name}{{"))
                        || l.starts_with(&format!("{name} "))),
                "{name} sampled without a tick:\n{t}"
            );
        }
        assert!(t.contains("\nseckill_admission_open 0.0\n"), "{t}");
    }

    /// Every seed name is declared once a consumer runs and a topic had a
    /// send (the traffic families have no series before).
    #[test]
    fn every_seed_name_is_declared_from_the_first_send() {
        let h = crate::domain::meters::histogram(&crate::domain::meters::TX_BUCKETS);
        let meters = Meters::default();
        meters.declare_consumer("g", "T");
        meters.sent("T", "CONFIRMED", 1, std::time::Duration::from_millis(1));
        meters.handed("g", "T", 1);
        meters.answered(
            "g",
            "T",
            1,
            crate::domain::meters::Answer::Ack,
            std::time::Duration::ZERO,
        );
        let t = render(Parts {
            meters: &meters,
            order_tx: Some(&h),
            pool_wait: Some(&h),
            scrape: scrape(None),
        });
        for name in METRIC_NAMES {
            let family = name.strip_suffix("_total").unwrap_or(name);
            assert!(
                t.contains(&format!("# TYPE {family} ")),
                "{family} missing:\n{t}"
            );
        }
    }

    #[test]
    fn the_order_transaction_is_a_histogram_with_the_slo_bounds() {
        let tx = crate::domain::meters::histogram(&crate::domain::meters::TX_BUCKETS);
        for s in [0.002, 0.2, 0.9, 2.0] {
            tx.observe(s);
        }
        let t = render(Parts {
            meters: &Meters::default(),
            order_tx: Some(&tx),
            pool_wait: None,
            scrape: scrape(None),
        });
        // The §11.2 thresholds, 300 ms and 1 s, are bucket bounds.
        assert!(
            t.contains("\norder_tx_latency_seconds_bucket{le=\"0.3\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("\norder_tx_latency_seconds_bucket{le=\"1.0\"} 3\n"),
            "{t}"
        );
        assert!(t.contains("\norder_tx_latency_seconds_count 4\n"), "{t}");
    }

    fn backlog(topic: &str, broker: &str, queue_id: i32, messages: i64) -> QueueBacklog {
        QueueBacklog {
            topic: topic.into(),
            broker: broker.into(),
            queue_id,
            messages,
        }
    }

    fn group_with(queues: Vec<QueueBacklog>) -> GroupSample {
        GroupSample {
            group: "g".into(),
            topic: "T".into(),
            lag_messages: queues.iter().map(|q| q.messages).sum(),
            lag_seconds: 0.0,
            retry_lag_messages: 0,
            retry_lag_seconds: 0.0,
            broker_offsets: 0,
            consumer_offsets: 0,
            oldest_valid_until_ms: None,
            expiring: 0,
            per_broker: Vec::new(),
            queues,
        }
    }

    fn given(pairs: &[(&str, i32)]) -> Queues {
        pairs.iter().map(|(b, q)| ((*b).to_owned(), *q)).collect()
    }

    #[test]
    fn ready_counts_only_the_queues_this_process_was_given() {
        let g = group_with(vec![
            backlog("T", "b1", 0, 10),
            backlog("T", "b1", 1, 20),
            backlog("T", "b2", 0, 40),
            backlog("%RETRY%g", "b1", 0, 5),
        ]);
        let assigned = |topic: &str| match topic {
            "T" => Some(given(&[("b1", 1), ("b2", 0)])),
            "%RETRY%g" => Some(given(&[("b1", 0)])),
            _ => None,
        };
        let r = ready(&g, assigned, 7).expect("assigned");
        assert_eq!(r.messages, 20 + 40 + 5 - 7);
        assert_eq!((r.group.as_str(), r.topic.as_str()), ("g", "T"));
    }

    #[test]
    fn ready_is_unknown_until_the_client_says_and_never_negative() {
        let g = group_with(vec![backlog("T", "b1", 0, 3)]);
        assert_eq!(ready(&g, |_| None, 0), None, "no rebalance heard yet");
        assert_eq!(
            ready(&group_with(vec![]), |_| Some(given(&[])), 0),
            None,
            "no tick yet"
        );
        let r = ready(&g, |_| Some(given(&[("b1", 0)])), 9).expect("assigned");
        assert_eq!(r.messages, 0, "9 in hand, 3 behind");
        let r = ready(&g, |_| Some(given(&[])), 0).expect("told: nothing given");
        assert_eq!(r.messages, 0);
    }
}
