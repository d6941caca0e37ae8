//! The message traffic of one process, by topic and consumer group
//! (docs/architecture.md §11.1): every send by topic and outcome with its
//! latency, and every listener answer by topic, group and result with its
//! processing time and the messages still in hand.
//!
//! Why here and recorded at the boundary: the producer and the listener
//! (`mq::rocket`) are the one place every topic's sends and every group's
//! deliveries pass through, the outbox, the cancels, the compensations, the
//! projections and the operator's replays included. Counting there rather
//! than in each stage is what makes `mq_publish_total` and
//! `mq_consume_total` mean what their names say.
//!
//! Families and histograms are `prometheus-client`'s: they are cheap to
//! record into (an atomic per series once the series exists) and `/metrics`
//! encodes them as they stand (`daemon::metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Duration;

/// Send latency buckets, in seconds. The design bounds one send at 20 to
/// 40 ms (docs/architecture.md §6.1); the buckets are finest there and
/// reach the longest timeout the engine allows.
pub const SEND_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.5, 3.0,
];

/// One listener call, parse to verdict: one order transaction at most, so
/// the order transaction's SLO buckets (§11.2: p99 warns above 300 ms and
/// is critical above 1 s).
pub const PROCESS_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5,
];

/// The order transaction, BEGIN to COMMIT (§11.2: p99 warns above 300 ms
/// and is critical above 1 s): both thresholds are bucket bounds, so an
/// alert on `histogram_quantile` reads them without interpolating across
/// them.
pub const TX_BUCKETS: [f64; 12] = PROCESS_BUCKETS;

/// Waiting for a pooled connection (§11.2: p95 warns above 20 ms and is
/// critical above 100 ms), both bounds again.
pub const POOL_WAIT_BUCKETS: [f64; 11] = [
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
];

/// A label value as the text format requires it: `\`, `"` and a line feed
/// escaped. `prometheus-client` 0.24 writes label values as given
/// (prometheus/client_rust#151, open), and one unescaped quote in a topic
/// or group name would make the whole scrape unreadable.
pub fn label_value(v: &str) -> String {
    if !v.contains(['\\', '"', '\n']) {
        return v.to_owned();
    }
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// A histogram over `buckets`, as the families below build them.
pub fn histogram(buckets: &[f64]) -> Histogram {
    Histogram::new(buckets.iter().copied())
}

fn send_histogram() -> Histogram {
    histogram(&SEND_BUCKETS)
}

fn process_histogram() -> Histogram {
    histogram(&PROCESS_BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    pub topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SendLabels {
    pub topic: String,
    /// `CONFIRMED`, `UNKNOWN` or `DEFINITE_FAILURE` ([`crate::mq::SendOutcome::label`]).
    pub outcome: &'static str,
}

/// One consumer group on one topic; the topic is the queue's, so the
/// redeliveries a group reads from `%RETRY%<group>` count apart.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub topic: String,
    pub group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AnswerLabels {
    pub topic: String,
    pub group: String,
    /// `ACK` or `RETRY`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AckFailureLabels {
    pub topic: String,
    pub group: String,
    pub reason: &'static str,
}

/// How a listener call ended, as the broker hears it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Committed: the offset moves on.
    Ack,
    /// The handler asked for redelivery: its effect did not commit.
    Retry,
    /// The handler failed (panicked); the batch is redelivered.
    Failed,
}

impl Answer {
    /// `mq_consume_total{result}`: the broker sees an ACK or a send-back.
    fn result(self) -> &'static str {
        match self {
            Answer::Ack => "ACK",
            Answer::Retry | Answer::Failed => "RETRY",
        }
    }

    /// `mq_ack_failure_total{reason}`: why a delivery went unacknowledged.
    fn failure(self) -> Option<&'static str> {
        match self {
            Answer::Ack => None,
            Answer::Retry => Some("RETRY"),
            Answer::Failed => Some("HANDLER_FAILED"),
        }
    }
}

/// Every labelled traffic family of one process. Cloning shares them.
#[derive(Debug, Clone)]
pub struct Meters {
    sends: Family<SendLabels, Counter>,
    unknown: Family<TopicLabels, Counter>,
    send_seconds: Family<TopicLabels, Histogram, fn() -> Histogram>,
    answered: Family<AnswerLabels, Counter>,
    ack_failures: Family<AckFailureLabels, Counter>,
    process_seconds: Family<QueueLabels, Histogram, fn() -> Histogram>,
    inflight: Family<QueueLabels, Gauge>,
}

