//! The docs/architecture.md §11.2 alerts as pure functions of measured values (docs/architecture.md
//! §11). `seckillctl health`, the TUI's alert strip and the daemon's
//! `/metrics` read the same evaluation. Each alert names its runbook.

use crate::decide::backlog::Thresholds;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AlertState {
    /// The source could not be read (e.g. no engine answered): shown, but
    /// it never hides a firing alert and never fires one.
    NoData,
    Ok,
    Warn,
    Critical,
}

impl AlertState {
    pub fn firing(self) -> bool {
        matches!(self, AlertState::Warn | AlertState::Critical)
    }
}

/// Alert thresholds, docs/architecture.md §11.2 defaults; configurable under `[alerts]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertConfig {
    pub pending_oldest_age_s: Thresholds,
    pub consumer_lag_s: Thresholds,
    /// Ratios: 0.001 is 0.1%.
    pub send_unknown_ratio: Thresholds,
    pub ack_failure_ratio: Thresholds,
    /// DLQ: any dead message warns; one dead longer than this is critical.
    pub dlq_unresolved_s: f64,
    pub pool_wait_p95_ms: Thresholds,
    pub order_tx_p99_ms: Thresholds,
    /// "About to expire": `valid_until` within this many seconds.
    pub expiry_horizon_s: f64,
}

impl Default for AlertConfig {
    fn default() -> Self {
        let t = |warn, critical| Thresholds { warn, critical };
        Self {
            pending_oldest_age_s: t(1.0, 3.0),
            consumer_lag_s: t(1.0, 2.5),
            send_unknown_ratio: t(0.001, 0.01),
            ack_failure_ratio: t(0.001, 0.01),
            dlq_unresolved_s: 300.0,
            pool_wait_p95_ms: t(20.0, 100.0),
            order_tx_p99_ms: t(300.0, 1_000.0),
            expiry_horizon_s: 30.0,
        }
    }
}

/// Failures out of a total over the sampling window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Ratio {
    pub bad: u64,
    pub total: u64,
}

impl Ratio {
    pub fn value(self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.bad as f64 / self.total as f64
        }
    }
}

/// Everything the alerts read; `None` where the source was unreadable.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AlertInputs {
    pub pending_oldest_age_s: Option<f64>,
    pub consumer_lag_s: Option<f64>,
    pub send_unknown: Option<Ratio>,
    pub ack_failure: Option<Ratio>,
    pub dlq_dead: Option<u64>,
    pub dlq_oldest_age_s: Option<f64>,
    pub pool_wait_p95_ms: Option<f64>,
    pub order_tx_p99_ms: Option<f64>,
    pub expiring: Option<u64>,
    /// The previous sample's `expiring`, to tell "growing" (critical).
    pub expiring_before: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alert {
    /// The docs/architecture.md §11.1 metric the alert watches.
    pub metric: &'static str,
    pub value: Option<f64>,
    /// The value for people, with its unit.
    pub shown: String,
    pub state: AlertState,
    pub thresholds: String,
    pub runbook: &'static str,
}

/// The worst state among alerts (NoData counts as OK).
pub fn worst(alerts: &[Alert]) -> AlertState {
    alerts
        .iter()
        .map(|a| a.state)
        .filter(|s| *s != AlertState::NoData)
        .max()
        .unwrap_or(AlertState::Ok)
}

fn by(t: &Thresholds, v: f64) -> AlertState {
    if v > t.critical {
        AlertState::Critical
    } else if v > t.warn {
        AlertState::Warn
    } else {
        AlertState::Ok
    }
}

fn alert(
    metric: &'static str,
    runbook: &'static str,
    thresholds: String,
    value: Option<f64>,
    shown: impl Fn(f64) -> String,
    state: impl Fn(f64) -> AlertState,
) -> Alert {
    Alert {
        metric,
        value,
        shown: value.map_or_else(|| "no data".to_owned(), &shown),
        state: value.map_or(AlertState::NoData, state),
        thresholds,
        runbook,
    }
}

