//! Admission control (docs/architecture.md §10, §10.8 last row): when the
//! backlog threatens reservations' validity and PostgreSQL has no headroom,
//! new reservations are refused with 503 rather than accepted to expire.
//!
//! [`Admission::observe`] is a pure state machine fed once per governor
//! tick with the docs/architecture.md §10.8 advice. It trips on the first FAIL_CLOSED and
//! recovers only after `recover_after` clear ticks in a row, so a flapping
//! signal does not open and shut ingress every second.

use crate::decide::scale::{Action, Advice};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Gate {
    Open,
    Closed { reason: String, since_ms: i64 },
}

/// A change of the gate, for the log and the counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Tripped { reason: String },
    Recovered { closed_for_ms: i64 },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Admission {
    pub gate: Gate,
    pub trips: u64,
    pub recoveries: u64,
    clear_ticks: u32,
    recover_after: u32,
}

impl Admission {
    pub fn new(recover_after: u32) -> Self {
        Self {
            gate: Gate::Open,
            trips: 0,
            recoveries: 0,
            clear_ticks: 0,
            recover_after: recover_after.max(1),
        }
    }

    pub fn is_open(&self) -> bool {
        self.gate == Gate::Open
    }

    pub fn observe(&mut self, advice: &Advice, now_ms: i64) -> Option<Transition> {
        let fail_closed = advice.action == Action::FailClosed;
        match &self.gate {
            Gate::Open if fail_closed => {
                let reason = format!("{}: {}", advice.why, advice.step);
                self.gate = Gate::Closed {
                    reason: advice.why.clone(),
                    since_ms: now_ms,
                };
                self.trips += 1;
                self.clear_ticks = 0;
                Some(Transition::Tripped { reason })
            }
            Gate::Open => None,
            Gate::Closed { .. } if fail_closed => {
                self.clear_ticks = 0;
                None
            }
            Gate::Closed { since_ms, .. } => {
                self.clear_ticks += 1;
                if self.clear_ticks < self.recover_after {
                    return None;
                }
                let closed_for_ms = now_ms - since_ms;
                self.gate = Gate::Open;
                self.recoveries += 1;
                self.clear_ticks = 0;
                Some(Transition::Recovered { closed_for_ms })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::backlog::Drain;
    use crate::decide::scale::{BudgetInputs, ScaleInputs, advise};

    fn inputs(lag_s: f64, pool_wait_ms: f64, drain: Drain) -> ScaleInputs {
        ScaleInputs {
            lag_seconds: lag_s,
            lag_growth_per_s: 0.0,
            drain,
            seconds_to_oldest_expiry: Some(10.0),
            expiring: 0,
            near_horizon_s: 30.0,
            pool_wait_p95_ms: Some(pool_wait_ms),
            tx_p99_ms: Some(50.0),
            io_wait_share: Some(0.0),
            lock_waiters: Some(0),
            longest_tx_s: Some(0.0),
            broker_uptime_s: None,
            budget: BudgetInputs {
                safe_pg_concurrency: 16,
                order_share: 0.5,
                instances: 1,
                threads_per_instance: 8,
                pools_max: None,
                server_max_connections: None,
            },
        }
    }

    #[test]
    fn trips_when_the_thresholds_are_crossed_and_recovers_after_clear_ticks() {
        let mut a = Admission::new(3);
        let healthy = advise(&inputs(0.1, 1.0, Drain::Empty));
        let doomed = advise(&inputs(5.0, 200.0, Drain::In(60.0)));
        assert_eq!(a.observe(&healthy, 0), None);
        assert!(a.is_open());

        let t = a.observe(&doomed, 1_000);
        assert!(matches!(t, Some(Transition::Tripped { .. })), "{t:?}");
        assert!(!a.is_open());
        assert_eq!(a.trips, 1);

        // Two clear ticks are not enough; a relapse resets the count.
        assert_eq!(a.observe(&healthy, 2_000), None);
        assert_eq!(a.observe(&healthy, 3_000), None);
        assert_eq!(a.observe(&doomed, 4_000), None);
        assert_eq!(a.observe(&healthy, 5_000), None);
        assert_eq!(a.observe(&healthy, 6_000), None);
        assert!(!a.is_open());
        assert_eq!(
            a.observe(&healthy, 7_000),
            Some(Transition::Recovered {
                closed_for_ms: 6_000
            })
        );
        assert!(a.is_open());
        assert_eq!((a.trips, a.recoveries), (1, 1));
    }

    #[test]
    fn lag_alone_or_pressure_alone_never_trips() {
        let mut a = Admission::new(1);
        // Lag high and doomed, but PostgreSQL has headroom: scale out instead.
        assert_eq!(a.observe(&advise(&inputs(5.0, 1.0, Drain::Never)), 0), None);
        // PostgreSQL exhausted, but lag low.
        assert_eq!(
            a.observe(&advise(&inputs(0.2, 500.0, Drain::Empty)), 0),
            None
        );
        assert!(a.is_open());
    }
}