impl Default for Meters {
    fn default() -> Self {
        Self {
            sends: Family::default(),
            unknown: Family::default(),
            send_seconds: Family::new_with_constructor(send_histogram),
            answered: Family::default(),
            ack_failures: Family::default(),
            process_seconds: Family::new_with_constructor(process_histogram),
            inflight: Family::default(),
        }
    }
}

impl Meters {
    /// One send request to `topic` carrying `n` messages: each takes the
    /// request's outcome (§6); the latency is the request's.
    pub fn sent(&self, topic: &str, outcome: &'static str, n: u64, took: Duration) {
        let topic = label_value(topic);
        self.sends
            .get_or_create(&SendLabels {
                topic: topic.clone(),
                outcome,
            })
            .inc_by(n);
        let topic = TopicLabels { topic };
        // Present from a topic's first send, so an UNKNOWN ratio reads 0
        // rather than nothing.
        let unknown = if outcome == "UNKNOWN" { n } else { 0 };
        self.unknown.get_or_create(&topic).inc_by(unknown);
        self.send_seconds
            .get_or_create(&topic)
            .observe(took.as_secs_f64());
    }

    /// A consumer of `group` reads `topic`: its answer and failure series
    /// exist from the start at 0, so a ratio over them reads 0 rather than
    /// nothing before the first failure.
    pub fn declare_consumer(&self, group: &str, topic: &str) {
        let q = queue(group, topic);
        self.inflight.get_or_create(&q).inc_by(0);
        for answer in [Answer::Ack, Answer::Retry, Answer::Failed] {
            self.count_answer(&q, answer, 0);
        }
    }

    /// `n` messages of `group` on `topic` handed to the handler.
    pub fn handed(&self, group: &str, topic: &str, n: u64) {
        self.inflight
            .get_or_create(&queue(group, topic))
            .inc_by(n as i64);
    }

    /// The handler answered those `n` messages after `took`.
    pub fn answered(&self, group: &str, topic: &str, n: u64, answer: Answer, took: Duration) {
        let q = queue(group, topic);
        self.inflight.get_or_create(&q).dec_by(n as i64);
        self.process_seconds
            .get_or_create(&q)
            .observe(took.as_secs_f64());
        self.count_answer(&q, answer, n);
    }

    /// `n` answers of one kind: the broker's verdict, and the reason when
    /// it was not an acknowledgement.
    fn count_answer(&self, q: &QueueLabels, answer: Answer, n: u64) {
        self.answered
            .get_or_create(&AnswerLabels {
                topic: q.topic.clone(),
                group: q.group.clone(),
                result: answer.result(),
            })
            .inc_by(n);
        if let Some(reason) = answer.failure() {
            self.ack_failures
                .get_or_create(&AckFailureLabels {
                    topic: q.topic.clone(),
                    group: q.group.clone(),
                    reason,
                })
                .inc_by(n);
        }
    }

    /// Messages of `group` read from `topic` in hand now.
    pub fn inflight_of(&self, group: &str, topic: &str) -> i64 {
        self.inflight
            .get(&queue(group, topic))
            .map_or(0, |g| g.get())
    }

    /// Adds every family to `r` under its docs/architecture.md §11.1 name.
    /// Counters are named without `_total`: the encoder appends it.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "mq_publish",
            "Messages sent, by topic and outcome (every topic: orders, outbox events, cancels, compensations, replays)",
            self.sends.clone(),
        );
        r.register(
            "mq_publish_latency_seconds",
            "One send request, by topic (a batch is one request)",
            self.send_seconds.clone(),
        );
        r.register(
            "mq_publish_unknown",
            "Messages whose send outcome is unknown: they stay pending and are re-sent, never compensated",
            self.unknown.clone(),
        );
        r.register(
            "mq_consume",
            "Messages answered by a listener, by topic, group and the broker's verdict",
            self.answered.clone(),
        );
        r.register(
            "mq_consume_process_seconds",
            "One listener call, parse to verdict, by topic and group",
            self.process_seconds.clone(),
        );
        r.register(
            "mq_consumer_inflight",
            "Messages handed to a listener and not yet answered",
            self.inflight.clone(),
        );
        r.register(
            "mq_ack_failure",
            "Deliveries not acknowledged: the handler asked for redelivery (RETRY) or failed (HANDLER_FAILED)",
            self.ack_failures.clone(),
        );
    }
}

