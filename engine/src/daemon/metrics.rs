//! `/metrics` in Prometheus text format (exposition 0.0.4) with docs/architecture.md
//! §11.1 names (docs/architecture.md §11). Counters and summaries come from the
//! engine's in-process stats; gauges (lag, pending, DLQ) from the
//! governor's latest tick, and are left out until the first tick rather
//! than reported as a made-up zero.

use crate::daemon::governor::Tick;
use crate::decide::alerts::AlertState;
use crate::domain::stats::StatsView;
use crate::domain::stats::{Latencies, Percentiles};
use std::fmt::Write;

pub struct MetricsInput<'a> {
    /// The order-create topic, the `topic` label.
    pub topic: String,
    pub stats: &'a StatsView,
    pub publish_latency: &'a Latencies,
    pub tick: Option<&'a Tick>,
}

/// Every docs/architecture.md §11.1 metric name, in its order.
pub const METRIC_NAMES: [&str; 24] = [
    "mq_publish_total",
    "mq_publish_latency_seconds",
    "mq_publish_unknown_total",
    "reservation_mq_pending",
    "reservation_mq_pending_oldest_age_seconds",
    "reservation_resend_total",
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

/// A label value, escaped as the text format requires.
fn esc(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

struct Out(String);

impl Out {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn line(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        let _ = if labels.is_empty() {
            writeln!(self.0, "{name} {v}")
        } else {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", esc(v)))
                .collect();
            writeln!(self.0, "{name}{{{}}} {v}", l.join(","))
        };
    }

    fn counter(&mut self, name: &str, help: &str, rows: &[(&[(&str, &str)], u64)]) {
        self.head(name, "counter", help);
        for (labels, v) in rows {
            self.line(name, labels, *v as f64);
        }
    }

    fn gauge(&mut self, name: &str, help: &str, rows: &[(&[(&str, &str)], f64)]) {
        self.head(name, "gauge", help);
        for (labels, v) in rows {
            self.line(name, labels, *v);
        }
    }

    fn summary(
        &mut self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        p: &Percentiles,
        sum_s: f64,
        count: u64,
    ) {
        self.head(name, "summary", help);
        for (q, ms) in [("0.5", p.p50_ms), ("0.95", p.p95_ms), ("0.99", p.p99_ms)] {
            let mut l = labels.to_vec();
            l.push(("quantile", q));
            self.line(name, &l, ms / 1000.0);
        }
        self.line(&format!("{name}_sum"), labels, sum_s);
        self.line(&format!("{name}_count"), labels, count as f64);
    }
}

pub fn render(m: &MetricsInput) -> String {
    let s = m.stats;
    let c = &s.consume;
    let t: &[(&str, &str)] = &[("topic", &m.topic)];
    let mut o = Out(String::with_capacity(8 * 1024));

    // Producer.
    o.counter(
        "mq_publish_total",
        "Order-create sends by outcome.",
        &[
            (
                &[("topic", &m.topic), ("outcome", "CONFIRMED")],
                s.publish_confirmed,
            ),
            (
                &[("topic", &m.topic), ("outcome", "UNKNOWN")],
                s.publish_unknown,
            ),
            (
                &[("topic", &m.topic), ("outcome", "DEFINITE_FAILURE")],
                s.publish_definite_failure,
            ),
        ],
    );
    o.summary(
        "mq_publish_latency_seconds",
        "Bounded send latency (per batch request).",
        t,
        &s.send_latency,
        m.publish_latency.total_seconds(),
        m.publish_latency.total_count(),
    );
    o.counter(
        "mq_publish_unknown_total",
        "Sends whose outcome is unknown: stay pending, never compensated.",
        &[(t, s.publish_unknown)],
    );
    let pending = m.tick.map(|k| &k.sample.pending);
    o.gauge(
        "reservation_mq_pending",
        "Reservations waiting for a confirmed send.",
        &pending
            .map(|p| vec![(&[][..], p.iter().map(|a| a.count as f64).sum())])
            .unwrap_or_default(),
    );
    o.gauge(
        "reservation_mq_pending_oldest_age_seconds",
        "Age of the oldest pending reservation.",
        &m.tick
            .map(|k| {
                let age = k
                    .sample
                    .pending
                    .iter()
                    .filter_map(|p| p.oldest_created_ms)
                    .map(|c| ((k.sample.at_ms - c) as f64 / 1000.0).max(0.0))
                    .fold(0.0, f64::max);
                vec![(&[][..], age)]
            })
            .unwrap_or_default(),
    );
    o.counter(
        "reservation_resend_total",
        "Scanner re-sends by outcome.",
        &[
            (&[("outcome", "CONFIRMED")], s.resend.confirmed),
            (&[("outcome", "UNKNOWN")], s.resend.unknown),
            (
                &[("outcome", "DEFINITE_FAILURE")],
                s.resend.definite_failure,
            ),
            (&[("outcome", "EXPIRED")], s.resend.expired),
        ],
    );

    // Consumer.
    o.counter(
        "mq_consume_total",
        "Order-create messages by broker verdict.",
        &[
            (&[("topic", &m.topic), ("result", "ACK")], c.acked),
            (&[("topic", &m.topic), ("result", "RETRY")], c.retried),
        ],
    );
    o.summary(
        "mq_consume_process_seconds",
        "One listener batch, parse to verdict.",
        t,
        &c.process,
        c.process_sum_s,
        c.process_count,
    );
    o.gauge(
        "mq_consumer_inflight",
        "Messages in the handler, not yet answered.",
        &[(&[], c.inflight as f64)],
    );
    let groups = m.tick.map(|k| k.sample.groups.as_slice()).unwrap_or(&[]);
    let order = groups.iter().find(|g| g.topic == m.topic);
    o.gauge(
        "mq_consumer_ready",
        "Order-create messages waiting on the broker, not yet handed out.",
        &order
            .map(|g| vec![(&[][..], (g.lag_messages - c.inflight).max(0) as f64)])
            .unwrap_or_default(),
    );
    let per_group = |f: fn(&crate::observe::GroupSample) -> f64| -> Vec<(Vec<(&str, &str)>, f64)> {
        groups
            .iter()
            .map(|g| {
                (
                    vec![("group", g.group.as_str()), ("topic", g.topic.as_str())],
                    f(g),
                )
            })
            .collect()
    };
    let lag_msgs = per_group(|g| g.lag_messages as f64);
    let lag_secs = per_group(|g| g.lag_seconds);
    o.gauge(
        "mq_consumer_lag_messages",
        "Unconsumed messages, %RETRY% included.",
        &lag_msgs
            .iter()
            .map(|(l, v)| (l.as_slice(), *v))
            .collect::<Vec<_>>(),
    );
    o.gauge(
        "mq_consumer_lag_seconds",
        "Age of the oldest unconsumed message, %RETRY% included.",
        &lag_secs
            .iter()
            .map(|(l, v)| (l.as_slice(), *v))
            .collect::<Vec<_>>(),
    );
    o.counter(
        "mq_ack_failure_total",
        "Messages sent back for redelivery.",
        &[(&[], c.retried)],
    );
    o.counter(
        "mq_duplicate_message_total",
        "Deliveries whose effect had already happened (inbox or reservation).",
        &[(&[], c.duplicates + c.duplicate_reservation)],
    );
    o.counter(
        "mq_business_reject_total",
        "Reservations turned down by the order transaction.",
        &[
            (&[("reason", "NO_STOCK")], c.rejected_no_stock),
            (&[("reason", "DUPLICATE_USER")], c.rejected_duplicate_user),
            (&[("reason", "EXPIRED")], c.rejected_expired),
            (&[("reason", "QUARANTINED")], c.quarantined),
        ],
    );

    // DLQ.
    let dlq = m.tick.and_then(|k| k.sample.dlq.as_ref());
    o.gauge(
        "mq_dlq_messages",
        "Dead messages not yet replayed or discarded.",
        &dlq.map(|d| vec![(&[][..], d.dead as f64)])
            .unwrap_or_default(),
    );
    o.gauge(
        "mq_dlq_oldest_age_seconds",
        "Age of the oldest dead message.",
        &dlq.map(|d| vec![(&[][..], d.oldest_dead_age_s.unwrap_or(0.0))])
            .unwrap_or_default(),
    );
    // Every outcome of `replay_outcome`, zero included, once the DLQ is read.
    let replays: Vec<(Vec<(&str, &str)>, u64)> = dlq
        .map(|d| {
            REPLAY_OUTCOMES
                .iter()
                .map(|k| {
                    (
                        vec![("result", *k)],
                        d.replays.get(*k).copied().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    o.counter(
        "mq_dlq_replay_total",
        "Operator replays by outcome (replay_audit).",
        &replays
            .iter()
            .map(|(l, v)| (l.as_slice(), *v))
            .collect::<Vec<_>>(),
    );

    // PostgreSQL.
    o.summary(
        "order_tx_latency_seconds",
        "One order transaction, BEGIN to COMMIT.",
        &[],
        &c.tx,
        c.tx_sum_s,
        c.tx_count,
    );
    o.summary(
        "pg_pool_wait_seconds",
        "Waiting for a pooled connection (with BEGIN).",
        &[],
        &c.pool_wait,
        c.pool_wait_sum_s,
        c.pool_wait_count,
    );
    o.gauge(
        "pg_pool_acquired",
        "Pool connections in use.",
        &[(&[], s.pool.size.saturating_sub(s.pool.idle) as f64)],
    );
    o.counter(
        "pg_deadlock_total",
        "Order transactions that hit a deadlock.",
        &[(&[], c.deadlocks)],
    );
    o.counter(
        "pg_serialization_retry_total",
        "Order transactions retried on a serialization failure.",
        &[(&[], c.serialization_failures)],
    );
    o.counter(
        "inventory_condition_update_miss_total",
        "Conditional stock decrements that found no stock.",
        &[(&[], c.rejected_no_stock)],
    );

    // The governor (docs/architecture.md §10).
    let g = &s.governor;
    o.gauge(
        "seckill_admission_open",
        "1 while new reservations are admitted.",
        &[(&[], if g.admission_open { 1.0 } else { 0.0 })],
    );
    o.counter(
        "seckill_admission_trips_total",
        "Times admission control closed.",
        &[(&[], g.admission_trips)],
    );
    o.counter(
        "seckill_admission_refused_total",
        "Reservations refused while closed.",
        &[(&[], g.admission_refused)],
    );
    o.gauge(
        "seckill_consumer_concurrency_limit",
        "Order transactions allowed at once (never above the budget).",
        &[(&[], g.limit as f64)],
    );
    let alerts: Vec<(Vec<(&str, &str)>, f64)> = m
        .tick
        .map(|k| {
            k.alerts
                .iter()
                .filter(|a| a.state != AlertState::NoData)
                .map(|a| {
                    let v = match a.state {
                        AlertState::Critical => 2.0,
                        AlertState::Warn => 1.0,
                        _ => 0.0,
                    };
                    (vec![("alert", a.metric)], v)
                })
                .collect()
        })
        .unwrap_or_default();
    o.gauge(
        "seckill_alert_state",
        "Alerts of docs/architecture.md §11.2: 0 ok, 1 warning, 2 critical.",
        &alerts
            .iter()
            .map(|(l, v)| (l.as_slice(), *v))
            .collect::<Vec<_>>(),
    );
    o.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn every_seed_name_has_help_and_type_even_before_the_first_tick() {
        let stats = StatsView {
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
        };
        let lat = Latencies::new(4);
        let text = render(&MetricsInput {
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
