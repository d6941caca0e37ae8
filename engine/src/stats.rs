//! In-process counters and latency samples for the pipeline: what the bench
//! summary, `/v1/stats` and (later) `/metrics` read. Bounded: a latency
//! recorder keeps at most a fixed number of recent samples.

use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A bounded window of recent latency samples, in microseconds, plus the
/// all-time count and sum a Prometheus summary needs.
#[derive(Debug)]
pub struct Latencies {
    cap: usize,
    samples: Mutex<VecDeque<(Instant, u64)>>,
    count: AtomicU64,
    sum_us: AtomicU64,
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
        }
    }

    pub fn record(&self, d: Duration) {
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

/// The order-create consumer (seed §28.2 consumer and PostgreSQL metrics).
/// Latency windows are short, so percentiles describe the last few
/// thousand batches, which is what an alert and the concurrency governor need.
#[derive(Debug)]
pub struct ConsumeStats {
    /// Messages handed to the handler and not yet answered.
    pub inflight: Gauge,
    /// Messages of batches answered ACK.
    pub acked: Counter,
    /// Messages of batches sent back for redelivery (seed §28.3 "ACK failure").
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
            tx_latency: Latencies::new(4096),
            pool_wait: Latencies::new(4096),
        }
    }
}

/// Publisher and scanner figures (seed §28.2 producer metrics).
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

/// The order lifecycle after creation (DESIGN.md §8): outbox sends, cancel
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
}

impl LifecycleStats {
    pub fn cancel_noop(&self, reason: crate::order::CancelNoop) -> &Counter {
        use crate::order::CancelNoop as N;
        match reason {
            N::AlreadyPaid => &self.cancel_noop_already_paid,
            N::AlreadyCanceled => &self.cancel_noop_already_canceled,
            N::NotYetDue => &self.cancel_noop_not_yet_due,
            N::UnknownOrder => &self.cancel_noop_unknown_order,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
