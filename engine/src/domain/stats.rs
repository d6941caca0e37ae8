//! In-process counters and latency samples for the pipeline: what the bench
//! summary, `/v1/stats` and (later) `/metrics` read. Bounded: a latency
//! recorder keeps at most a fixed number of recent samples.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A bounded window of recent latency samples, in microseconds, plus the
/// all-time count and sum. The window gives the percentiles the alerts and
/// the governor read (recent ones); the optional histogram is what
/// `/metrics` exports, since a window's percentiles cannot be aggregated
/// over engines or time (docs/architecture.md §11.1).
#[derive(Debug)]
pub struct Latencies {
    cap: usize,
    samples: Mutex<VecDeque<(Instant, u64)>>,
    count: AtomicU64,
    sum_us: AtomicU64,
    histogram: Option<prometheus_client::metrics::histogram::Histogram>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    #[serde(default)]
    pub p95_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Latencies {
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            samples: Mutex::new(VecDeque::with_capacity(cap.min(4096))),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
            histogram: None,
        }
    }

    /// A window that also feeds a histogram over `buckets` (seconds).
    pub fn with_histogram(cap: usize, buckets: &[f64]) -> Self {
        Self {
            histogram: Some(crate::domain::meters::histogram(buckets)),
            ..Self::new(cap)
        }
    }

    /// The histogram every sample also goes to, for `/metrics`.
    pub fn histogram(&self) -> Option<&prometheus_client::metrics::histogram::Histogram> {
        self.histogram.as_ref()
    }

    pub fn record(&self, d: Duration) {
        if let Some(h) = &self.histogram {
            h.observe(d.as_secs_f64());
        }
        let us = d.as_micros() as u64;
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() == self.cap {
            s.pop_front();
        }
        s.push_back((Instant::now(), us));
    }

    /// Samples recorded since start (not only those still in the window).
    pub fn total_count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Sum of every sample since start, in seconds.
    pub fn total_seconds(&self) -> f64 {
        self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
    }

    pub fn percentiles(&self) -> Percentiles {
        let mut v: Vec<u64> = self
            .samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(_, us)| *us)
            .collect();
        percentiles_of(&mut v)
    }

    /// Percentiles of the samples recorded within `window`: what an alert
    /// reads, so a burst an hour ago does not keep it firing.
    pub fn recent(&self, window: Duration) -> Percentiles {
        let since = Instant::now().checked_sub(window);
        let mut v: Vec<u64> = self
            .samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(at, _)| since.is_none_or(|s| *at >= s))
            .map(|(_, us)| *us)
            .collect();
        percentiles_of(&mut v)
    }
}

/// Nearest-rank percentiles of microsecond samples.
pub fn percentiles_of(us: &mut [u64]) -> Percentiles {
    if us.is_empty() {
        return Percentiles::default();
    }
    us.sort_unstable();
    let at = |q: f64| {
        let rank = ((q * us.len() as f64).ceil() as usize).clamp(1, us.len());
        us[rank - 1] as f64 / 1000.0
    };
    Percentiles {
        count: us.len(),
        p50_ms: at(0.50),
        p95_ms: at(0.95),
        p99_ms: at(0.99),
        p999_ms: at(0.999),
        max_ms: us[us.len() - 1] as f64 / 1000.0,
    }
}

