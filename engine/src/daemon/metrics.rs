//! `/metrics` in Prometheus text format (exposition 0.0.4) with docs/architecture.md
//! §11.1 names (docs/architecture.md §11). Counters and summaries come from the
//! engine's in-process stats; gauges (lag, pending, DLQ) from the
//! governor's latest tick, and are left out until the first tick rather
//! than reported as a made-up zero.
//!
//! The text is built as a list of metric [`Family`]s, one function per
//! group of the §11.1 table (producer, consumer, DLQ, PostgreSQL, engine),
//! then written by one small encoder.

use crate::daemon::governor::Tick;
use crate::decide::alerts::AlertState;
use crate::domain::stats::StatsView;
use crate::domain::stats::{Latencies, Percentiles};
use crate::observe::{GroupSample, Sample as TickSample};
use std::fmt::Write;

pub struct MetricsInput<'a> {
    /// The order-create topic, the `topic` label.
    pub topic: String,
    pub stats: &'a StatsView,
    pub publish_latency: &'a Latencies,
    pub tick: Option<&'a Tick>,
    /// Reservations and releases answered before a Redis replica held
    /// them (docs/architecture.md §4.6).
    pub redis_unreplicated: u64,
}

/// Every docs/architecture.md §11.1 metric name, in its order.
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

/// The whole `/metrics` body: every family of §11.1, in the table's order.
pub fn render(m: &MetricsInput) -> String {
    let families = [producer(m), consumer(m), dlq(m), postgres(m), engine(m)];
    let mut out = String::with_capacity(8 * 1024);
    for family in families.iter().flatten() {
        family.write(&mut out);
    }
    out
}

// ---------------------------------------------------------------------------
// The families, one function per group of the §11.1 table.
// ---------------------------------------------------------------------------

/// Sends by outcome and their latency; reservations still waiting for a
/// confirmed send (§6).
fn producer<'m>(m: &'m MetricsInput) -> Vec<Family<'m>> {
    let (s, topic) = (m.stats, m.topic.as_str());
    let sample = m.tick.map(|k| &k.sample);
    vec![
        Family::counter("mq_publish_total", "Order-create sends by outcome.")
            .count(
                &[("topic", topic), ("outcome", "CONFIRMED")],
                s.publish_confirmed,
            )
            .count(
                &[("topic", topic), ("outcome", "UNKNOWN")],
                s.publish_unknown,
            )
            .count(
                &[("topic", topic), ("outcome", "DEFINITE_FAILURE")],
                s.publish_definite_failure,
            ),
        Family::summary(
            "mq_publish_latency_seconds",
            "Bounded send latency (per batch request).",
            &[("topic", topic)],
            &s.send_latency,
            m.publish_latency.total_seconds(),
            m.publish_latency.total_count(),
        ),
        Family::counter(
            "mq_publish_unknown_total",
            "Sends whose outcome is unknown: stay pending, never compensated.",
        )
        .count(&[("topic", topic)], s.publish_unknown),
        Family::gauge(
            "reservation_mq_pending",
            "Reservations waiting for a confirmed send.",
        )
        .value_if_read(&[], sample.map(pending_total)),
        Family::gauge(
            "reservation_mq_pending_oldest_age_seconds",
            "Age of the oldest pending reservation.",
        )
        .value_if_read(&[], sample.map(oldest_pending_age_s)),
        Family::counter("reservation_resend_total", "Scanner re-sends by outcome.")
            .count(&[("outcome", "CONFIRMED")], s.resend.confirmed)
            .count(&[("outcome", "UNKNOWN")], s.resend.unknown)
            .count(
                &[("outcome", "DEFINITE_FAILURE")],
                s.resend.definite_failure,
            )
            .count(&[("outcome", "EXPIRED")], s.resend.expired),
        Family::gauge(
            "mq_send_circuit_open",
            "1 while the send circuit holds sends back: the broker does not answer (§6.7).",
        )
        .value_if_read(&[], Some(f64::from(u8::from(s.circuit.state != "CLOSED")))),
        Family::counter(
            "mq_send_circuit_held_total",
            "Messages the open circuit kept from sending; they stayed pending in Redis.",
        )
        .count(&[], s.circuit.held),
    ]
}

