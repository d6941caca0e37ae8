//! The daemon's backlog governor (docs/architecture.md §10): once per tick it samples
//! what the operator commands sample, then
//! - feeds the docs/architecture.md §10.8 advice to admission control (503 on its last row),
//! - moves the order consumer's concurrency inside the PostgreSQL budget,
//! - keeps the latest sample, advice and alerts for `/metrics` and `/v1/stats`.
//!
//! The decisions are the pure functions of [`crate::decide::scale`],
//! [`crate::decide::admission`], [`crate::pipeline::concurrency`] and [`crate::decide::alerts`];
//! this module only wires them to the clock.

use crate::config::Config;
use crate::decide::admission::{Admission, Gate, Transition};
use crate::decide::alerts::Alert;
use crate::decide::scale::Advice;
use crate::domain::stats::{ConsumeStats, Counter, GovernorView};
use crate::observe::{Observer, Sample, Watch};
use crate::pipeline::concurrency::{self, Limiter, Signals};
use serde::Serialize;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How far back the governor's latency percentiles look.
pub const SIGNAL_WINDOW: Duration = Duration::from_secs(30);

/// The latest tick, shared with the HTTP handlers.
#[derive(Debug, Clone, Serialize)]
pub struct Tick {
    pub sample: Sample,
    pub advice: Advice,
    pub alerts: Vec<Alert>,
}

#[derive(Debug)]
pub struct Governor {
    admission: RwLock<Admission>,
    enforce: bool,
    pub limiter: Arc<Limiter>,
    adaptive: bool,
    last: RwLock<Option<Arc<Tick>>>,
    /// Reservations refused while the gate was closed.
    pub refused: Counter,
}

impl Governor {
    pub fn new(cfg: &Config) -> Arc<Self> {
        Arc::new(Self {
            admission: RwLock::new(Admission::new(cfg.governor.recover_after_ticks)),
            enforce: cfg.governor.admission_control,
            limiter: Limiter::new(cfg.consumer_threads()),
            adaptive: cfg.governor.adaptive_concurrency,
            last: RwLock::new(None),
            refused: Counter::default(),
        })
    }

    /// `Some(reason)` while new reservations must be refused.
    pub fn closed(&self) -> Option<String> {
        if !self.enforce {
            return None;
        }
        match &self
            .admission
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .gate
        {
            Gate::Open => None,
            Gate::Closed { reason, .. } => Some(reason.clone()),
        }
    }

    pub fn admission(&self) -> Admission {
        self.admission
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The gate and the limiter as plain data, for `/v1/stats`.
    pub fn view(&self) -> GovernorView {
        let a = self.admission();
        GovernorView {
            admission_open: a.is_open(),
            admission_reason: match a.gate {
                Gate::Open => None,
                Gate::Closed { reason, .. } => Some(reason),
            },
            admission_trips: a.trips,
            admission_recoveries: a.recoveries,
            admission_refused: self.refused.get(),
            limit: self.limiter.limit(),
            budget: self.limiter.budget(),
        }
    }

    pub fn last(&self) -> Option<Arc<Tick>> {
        self.last.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Applies one tick's advice to the gate; logs every change.
    pub fn observe(&self, advice: &Advice, now_ms: i64) -> Option<Transition> {
        let t = self
            .admission
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .observe(advice, now_ms);
        match &t {
            Some(Transition::Tripped { reason }) => tracing::warn!(
                enforced = self.enforce,
                %reason,
                "admission control tripped: new reservations get 503 ADMISSION_CLOSED (docs/architecture.md §10.8)"
            ),
            Some(Transition::Recovered { closed_for_ms }) => tracing::warn!(
                enforced = self.enforce,
                closed_for_ms,
                "admission control recovered: accepting reservations again"
            ),
            None => {}
        }
        t
    }

    /// One step of the concurrency governor from the consumer's recent figures.
    pub fn adapt(&self, consume: &ConsumeStats) -> u32 {
        if !self.adaptive {
            return self.limiter.limit();
        }
        let s = Signals {
            pool_wait_p95_ms: consume.pool_wait.recent(SIGNAL_WINDOW).p95_ms,
            tx_p99_ms: consume.tx_latency.recent(SIGNAL_WINDOW).p99_ms,
            saturated: self.limiter.take_saturated(),
        };
        let (before, budget) = (self.limiter.limit(), self.limiter.budget());
        let next = concurrency::next_limit(before, budget, s, concurrency::TARGETS);
        if next != before {
            tracing::info!(
                before,
                next,
                budget,
                pool_wait_p95_ms = s.pool_wait_p95_ms,
                tx_p99_ms = s.tx_p99_ms,
                "order consumer concurrency adjusted"
            );
            self.limiter.set_limit(next);
        }
        next
    }

    fn store(&self, tick: Tick) {
        *self.last.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(tick));
    }
}

/// Runs the governor until `cancel`. `fill` adds the engine's own figures
/// to each sample (it is the engine: nothing to fetch over HTTP).
pub fn spawn(
    observer: Observer,
    governor: Arc<Governor>,
    consume: Arc<ConsumeStats>,
    circuit: Arc<crate::pipeline::circuit::SendCircuit>,
    fill: impl Fn() -> crate::domain::stats::StatsView + Send + 'static,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) {
    let every = Duration::from_millis(observer.config().governor.interval_ms.max(100));
    let order_group = crate::mq::Names::new(observer.config().topic_prefix.clone())
        .group(crate::mq::TopicKind::OrderCreate);
    let mut stall = crate::decide::stall::StallWatch::default();
    let mut watch = Watch::new(observer);
    tracker.spawn(async move {
        // The first tick runs at once: `/metrics` and the alerts read the
        // lag, pending and DLQ figures from the start, not one interval in.
        let mut first = true;
        loop {
            if !std::mem::take(&mut first) {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(every) => {}
                }
            }
            governor.adapt(&consume);
            let o = watch.next_with(Some(fill())).await;
            if o.sighted() {
                governor.observe(&o.advice, o.sample.at_ms);
            }
            if let Some(g) = o.sample.groups.iter().find(|g| g.group == order_group) {
                let tick = crate::decide::stall::ConsumerTick {
                    lag_messages: g.lag_messages,
                    consumer_offsets: g.consumer_offsets,
                    inflight: consume.inflight.get(),
                    now_ms: o.sample.at_ms,
                };
                if stall.observe(tick) {
                    tracing::warn!(
                        group = %order_group, lag = g.lag_messages,
                        "order consumer stalled: messages wait, none in hand, offsets still; restarting the consumers"
                    );
                    circuit.restart_consumers();
                }
            }
            governor.store(Tick {
                sample: o.sample,
                advice: o.advice,
                alerts: o.alerts,
            });
        }
        watch.shutdown().await;
    });
}