#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down (in-flight messages).
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn add(&self, n: i64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The order-create consumer (docs/architecture.md §11.1 consumer and PostgreSQL metrics).
/// Latency windows are short, so percentiles describe the last few
/// thousand batches, which is what an alert and the concurrency governor need.
#[derive(Debug)]
pub struct ConsumeStats {
    /// Messages handed to the handler and not yet answered.
    pub inflight: Gauge,
    /// Messages of batches answered ACK.
    pub acked: Counter,
    /// Messages of batches sent back for redelivery (docs/architecture.md §11.2 "ACK failure").
    pub retried: Counter,
    pub created: Counter,
    /// Already consumed (the inbox said so): `mq_duplicate_message_total`.
    pub duplicates: Counter,
    pub duplicate_reservation: Counter,
    pub rejected_no_stock: Counter,
    pub rejected_duplicate_user: Counter,
    pub rejected_expired: Counter,
    pub quarantined: Counter,
    pub deadlocks: Counter,
    pub serialization_failures: Counter,
    /// One handler call, parse to verdict.
    pub process_latency: Latencies,
    /// One order transaction, BEGIN to COMMIT.
    pub tx_latency: Latencies,
    /// Waiting for a pooled connection (and its BEGIN round trip).
    pub pool_wait: Latencies,
}

impl Default for ConsumeStats {
    fn default() -> Self {
        Self {
            inflight: Gauge::default(),
            acked: Counter::default(),
            retried: Counter::default(),
            created: Counter::default(),
            duplicates: Counter::default(),
            duplicate_reservation: Counter::default(),
            rejected_no_stock: Counter::default(),
            rejected_duplicate_user: Counter::default(),
            rejected_expired: Counter::default(),
            quarantined: Counter::default(),
            deadlocks: Counter::default(),
            serialization_failures: Counter::default(),
            process_latency: Latencies::new(4096),
            tx_latency: Latencies::with_histogram(4096, &crate::domain::meters::TX_BUCKETS),
            pool_wait: Latencies::with_histogram(4096, &crate::domain::meters::POOL_WAIT_BUCKETS),
        }
    }
}

/// Publisher and scanner figures (docs/architecture.md §11.1 producer metrics).
#[derive(Debug)]
pub struct PublishStats {
    pub confirmed: Counter,
    pub unknown: Counter,
    pub definite_failure: Counter,
    pub batches: Counter,
    /// Left in the publisher's queue past their first retry time and so
    /// handed to the scanner unsent (see `publish::still_ours`).
    pub handed_to_scanner: Counter,
    pub resent: Counter,
    /// Scanner re-sends by outcome (`reservation_resend_total{outcome}`).
    pub resend_confirmed: Counter,
    pub resend_unknown: Counter,
    pub resend_failed: Counter,
    /// Claimed past validity: settled as expired, not re-sent.
    pub resend_expired: Counter,
    pub send_latency: Latencies,
}

impl Default for PublishStats {
    fn default() -> Self {
        Self {
            confirmed: Counter::default(),
            unknown: Counter::default(),
            definite_failure: Counter::default(),
            batches: Counter::default(),
            handed_to_scanner: Counter::default(),
            resent: Counter::default(),
            resend_confirmed: Counter::default(),
            resend_unknown: Counter::default(),
            resend_failed: Counter::default(),
            resend_expired: Counter::default(),
            send_latency: Latencies::new(200_000),
        }
    }
}

/// The order lifecycle after creation (docs/architecture.md §8): outbox sends, cancel
/// no-ops by reason, releases and projection writes.
#[derive(Debug, Default)]
pub struct LifecycleStats {
    pub outbox_sent: Counter,
    pub outbox_unknown: Counter,
    pub outbox_failed: Counter,
    pub canceled: Counter,
    pub cancel_noop_already_paid: Counter,
    pub cancel_noop_already_canceled: Counter,
    pub cancel_noop_not_yet_due: Counter,
    pub cancel_noop_unknown_order: Counter,
    pub released: Counter,
    pub already_released: Counter,
    pub orphaned: Counter,
    pub projected: Counter,
    pub projection_stale: Counter,
    pub sweep_canceled: Counter,
    pub sweep_released: Counter,
    /// Deliveries the cancel and compensation inboxes had already settled
    /// (`mq_duplicate_message_total` of those groups).
    pub cancel_duplicates: Counter,
    pub release_duplicates: Counter,
}

impl LifecycleStats {
    pub fn cancel_noop(&self, reason: crate::domain::status::CancelNoop) -> &Counter {
        use crate::domain::status::CancelNoop as N;
        match reason {
            N::AlreadyPaid => &self.cancel_noop_already_paid,
            N::AlreadyCanceled => &self.cancel_noop_already_canceled,
            N::NotYetDue => &self.cancel_noop_not_yet_due,
            N::UnknownOrder => &self.cancel_noop_unknown_order,
        }
    }
}

// ---------------------------------------------------------------------------
// The stats view: every counter above as plain data, served at `/v1/stats`
// and read back by the CLI, the TUI and the observers.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatsView {
    pub publish_confirmed: u64,
    pub publish_unknown: u64,
    pub publish_definite_failure: u64,
    pub publish_batches: u64,
    /// Queued past their first retry time: the scanner sent them instead.
    #[serde(default)]
    pub publish_handed_to_scanner: u64,
    pub scanner_resent: u64,
    #[serde(default)]
    pub resend: ResendView,
    pub send_latency: Percentiles,
    #[serde(default)]
    pub lifecycle: LifecycleView,
    #[serde(default)]
    pub consume: ConsumeView,
    #[serde(default)]
    pub pool: PoolView,
    #[serde(default)]
    pub governor: GovernorView,
    #[serde(default)]
    pub circuit: CircuitView,
    /// Where this daemon's consumers have got to, queue by queue: fresher
    /// than the broker's committed offsets (docs/architecture.md §10.4).
    #[serde(default)]
    pub positions: Vec<QueuePosition>,
}