/// The order-create consumer: verdicts, processing time, what waits on the
/// broker per group, redeliveries, duplicates and business rejections (§7).
fn consumer<'m>(m: &'m MetricsInput) -> Vec<Family<'m>> {
    let (c, topic) = (&m.stats.consume, m.topic.as_str());
    let groups = m.tick.map(|k| k.sample.groups.as_slice()).unwrap_or(&[]);
    let per_group = |f: fn(&GroupSample) -> f64| {
        groups.iter().map(move |g| {
            Sample::new(
                vec![("group", g.group.as_str()), ("topic", g.topic.as_str())],
                f(g),
            )
        })
    };
    vec![
        Family::counter(
            "mq_consume_total",
            "Order-create messages by broker verdict.",
        )
        .count(&[("topic", topic), ("result", "ACK")], c.acked)
        .count(&[("topic", topic), ("result", "RETRY")], c.retried),
        Family::summary(
            "mq_consume_process_seconds",
            "One listener batch, parse to verdict.",
            &[("topic", topic)],
            &c.process,
            c.process_sum_s,
            c.process_count,
        ),
        Family::gauge(
            "mq_consumer_inflight",
            "Messages in the handler, not yet answered.",
        )
        .value(&[], c.inflight as f64),
        Family::gauge(
            "mq_consumer_ready",
            "Order-create messages waiting on the broker, not yet handed out.",
        )
        .value_if_read(&[], consumer_ready(groups, topic, c.inflight)),
        Family::gauge(
            "mq_consumer_lag_messages",
            "Unconsumed messages, %RETRY% included.",
        )
        .samples(per_group(|g| g.lag_messages as f64)),
        Family::gauge(
            "mq_consumer_lag_seconds",
            "Age of the oldest unconsumed message, %RETRY% included.",
        )
        .samples(per_group(|g| g.lag_seconds)),
        Family::counter("mq_ack_failure_total", "Messages sent back for redelivery.")
            .count(&[], c.retried),
        Family::counter(
            "mq_duplicate_message_total",
            "Deliveries whose effect had already happened (inbox or reservation).",
        )
        .count(&[], c.duplicates + c.duplicate_reservation),
        Family::counter(
            "mq_business_reject_total",
            "Reservations turned down by the order transaction.",
        )
        .count(&[("reason", "NO_STOCK")], c.rejected_no_stock)
        .count(&[("reason", "DUPLICATE_USER")], c.rejected_duplicate_user)
        .count(&[("reason", "EXPIRED")], c.rejected_expired)
        .count(&[("reason", "QUARANTINED")], c.quarantined),
    ]
}

/// Dead messages and operator replays (§9), all from the governor's tick.
fn dlq<'m>(m: &'m MetricsInput) -> Vec<Family<'m>> {
    let dlq = m.tick.and_then(|k| k.sample.dlq.as_ref());
    // Every outcome of `replay_outcome`, zero included, once the DLQ is read.
    let replays = dlq.into_iter().flat_map(|d| {
        REPLAY_OUTCOMES.iter().map(|k| {
            let n = d.replays.get(*k).copied().unwrap_or(0);
            Sample::new(vec![("result", *k)], n as f64)
        })
    });
    vec![
        Family::gauge(
            "mq_dlq_messages",
            "Dead messages not yet replayed or discarded.",
        )
        .value_if_read(&[], dlq.map(|d| d.dead as f64)),
        Family::gauge(
            "mq_dlq_oldest_age_seconds",
            "Age of the oldest dead message.",
        )
        .value_if_read(&[], dlq.map(|d| d.oldest_dead_age_s.unwrap_or(0.0))),
        Family::counter(
            "mq_dlq_replay_total",
            "Operator replays by outcome (replay_audit).",
        )
        .samples(replays),
    ]
}