pub fn evaluate(c: &AlertConfig, i: &AlertInputs) -> Vec<Alert> {
    let secs = |v: f64| format!("{v:.1} s");
    let ms = |v: f64| format!("{v:.1} ms");
    let pct = |v: f64| format!("{:.3}%", v * 100.0);
    let pct_t = |t: &Thresholds| format!("> {}% / > {}%", t.warn * 100.0, t.critical * 100.0);
    let dlq_state = |dead: f64| match (dead, i.dlq_oldest_age_s) {
        (d, _) if d <= 0.0 => AlertState::Ok,
        (_, Some(age)) if age > c.dlq_unresolved_s => AlertState::Critical,
        _ => AlertState::Warn,
    };
    let expiring_state = |n: f64| match i.expiring_before {
        _ if n <= 0.0 => AlertState::Ok,
        Some(before) if n > before as f64 => AlertState::Critical,
        _ => AlertState::Warn,
    };
    vec![
        alert(
            "reservation_mq_pending_oldest_age_seconds",
            "runbooks/pending-oldest-age.md",
            format!(
                "> {} s / > {} s",
                c.pending_oldest_age_s.warn, c.pending_oldest_age_s.critical
            ),
            i.pending_oldest_age_s,
            secs,
            |v| by(&c.pending_oldest_age_s, v),
        ),
        alert(
            "mq_consumer_lag_seconds",
            "runbooks/consumer-lag.md",
            format!(
                "> {} s / > {} s",
                c.consumer_lag_s.warn, c.consumer_lag_s.critical
            ),
            i.consumer_lag_s,
            secs,
            |v| by(&c.consumer_lag_s, v),
        ),
        alert(
            "mq_publish_unknown_ratio",
            "runbooks/send-unknown.md",
            pct_t(&c.send_unknown_ratio),
            i.send_unknown.map(Ratio::value),
            pct,
            |v| by(&c.send_unknown_ratio, v),
        ),
        alert(
            "mq_ack_failure_ratio",
            "runbooks/ack-failure.md",
            pct_t(&c.ack_failure_ratio),
            i.ack_failure.map(Ratio::value),
            pct,
            |v| by(&c.ack_failure_ratio, v),
        ),
        alert(
            "mq_dlq_messages",
            "runbooks/dlq.md",
            format!("> 0 / unresolved > {} s", c.dlq_unresolved_s),
            i.dlq_dead.map(|d| d as f64),
            |v| match i.dlq_oldest_age_s {
                Some(age) if v > 0.0 => format!("{v} dead, oldest {age:.0} s"),
                _ => format!("{v} dead"),
            },
            dlq_state,
        ),
        alert(
            "pg_pool_wait_seconds_p95",
            "runbooks/pg-pool-wait.md",
            format!(
                "> {} ms / > {} ms",
                c.pool_wait_p95_ms.warn, c.pool_wait_p95_ms.critical
            ),
            i.pool_wait_p95_ms,
            ms,
            |v| by(&c.pool_wait_p95_ms, v),
        ),
        alert(
            "order_tx_latency_seconds_p99",
            "runbooks/order-tx-latency.md",
            format!(
                "> {} ms / > {} ms",
                c.order_tx_p99_ms.warn, c.order_tx_p99_ms.critical
            ),
            i.order_tx_p99_ms,
            ms,
            |v| by(&c.order_tx_p99_ms, v),
        ),
        alert(
            "reservation_expiring_unconsumed",
            "runbooks/expiring-reservations.md",
            format!(
                "> 0 / growing (valid_until within {} s)",
                c.expiry_horizon_s
            ),
            i.expiring.map(|n| n as f64),
            |v| format!("{v}"),
            expiring_state,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(alerts: &[Alert], metric: &str) -> AlertState {
        alerts.iter().find(|a| a.metric == metric).unwrap().state
    }

    #[test]
    fn every_seed_alert_is_evaluated_and_unread_sources_are_no_data() {
        let a = evaluate(&AlertConfig::default(), &AlertInputs::default());
        assert_eq!(a.len(), 8);
        assert!(a.iter().all(|a| a.state == AlertState::NoData));
        assert_eq!(worst(&a), AlertState::Ok);
        assert!(a.iter().all(|a| a.runbook.starts_with("runbooks/")));
    }

    #[test]
    fn the_seed_thresholds() {
        let c = AlertConfig::default();
        let a = evaluate(
            &c,
            &AlertInputs {
                pending_oldest_age_s: Some(3.5),
                consumer_lag_s: Some(1.5),
                send_unknown: Some(Ratio { bad: 1, total: 500 }),
                ack_failure: Some(Ratio { bad: 0, total: 0 }),
                dlq_dead: Some(2),
                dlq_oldest_age_s: Some(400.0),
                pool_wait_p95_ms: Some(20.0),
                order_tx_p99_ms: Some(1_200.0),
                expiring: Some(5),
                expiring_before: Some(5),
            },
        );
        assert_eq!(
            state(&a, "reservation_mq_pending_oldest_age_seconds"),
            AlertState::Critical
        );
        assert_eq!(state(&a, "mq_consumer_lag_seconds"), AlertState::Warn);
        assert_eq!(
            state(&a, "mq_publish_unknown_ratio"),
            AlertState::Warn,
            "0.2%"
        );
        assert_eq!(
            state(&a, "mq_ack_failure_ratio"),
            AlertState::Ok,
            "nothing consumed"
        );
        assert_eq!(
            state(&a, "mq_dlq_messages"),
            AlertState::Critical,
            "unresolved for 400 s"
        );
        assert_eq!(
            state(&a, "pg_pool_wait_seconds_p95"),
            AlertState::Ok,
            "strictly above"
        );
        assert_eq!(
            state(&a, "order_tx_latency_seconds_p99"),
            AlertState::Critical
        );
        assert_eq!(
            state(&a, "reservation_expiring_unconsumed"),
            AlertState::Warn,
            "not growing"
        );
        assert_eq!(worst(&a), AlertState::Critical);
    }

    #[test]
    fn expiring_reservations_that_grow_are_critical() {
        let c = AlertConfig::default();
        let grow = |before, now| {
            state(
                &evaluate(
                    &c,
                    &AlertInputs {
                        expiring: Some(now),
                        expiring_before: before,
                        ..Default::default()
                    },
                ),
                "reservation_expiring_unconsumed",
            )
        };
        assert_eq!(grow(Some(3), 7), AlertState::Critical);
        assert_eq!(grow(Some(9), 7), AlertState::Warn);
        assert_eq!(grow(None, 7), AlertState::Warn);
        assert_eq!(grow(Some(9), 0), AlertState::Ok);
    }

    #[test]
    fn a_fresh_dead_message_warns() {
        let c = AlertConfig::default();
        let a = evaluate(
            &c,
            &AlertInputs {
                dlq_dead: Some(1),
                dlq_oldest_age_s: Some(10.0),
                ..Default::default()
            },
        );
        assert_eq!(state(&a, "mq_dlq_messages"), AlertState::Warn);
    }
}