/// Several daemons' positions as one, the furthest per queue, in key order.
fn furthest(all: impl Iterator<Item = QueuePosition>) -> Vec<QueuePosition> {
    let mut by_queue: std::collections::BTreeMap<(String, String, String, i32), QueuePosition> =
        Default::default();
    for q in all {
        let key = (
            q.group.clone(),
            q.topic.clone(),
            q.broker.clone(),
            q.queue_id,
        );
        match by_queue.get_mut(&key) {
            Some(p) => p.offset = p.offset.max(q.offset),
            None => {
                by_queue.insert(key, q);
            }
        }
    }
    by_queue.into_values().collect()
}

/// The first offset of one queue a daemon has not yet answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuePosition {
    pub group: String,
    pub topic: String,
    pub broker: String,
    pub queue_id: i32,
    pub offset: i64,
}

/// The send circuit (docs/architecture.md §6.7): CLOSED, OPEN or PROBING,
/// how long the broker has been unreachable, and what it held back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CircuitView {
    pub state: String,
    pub open_for_s: Option<f64>,
    /// Times it opened since start.
    pub opened: u64,
    /// Messages not sent while it was open; they stayed pending in Redis.
    pub held: u64,
    pub probes: u64,
}

impl Default for CircuitView {
    fn default() -> Self {
        Self {
            state: "CLOSED".to_owned(),
            open_for_s: None,
            opened: 0,
            held: 0,
            probes: 0,
        }
    }
}

/// The order-create consumer (docs/architecture.md §11.1). Percentiles cover the daemon's
/// signal window (30 s); sums and counts are since start.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConsumeView {
    pub inflight: i64,
    pub acked: u64,
    pub retried: u64,
    pub created: u64,
    pub duplicates: u64,
    pub duplicate_reservation: u64,
    pub rejected_no_stock: u64,
    pub rejected_duplicate_user: u64,
    pub rejected_expired: u64,
    pub quarantined: u64,
    pub deadlocks: u64,
    pub serialization_failures: u64,
    pub process: Percentiles,
    pub process_sum_s: f64,
    pub process_count: u64,
    pub tx: Percentiles,
    pub tx_sum_s: f64,
    pub tx_count: u64,
    pub pool_wait: Percentiles,
    pub pool_wait_sum_s: f64,
    pub pool_wait_count: u64,
}

impl ConsumeView {
    /// The consumer's counters, with percentiles over the last `w`.
    pub fn of(c: &ConsumeStats, w: Duration) -> Self {
        Self {
            inflight: c.inflight.get(),
            acked: c.acked.get(),
            retried: c.retried.get(),
            created: c.created.get(),
            duplicates: c.duplicates.get(),
            duplicate_reservation: c.duplicate_reservation.get(),
            rejected_no_stock: c.rejected_no_stock.get(),
            rejected_duplicate_user: c.rejected_duplicate_user.get(),
            rejected_expired: c.rejected_expired.get(),
            quarantined: c.quarantined.get(),
            deadlocks: c.deadlocks.get(),
            serialization_failures: c.serialization_failures.get(),
            process: c.process_latency.recent(w),
            process_sum_s: c.process_latency.total_seconds(),
            process_count: c.process_latency.total_count(),
            tx: c.tx_latency.recent(w),
            tx_sum_s: c.tx_latency.total_seconds(),
            tx_count: c.tx_latency.total_count(),
            pool_wait: c.pool_wait.recent(w),
            pool_wait_sum_s: c.pool_wait.total_seconds(),
            pool_wait_count: c.pool_wait.total_count(),
        }
    }
}

/// Scanner re-sends by outcome.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ResendView {
    pub confirmed: u64,
    pub unknown: u64,
    pub definite_failure: u64,
    pub expired: u64,
}

/// The engine's PostgreSQL pool.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PoolView {
    pub size: u32,
    pub idle: u32,
    pub max: u32,
}

/// Admission control and the adaptive concurrency (docs/architecture.md §10).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GovernorView {
    pub admission_open: bool,
    pub admission_reason: Option<String>,
    pub admission_trips: u64,
    pub admission_recoveries: u64,
    pub admission_refused: u64,
    pub limit: u32,
    pub budget: u32,
}