/// The order transaction and the pool it waits on (§7, §10.11).
fn postgres<'m>(m: &'m MetricsInput) -> Vec<Family<'m>> {
    let (c, pool) = (&m.stats.consume, &m.stats.pool);
    vec![
        Family::summary(
            "order_tx_latency_seconds",
            "One order transaction, BEGIN to COMMIT.",
            &[],
            &c.tx,
            c.tx_sum_s,
            c.tx_count,
        ),
        Family::summary(
            "pg_pool_wait_seconds",
            "Waiting for a pooled connection (with BEGIN).",
            &[],
            &c.pool_wait,
            c.pool_wait_sum_s,
            c.pool_wait_count,
        ),
        Family::gauge("pg_pool_acquired", "Pool connections in use.")
            .value(&[], pool.size.saturating_sub(pool.idle) as f64),
        Family::counter(
            "pg_deadlock_total",
            "Order transactions that hit a deadlock.",
        )
        .count(&[], c.deadlocks),
        Family::counter(
            "pg_serialization_retry_total",
            "Order transactions retried on a serialization failure.",
        )
        .count(&[], c.serialization_failures),
        Family::counter(
            "inventory_condition_update_miss_total",
            "Conditional stock decrements that found no stock.",
        )
        .count(&[], c.rejected_no_stock),
    ]
}

/// The governor (docs/architecture.md §10) and the alerts of §11.2.
fn engine<'m>(m: &'m MetricsInput) -> Vec<Family<'m>> {
    let g = &m.stats.governor;
    let alerts = m.tick.into_iter().flat_map(|k| {
        k.alerts
            .iter()
            .filter_map(|a| alert_level(a.state).map(|v| Sample::new(vec![("alert", a.metric)], v)))
    });
    vec![
        Family::gauge(
            "seckill_admission_open",
            "1 while new reservations are admitted.",
        )
        .value(&[], if g.admission_open { 1.0 } else { 0.0 }),
        Family::counter(
            "seckill_admission_trips_total",
            "Times admission control closed.",
        )
        .count(&[], g.admission_trips),
        Family::counter(
            "seckill_admission_refused_total",
            "Reservations refused while closed.",
        )
        .count(&[], g.admission_refused),
        Family::counter(
            "seckill_redis_unreplicated_writes_total",
            "Reservations and releases answered before a Redis replica acknowledged them (§4.6): a failover now could lose them.",
        )
        .count(&[], m.redis_unreplicated),
        Family::gauge(
            "seckill_consumer_concurrency_limit",
            "Order transactions allowed at once (never above the budget).",
        )
        .value(&[], g.limit as f64),
        Family::gauge(
            "seckill_alert_state",
            "Alerts of docs/architecture.md §11.2: 0 ok, 1 warning, 2 critical.",
        )
        .samples(alerts),
    ]
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

/// Order-create messages on the broker not yet handed to the handler: the
/// order group's lag minus what is in flight. None until a tick has read
/// that group.
fn consumer_ready(groups: &[GroupSample], topic: &str, inflight: i64) -> Option<f64> {
    groups
        .iter()
        .find(|g| g.topic == topic)
        .map(|g| (g.lag_messages - inflight).max(0) as f64)
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
// The encoder. Hand-written rather than the `prometheus-client` crate (0.26):
// that crate has no summary type, appends `_total` to counter names (ours
// already end in it) and a `.` to every HELP, and prints `1` as `1.0`, so it
// would change the names, HELP lines and values that dashboards and
// `tests/tests/observe.rs` read.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Summary,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Summary => "summary",
        }
    }
}

/// Label pairs in output order; values borrow from the input.
type Labels<'a> = Vec<(&'static str, &'a str)>;