fn queue(group: &str, topic: &str) -> QueueLabels {
    QueueLabels {
        topic: label_value(topic),
        group: label_value(group),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: &Meters) -> String {
        let mut r = Registry::default();
        m.register(&mut r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).expect("encodes");
        out
    }

    #[test]
    fn a_batch_counts_each_message_with_the_requests_outcome() {
        let m = Meters::default();
        m.sent("T", "CONFIRMED", 16, Duration::from_millis(3));
        m.sent("T", "UNKNOWN", 2, Duration::from_millis(50));
        m.sent("C", "CONFIRMED", 1, Duration::from_millis(1));
        let t = text(&m);
        assert!(
            t.contains("mq_publish_total{topic=\"T\",outcome=\"CONFIRMED\"} 16\n"),
            "{t}"
        );
        assert!(
            t.contains("mq_publish_total{topic=\"T\",outcome=\"UNKNOWN\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("mq_publish_unknown_total{topic=\"T\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("mq_publish_total{topic=\"C\",outcome=\"CONFIRMED\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("mq_publish_latency_seconds_count{topic=\"T\"} 2\n"),
            "{t}"
        );
        // 3 ms and 50 ms: one request at or under 5 ms, both under 80 ms.
        assert!(
            t.contains("mq_publish_latency_seconds_bucket{le=\"0.005\",topic=\"T\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("mq_publish_latency_seconds_bucket{le=\"0.08\",topic=\"T\"} 2\n"),
            "{t}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Meters::default();
        m.sent("a\"b\\c\nd", "CONFIRMED", 1, Duration::ZERO);
        let t = text(&m);
        assert!(
            t.contains(r#"mq_publish_total{topic="a\"b\\c\nd",outcome="CONFIRMED"} 1"#),
            "{t}"
        );
        assert_eq!(label_value("plain"), "plain");
    }

    #[test]
    fn a_declared_consumer_reads_zero_before_its_first_delivery() {
        let m = Meters::default();
        m.declare_consumer("g", "T");
        let t = text(&m);
        for line in [
            "mq_consume_total{topic=\"T\",group=\"g\",result=\"ACK\"} 0",
            "mq_consume_total{topic=\"T\",group=\"g\",result=\"RETRY\"} 0",
            "mq_ack_failure_total{topic=\"T\",group=\"g\",reason=\"RETRY\"} 0",
            "mq_ack_failure_total{topic=\"T\",group=\"g\",reason=\"HANDLER_FAILED\"} 0",
            "mq_consumer_inflight{topic=\"T\",group=\"g\"} 0",
        ] {
            assert!(t.lines().any(|l| l == line), "no {line:?} in:\n{t}");
        }
    }

    #[test]
    fn answers_leave_nothing_in_hand_and_failures_count_by_reason() {
        let m = Meters::default();
        m.handed("g", "T", 5);
        assert_eq!(m.inflight_of("g", "T"), 5);
        m.answered("g", "T", 3, Answer::Ack, Duration::from_millis(2));
        m.answered("g", "T", 1, Answer::Retry, Duration::from_millis(2));
        m.answered("g", "T", 1, Answer::Failed, Duration::from_millis(2));
        assert_eq!(m.inflight_of("g", "T"), 0);
        let t = text(&m);
        assert!(
            t.contains("mq_consume_total{topic=\"T\",group=\"g\",result=\"ACK\"} 3\n"),
            "{t}"
        );
        assert!(
            t.contains("mq_consume_total{topic=\"T\",group=\"g\",result=\"RETRY\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("mq_ack_failure_total{topic=\"T\",group=\"g\",reason=\"RETRY\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains(
                "mq_ack_failure_total{topic=\"T\",group=\"g\",reason=\"HANDLER_FAILED\"} 1\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("mq_consume_process_seconds_count{topic=\"T\",group=\"g\"} 3\n"),
            "{t}"
        );
    }
}