/// After-order counters (docs/architecture.md §8), cancel no-ops by reason.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LifecycleView {
    pub outbox_sent: u64,
    pub outbox_unknown: u64,
    pub outbox_failed: u64,
    pub canceled: u64,
    pub cancel_noop_already_paid: u64,
    pub cancel_noop_already_canceled: u64,
    pub cancel_noop_not_yet_due: u64,
    pub cancel_noop_unknown_order: u64,
    pub released: u64,
    pub already_released: u64,
    pub orphaned: u64,
    pub projected: u64,
    pub projection_stale: u64,
    pub sweep_canceled: u64,
    pub sweep_released: u64,
    #[serde(default)]
    pub cancel_duplicates: u64,
    #[serde(default)]
    pub release_duplicates: u64,
}

impl LifecycleView {
    pub fn of(s: &LifecycleStats) -> Self {
        Self {
            outbox_sent: s.outbox_sent.get(),
            outbox_unknown: s.outbox_unknown.get(),
            outbox_failed: s.outbox_failed.get(),
            canceled: s.canceled.get(),
            cancel_noop_already_paid: s.cancel_noop_already_paid.get(),
            cancel_noop_already_canceled: s.cancel_noop_already_canceled.get(),
            cancel_noop_not_yet_due: s.cancel_noop_not_yet_due.get(),
            cancel_noop_unknown_order: s.cancel_noop_unknown_order.get(),
            released: s.released.get(),
            already_released: s.already_released.get(),
            orphaned: s.orphaned.get(),
            projected: s.projected.get(),
            projection_stale: s.projection_stale.get(),
            sweep_canceled: s.sweep_canceled.get(),
            sweep_released: s.sweep_released.get(),
            cancel_duplicates: s.cancel_duplicates.get(),
            release_duplicates: s.release_duplicates.get(),
        }
    }
}

impl StatsView {
    /// Every counter of the process; latency percentiles over the last
    /// `window`. The pool and governor parts are read by their owners.
    pub fn of(
        s: &PublishStats,
        l: &LifecycleStats,
        c: &ConsumeStats,
        window: Duration,
        pool: PoolView,
        governor: GovernorView,
        circuit: CircuitView,
    ) -> Self {
        Self {
            circuit,
            // The consumers' own, read by their owner (`mq::position`).
            positions: Vec::new(),
            lifecycle: LifecycleView::of(l),
            consume: ConsumeView::of(c, window),
            pool,
            governor,
            publish_confirmed: s.confirmed.get(),
            publish_unknown: s.unknown.get(),
            publish_definite_failure: s.definite_failure.get(),
            publish_batches: s.batches.get(),
            publish_handed_to_scanner: s.handed_to_scanner.get(),
            scanner_resent: s.resent.get(),
            resend: ResendView {
                confirmed: s.resend_confirmed.get(),
                unknown: s.resend_unknown.get(),
                definite_failure: s.resend_failed.get(),
                expired: s.resend_expired.get(),
            },
            send_latency: s.send_latency.percentiles(),
        }
    }
}

// ---------------------------------------------------------------------------
// Several daemons as one (docs/architecture.md §14.3): what the console shows
// when it reads every live engine of the registry.
// ---------------------------------------------------------------------------

impl Percentiles {
    /// Two windows as one: the counts add up, and each percentile is the
    /// worse of the two. Percentiles cannot be added; on-call's question is
    /// whether any daemon is slow, and the worst one answers it.
    pub fn worst_of(self, o: Percentiles) -> Percentiles {
        Percentiles {
            count: self.count + o.count,
            p50_ms: self.p50_ms.max(o.p50_ms),
            p95_ms: self.p95_ms.max(o.p95_ms),
            p99_ms: self.p99_ms.max(o.p99_ms),
            p999_ms: self.p999_ms.max(o.p999_ms),
            max_ms: self.max_ms.max(o.max_ms),
        }
    }
}

impl CircuitView {
    /// How open: CLOSED < PROBING < OPEN.
    fn openness(&self) -> u8 {
        match self.state.as_str() {
            "CLOSED" => 0,
            "PROBING" => 1,
            _ => 2,
        }
    }
}

impl StatsView {
    /// Where the daemon's consumers of `group` stand on `topic`, by
    /// (broker, queue): what `RocketAdmin::lag_detail_with` counts a
    /// queue's lag from when the broker's committed offset is behind
    /// (docs/architecture.md §10.4).
    pub fn positions_of(&self, group: &str, topic: &str) -> BTreeMap<(String, i32), i64> {
        self.positions
            .iter()
            .filter(|q| q.group == group && q.topic == topic)
            .map(|q| ((q.broker.clone(), q.queue_id), q.offset))
            .collect()
    }