/// One sample line: `{name}{suffix}{labels} {value}`.
struct Sample<'a> {
    /// `_sum` and `_count` of a summary; empty otherwise.
    suffix: &'static str,
    labels: Labels<'a>,
    value: f64,
}

impl<'a> Sample<'a> {
    fn new(labels: Labels<'a>, value: f64) -> Self {
        Self {
            suffix: "",
            labels,
            value,
        }
    }
}

/// One metric family: its `# HELP` and `# TYPE` lines, then its samples
/// (none at all is allowed: the family is still declared).
struct Family<'a> {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    samples: Vec<Sample<'a>>,
}

impl<'a> Family<'a> {
    fn new(name: &'static str, kind: Kind, help: &'static str) -> Self {
        Self {
            name,
            kind,
            help,
            samples: Vec::new(),
        }
    }

    fn counter(name: &'static str, help: &'static str) -> Self {
        Self::new(name, Kind::Counter, help)
    }

    fn gauge(name: &'static str, help: &'static str) -> Self {
        Self::new(name, Kind::Gauge, help)
    }

    /// p50, p95 and p99 as `quantile` samples (milliseconds to seconds),
    /// then `_sum` and `_count`.
    fn summary(
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, &'a str)],
        p: &Percentiles,
        sum_s: f64,
        count: u64,
    ) -> Self {
        let quantiles = [("0.5", p.p50_ms), ("0.95", p.p95_ms), ("0.99", p.p99_ms)];
        let mut f = Self::new(name, Kind::Summary, help);
        for (q, ms) in quantiles {
            let mut l = labels.to_vec();
            l.push(("quantile", q));
            f.samples.push(Sample::new(l, ms / 1000.0));
        }
        f.samples.push(Sample {
            suffix: "_sum",
            labels: labels.to_vec(),
            value: sum_s,
        });
        f.samples.push(Sample {
            suffix: "_count",
            labels: labels.to_vec(),
            value: count as f64,
        });
        f
    }

    fn value(mut self, labels: &[(&'static str, &'a str)], v: f64) -> Self {
        self.samples.push(Sample::new(labels.to_vec(), v));
        self
    }

    /// A counter's sample; the text format carries every value as a float.
    fn count(self, labels: &[(&'static str, &'a str)], n: u64) -> Self {
        self.value(labels, n as f64)
    }

    /// A tick-fed sample: none until the source has been read.
    fn value_if_read(self, labels: &[(&'static str, &'a str)], v: Option<f64>) -> Self {
        match v {
            Some(v) => self.value(labels, v),
            None => self,
        }
    }

    fn samples(mut self, samples: impl IntoIterator<Item = Sample<'a>>) -> Self {
        self.samples.extend(samples);
        self
    }

    fn write(&self, out: &mut String) {
        let name = self.name;
        let _ = writeln!(out, "# HELP {name} {}", self.help);
        let _ = writeln!(out, "# TYPE {name} {}", self.kind.as_str());
        for s in &self.samples {
            let _ = writeln!(
                out,
                "{name}{}{} {}",
                s.suffix,
                label_set(&s.labels),
                s.value
            );
        }
    }
}

/// `{k="v",...}`, or nothing without labels.
fn label_set(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
        .collect();
    format!("{{{}}}", pairs.join(","))
}