    /// Every daemon's figures as one: counters, gauges and pools add up,
    /// latency percentiles are the worst daemon's, the send circuit is the
    /// most open one's, and admission is open only while every daemon
    /// admits. `None` when no daemon answered.
    pub fn merge<'a>(views: impl IntoIterator<Item = &'a StatsView>) -> Option<StatsView> {
        views.into_iter().cloned().reduce(|a, b| a.plus(b))
    }

    fn plus(self, o: StatsView) -> StatsView {
        let (c, d) = (self.consume, o.consume);
        let (l, m) = (self.lifecycle, o.lifecycle);
        let (g, h) = (self.governor, o.governor);
        let circuit = if o.circuit.openness() > self.circuit.openness() {
            o.circuit.clone()
        } else {
            self.circuit.clone()
        };
        StatsView {
            publish_confirmed: self.publish_confirmed + o.publish_confirmed,
            publish_unknown: self.publish_unknown + o.publish_unknown,
            publish_definite_failure: self.publish_definite_failure + o.publish_definite_failure,
            publish_batches: self.publish_batches + o.publish_batches,
            publish_handed_to_scanner: self.publish_handed_to_scanner + o.publish_handed_to_scanner,
            scanner_resent: self.scanner_resent + o.scanner_resent,
            resend: ResendView {
                confirmed: self.resend.confirmed + o.resend.confirmed,
                unknown: self.resend.unknown + o.resend.unknown,
                definite_failure: self.resend.definite_failure + o.resend.definite_failure,
                expired: self.resend.expired + o.resend.expired,
            },
            send_latency: self.send_latency.worst_of(o.send_latency),
            lifecycle: LifecycleView {
                outbox_sent: l.outbox_sent + m.outbox_sent,
                outbox_unknown: l.outbox_unknown + m.outbox_unknown,
                outbox_failed: l.outbox_failed + m.outbox_failed,
                canceled: l.canceled + m.canceled,
                cancel_noop_already_paid: l.cancel_noop_already_paid + m.cancel_noop_already_paid,
                cancel_noop_already_canceled: l.cancel_noop_already_canceled
                    + m.cancel_noop_already_canceled,
                cancel_noop_not_yet_due: l.cancel_noop_not_yet_due + m.cancel_noop_not_yet_due,
                cancel_noop_unknown_order: l.cancel_noop_unknown_order
                    + m.cancel_noop_unknown_order,
                released: l.released + m.released,
                already_released: l.already_released + m.already_released,
                orphaned: l.orphaned + m.orphaned,
                projected: l.projected + m.projected,
                projection_stale: l.projection_stale + m.projection_stale,
                sweep_canceled: l.sweep_canceled + m.sweep_canceled,
                sweep_released: l.sweep_released + m.sweep_released,
                cancel_duplicates: l.cancel_duplicates + m.cancel_duplicates,
                release_duplicates: l.release_duplicates + m.release_duplicates,
            },
            consume: ConsumeView {
                inflight: c.inflight + d.inflight,
                acked: c.acked + d.acked,
                retried: c.retried + d.retried,
                created: c.created + d.created,
                duplicates: c.duplicates + d.duplicates,
                duplicate_reservation: c.duplicate_reservation + d.duplicate_reservation,
                rejected_no_stock: c.rejected_no_stock + d.rejected_no_stock,
                rejected_duplicate_user: c.rejected_duplicate_user + d.rejected_duplicate_user,
                rejected_expired: c.rejected_expired + d.rejected_expired,
                quarantined: c.quarantined + d.quarantined,
                deadlocks: c.deadlocks + d.deadlocks,
                serialization_failures: c.serialization_failures + d.serialization_failures,
                process: c.process.worst_of(d.process),
                process_sum_s: c.process_sum_s + d.process_sum_s,
                process_count: c.process_count + d.process_count,
                tx: c.tx.worst_of(d.tx),
                tx_sum_s: c.tx_sum_s + d.tx_sum_s,
                tx_count: c.tx_count + d.tx_count,
                pool_wait: c.pool_wait.worst_of(d.pool_wait),
                pool_wait_sum_s: c.pool_wait_sum_s + d.pool_wait_sum_s,
                pool_wait_count: c.pool_wait_count + d.pool_wait_count,
            },
            pool: PoolView {
                size: self.pool.size + o.pool.size,
                idle: self.pool.idle + o.pool.idle,
                max: self.pool.max + o.pool.max,
            },
            governor: GovernorView {
                admission_open: g.admission_open && h.admission_open,
                admission_reason: g.admission_reason.or(h.admission_reason),
                admission_trips: g.admission_trips + h.admission_trips,
                admission_recoveries: g.admission_recoveries + h.admission_recoveries,
                admission_refused: g.admission_refused + h.admission_refused,
                limit: g.limit + h.limit,
                budget: g.budget + h.budget,
            },
            // A queue has one owner at a time; a daemon that just gave one
            // up may still list it, never ahead of the new owner's truth.
            positions: furthest(self.positions.into_iter().chain(o.positions)),
            circuit: CircuitView {
                opened: self.circuit.opened + o.circuit.opened,
                held: self.circuit.held + o.circuit.held,
                probes: self.circuit.probes + o.circuit.probes,
                ..circuit
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(created: u64, p99: f64, circuit: &str, admitting: bool) -> StatsView {
        let mut v: StatsView = serde_json::from_value(serde_json::json!({
            "publish_confirmed": created, "publish_unknown": 1, "publish_definite_failure": 0,
            "publish_batches": 1, "scanner_resent": 0,
            "send_latency": {"count": 10, "p50_ms": 1.0, "p99_ms": p99, "p999_ms": p99, "max_ms": p99}
        }))
        .unwrap();
        v.consume.created = created;
        v.consume.inflight = 2;
        v.consume.tx.p99_ms = p99;
        v.pool = PoolView {
            size: 4,
            idle: 1,
            max: 8,
        };
        v.circuit.state = circuit.to_owned();
        v.governor.admission_open = admitting;
        v
    }

    #[test]
    fn daemons_merge_into_sums_and_their_worst() {
        assert!(StatsView::merge([]).is_none());
        let a = view(100, 5.0, "CLOSED", true);
        let b = view(50, 40.0, "OPEN", true);
        let m = StatsView::merge([&a, &b]).unwrap();
        assert_eq!(m.consume.created, 150);
        assert_eq!(m.publish_confirmed, 150);
        assert_eq!(m.publish_unknown, 2);
        assert_eq!(m.consume.inflight, 4);
        assert_eq!(m.consume.tx.p99_ms, 40.0, "the slow daemon shows");
        assert_eq!(m.send_latency.count, 20);
        assert_eq!((m.pool.size, m.pool.idle, m.pool.max), (8, 2, 16));
        assert_eq!(m.circuit.state, "OPEN");
        assert!(m.governor.admission_open);
        let c = view(1, 1.0, "PROBING", false);
        let m = StatsView::merge([&a, &b, &c]).unwrap();
        assert_eq!(m.circuit.state, "OPEN", "the most open one");
        assert!(!m.governor.admission_open, "one daemon refusing shows");
        // One daemon is itself.
        let one = StatsView::merge([&a]).unwrap();
        assert_eq!(one.consume.created, 100);
    }

    #[test]
    fn positions_merge_into_the_furthest_per_queue() {
        let at = |queue_id, offset| QueuePosition {
            group: "g".into(),
            topic: "t".into(),
            broker: "b".into(),
            queue_id,
            offset,
        };
        let mut a = view(1, 1.0, "CLOSED", true);
        a.positions = vec![at(0, 10), at(1, 5)];
        let mut b = view(1, 1.0, "CLOSED", true);
        b.positions = vec![at(1, 7), at(2, 3)];
        let m = StatsView::merge([&a, &b]).unwrap();
        assert_eq!(m.positions, vec![at(0, 10), at(1, 7), at(2, 3)]);
    }

    #[test]
    fn nearest_rank() {
        let mut v: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        let p = percentiles_of(&mut v);
        assert_eq!(p.count, 1000);
        assert_eq!(p.p50_ms, 500.0);
        assert_eq!(p.p95_ms, 950.0);
        assert_eq!(p.p99_ms, 990.0);
        assert_eq!(p.p999_ms, 999.0);
        assert_eq!(p.max_ms, 1000.0);
        assert_eq!(percentiles_of(&mut []), Percentiles::default());
    }

    #[test]
    fn the_window_is_bounded() {
        let l = Latencies::new(3);
        for ms in [100, 1, 2, 3] {
            l.record(Duration::from_millis(ms));
        }
        assert_eq!(l.percentiles().count, 3);
        assert_eq!(l.percentiles().max_ms, 3.0);
    }
}