/// A label value, escaped as the text format requires.
fn esc(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::alerts::Alert;
    use crate::decide::backlog::Drain;
    use crate::decide::scale::{Advice, BudgetInputs, ScaleInputs};
    use crate::domain::ids::ActivityId;
    use crate::domain::stats::{ConsumeView, GovernorView, PoolView, ResendView};
    use crate::observe::{DlqSample, GroupSample, PendingSample, Sample};

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

    fn render_fixture(tick: Option<&Tick>) -> String {
        let lat = Latencies::new(4);
        for ms in [2, 3] {
            lat.record(std::time::Duration::from_millis(ms));
        }
        render(&MetricsInput {
            redis_unreplicated: 5,
            topic: "sk_ORDER_CREATE".into(),
            stats: &fixture_stats(),
            publish_latency: &lat,
            tick,
        })
    }

    /// The whole text for the fixture, byte for byte: taken from the
    /// renderer as it stood before it was split into families, so any
    /// change to a name, HELP line, label order or number format shows here.
    const GOLDEN: &str = r#"# HELP mq_publish_total Order-create sends by outcome.
# TYPE mq_publish_total counter
mq_publish_total{topic="sk_ORDER_CREATE",outcome="CONFIRMED"} 1001
mq_publish_total{topic="sk_ORDER_CREATE",outcome="UNKNOWN"} 3
mq_publish_total{topic="sk_ORDER_CREATE",outcome="DEFINITE_FAILURE"} 2
# HELP mq_publish_latency_seconds Bounded send latency (per batch request).
# TYPE mq_publish_latency_seconds summary
mq_publish_latency_seconds{topic="sk_ORDER_CREATE",quantile="0.5"} 0.0015
mq_publish_latency_seconds{topic="sk_ORDER_CREATE",quantile="0.95"} 0.00725
mq_publish_latency_seconds{topic="sk_ORDER_CREATE",quantile="0.99"} 0.012
mq_publish_latency_seconds_sum{topic="sk_ORDER_CREATE"} 0.005
mq_publish_latency_seconds_count{topic="sk_ORDER_CREATE"} 2
# HELP mq_publish_unknown_total Sends whose outcome is unknown: stay pending, never compensated.
# TYPE mq_publish_unknown_total counter
mq_publish_unknown_total{topic="sk_ORDER_CREATE"} 3
# HELP reservation_mq_pending Reservations waiting for a confirmed send.
# TYPE reservation_mq_pending gauge
reservation_mq_pending 8
# HELP reservation_mq_pending_oldest_age_seconds Age of the oldest pending reservation.
# TYPE reservation_mq_pending_oldest_age_seconds gauge
reservation_mq_pending_oldest_age_seconds 1.5
# HELP reservation_resend_total Scanner re-sends by outcome.
# TYPE reservation_resend_total counter
reservation_resend_total{outcome="CONFIRMED"} 11
reservation_resend_total{outcome="UNKNOWN"} 12
reservation_resend_total{outcome="DEFINITE_FAILURE"} 13
reservation_resend_total{outcome="EXPIRED"} 14
# HELP mq_send_circuit_open 1 while the send circuit holds sends back: the broker does not answer (§6.7).
# TYPE mq_send_circuit_open gauge
mq_send_circuit_open 1
# HELP mq_send_circuit_held_total Messages the open circuit kept from sending; they stayed pending in Redis.
# TYPE mq_send_circuit_held_total counter
mq_send_circuit_held_total 15
# HELP mq_consume_total Order-create messages by broker verdict.
# TYPE mq_consume_total counter
mq_consume_total{topic="sk_ORDER_CREATE",result="ACK"} 990
mq_consume_total{topic="sk_ORDER_CREATE",result="RETRY"} 4
# HELP mq_consume_process_seconds One listener batch, parse to verdict.
# TYPE mq_consume_process_seconds summary
mq_consume_process_seconds{topic="sk_ORDER_CREATE",quantile="0.5"} 0.00025
mq_consume_process_seconds{topic="sk_ORDER_CREATE",quantile="0.95"} 0.0005
mq_consume_process_seconds{topic="sk_ORDER_CREATE",quantile="0.99"} 0.00075
mq_consume_process_seconds_sum{topic="sk_ORDER_CREATE"} 1.125
mq_consume_process_seconds_count{topic="sk_ORDER_CREATE"} 994
# HELP mq_consumer_inflight Messages in the handler, not yet answered.
# TYPE mq_consumer_inflight gauge
mq_consumer_inflight 7
# HELP mq_consumer_ready Order-create messages waiting on the broker, not yet handed out.
# TYPE mq_consumer_ready gauge
mq_consumer_ready 113
# HELP mq_consumer_lag_messages Unconsumed messages, %RETRY% included.
# TYPE mq_consumer_lag_messages gauge
mq_consumer_lag_messages{group="sk_order_cg",topic="sk_ORDER_CREATE"} 120
mq_consumer_lag_messages{group="sk_cancel_cg",topic="sk_ORDER_CANCEL"} 0
mq_consumer_lag_messages{group="odd\"g\\\nx",topic="t"} 3
# HELP mq_consumer_lag_seconds Age of the oldest unconsumed message, %RETRY% included.
# TYPE mq_consumer_lag_seconds gauge
mq_consumer_lag_seconds{group="sk_order_cg",topic="sk_ORDER_CREATE"} 1.25
mq_consumer_lag_seconds{group="sk_cancel_cg",topic="sk_ORDER_CANCEL"} 0
mq_consumer_lag_seconds{group="odd\"g\\\nx",topic="t"} 12345.678
# HELP mq_ack_failure_total Messages sent back for redelivery.
# TYPE mq_ack_failure_total counter
mq_ack_failure_total 4
# HELP mq_duplicate_message_total Deliveries whose effect had already happened (inbox or reservation).
# TYPE mq_duplicate_message_total counter
mq_duplicate_message_total 14
# HELP mq_business_reject_total Reservations turned down by the order transaction.
# TYPE mq_business_reject_total counter
mq_business_reject_total{reason="NO_STOCK"} 21
mq_business_reject_total{reason="DUPLICATE_USER"} 22
mq_business_reject_total{reason="EXPIRED"} 23
mq_business_reject_total{reason="QUARANTINED"} 24
# HELP mq_dlq_messages Dead messages not yet replayed or discarded.
# TYPE mq_dlq_messages gauge
mq_dlq_messages 2
# HELP mq_dlq_oldest_age_seconds Age of the oldest dead message.
# TYPE mq_dlq_oldest_age_seconds gauge
mq_dlq_oldest_age_seconds 42.5
# HELP mq_dlq_replay_total Operator replays by outcome (replay_audit).
# TYPE mq_dlq_replay_total counter
mq_dlq_replay_total{result="PENDING"} 0
mq_dlq_replay_total{result="VERIFIED"} 3
mq_dlq_replay_total{result="SEND_FAILED"} 1
mq_dlq_replay_total{result="SEND_UNKNOWN"} 0
mq_dlq_replay_total{result="VERIFY_FAILED"} 0
mq_dlq_replay_total{result="NOT_SENT"} 0
# HELP order_tx_latency_seconds One order transaction, BEGIN to COMMIT.
# TYPE order_tx_latency_seconds summary
order_tx_latency_seconds{quantile="0.5"} 0.003
order_tx_latency_seconds{quantile="0.95"} 0.03
order_tx_latency_seconds{quantile="0.99"} 0.3005
order_tx_latency_seconds_sum 12.5
order_tx_latency_seconds_count 930
# HELP pg_pool_wait_seconds Waiting for a pooled connection (with BEGIN).
# TYPE pg_pool_wait_seconds summary
pg_pool_wait_seconds{quantile="0.5"} 0.000001
pg_pool_wait_seconds{quantile="0.95"} 0.00002
pg_pool_wait_seconds{quantile="0.99"} 0.12
pg_pool_wait_seconds_sum 0.0625
pg_pool_wait_seconds_count 931
# HELP pg_pool_acquired Pool connections in use.
# TYPE pg_pool_acquired gauge
pg_pool_acquired 7
# HELP pg_deadlock_total Order transactions that hit a deadlock.
# TYPE pg_deadlock_total counter
pg_deadlock_total 25
# HELP pg_serialization_retry_total Order transactions retried on a serialization failure.
# TYPE pg_serialization_retry_total counter
pg_serialization_retry_total 26
# HELP inventory_condition_update_miss_total Conditional stock decrements that found no stock.
# TYPE inventory_condition_update_miss_total counter
inventory_condition_update_miss_total 21
# HELP seckill_admission_open 1 while new reservations are admitted.
# TYPE seckill_admission_open gauge
seckill_admission_open 0
# HELP seckill_admission_trips_total Times admission control closed.
# TYPE seckill_admission_trips_total counter
seckill_admission_trips_total 2
# HELP seckill_admission_refused_total Reservations refused while closed.
# TYPE seckill_admission_refused_total counter
seckill_admission_refused_total 31
# HELP seckill_redis_unreplicated_writes_total Reservations and releases answered before a Redis replica acknowledged them (§4.6): a failover now could lose them.
# TYPE seckill_redis_unreplicated_writes_total counter
seckill_redis_unreplicated_writes_total 5
# HELP seckill_consumer_concurrency_limit Order transactions allowed at once (never above the budget).
# TYPE seckill_consumer_concurrency_limit gauge
seckill_consumer_concurrency_limit 6
# HELP seckill_alert_state Alerts of docs/architecture.md §11.2: 0 ok, 1 warning, 2 critical.
# TYPE seckill_alert_state gauge
seckill_alert_state{alert="mq_consumer_lag_seconds"} 0
seckill_alert_state{alert="pg_pool_wait_seconds_p95"} 1
seckill_alert_state{alert="order_tx_latency_seconds_p99"} 2
"#;

    #[test]
    fn the_rendered_text_is_pinned() {
        assert_eq!(render_fixture(Some(&fixture_tick())), GOLDEN);
    }

    /// Before the first tick the text is the golden one without the samples
    /// of the tick-fed families; their HELP and TYPE stay (docs/architecture.md §11.1).
    #[test]
    fn before_the_first_tick_only_the_tick_fed_samples_go() {
        const TICK_FED: [&str; 9] = [
            "reservation_mq_pending",
            "reservation_mq_pending_oldest_age_seconds",
            "mq_consumer_ready",
            "mq_consumer_lag_messages",
            "mq_consumer_lag_seconds",
            "mq_dlq_messages",
            "mq_dlq_oldest_age_seconds",
            "mq_dlq_replay_total",
            "seckill_alert_state",
        ];
        let sample_of = |line: &str| line.split(['{', ' ']).next().unwrap_or("").to_owned();
        let expected: String = GOLDEN
            .lines()
            .filter(|l| l.starts_with('#') || !TICK_FED.contains(&sample_of(l).as_str()))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(render_fixture(None), expected);
    }

    #[test]
    fn ready_never_goes_below_zero() {
        let mut tick = fixture_tick();
        tick.sample.groups[0].lag_messages = 2;
        assert!(
            render_fixture(Some(&tick)).contains("\nmq_consumer_ready 0\n"),
            "7 in flight, 2 lagging: none ready"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn every_seed_name_has_help_and_type_even_before_the_first_tick() {
        let stats = StatsView {
            circuit: crate::domain::stats::CircuitView::default(),
            publish_confirmed: 3,
            publish_unknown: 1,
            publish_definite_failure: 0,
            publish_batches: 1,
            publish_handed_to_scanner: 0,
            scanner_resent: 0,
            resend: Default::default(),
            send_latency: Percentiles::default(),
            lifecycle: Default::default(),
            consume: Default::default(),
            pool: Default::default(),
            governor: Default::default(),
            positions: Vec::new(),
        };
        let lat = Latencies::new(4);
        let text = render(&MetricsInput {
            redis_unreplicated: 0,
            topic: "T".into(),
            stats: &stats,
            publish_latency: &lat,
            tick: None,
        });
        for name in METRIC_NAMES {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
        }
        assert!(text.contains("mq_publish_total{topic=\"T\",outcome=\"UNKNOWN\"} 1"));
        assert!(
            !text.contains("\nmq_consumer_lag_seconds{"),
            "no tick, no lag sample"
        );
    }
}
