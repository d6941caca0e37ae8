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
    /// Live activities whose Redis state is lost or stale, as
    /// "activity 1 (LOST)" (docs/architecture.md §4.5); `None` unread.
    pub redis_state_lost: Option<Vec<String>>,
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

/// How one rule turns its value into a state, and how it shows the value
/// and its thresholds to people.
#[derive(Clone, Copy)]
enum Judge {
    /// Strictly above the configured warn / critical (docs/architecture.md §11.2).
    Above(fn(&AlertConfig) -> &Thresholds, Unit),
    /// Any dead message warns; one unresolved past `dlq_unresolved_s` is
    /// critical.
    Dlq,
    /// Any expiring reservation warns; more than in the previous sample is
    /// critical.
    Expiring,
    /// Any at all is critical: the sale of that activity is stopped.
    AnyCritical,
}

/// The unit a [`Judge::Above`] value and its thresholds are shown in.
#[derive(Clone, Copy)]
enum Unit {
    Seconds,
    Millis,
    /// A ratio (0.001) shown as a percentage (0.100%).
    Percent,
}

/// One alert of docs/architecture.md §11.2: the metric it watches, its
/// runbook, where its value comes from, and how that value is judged.
struct Rule {
    metric: &'static str,
    runbook: &'static str,
    /// `None` when the source was unreadable: the alert shows "no data".
    read: fn(&AlertInputs) -> Option<f64>,
    judge: Judge,
}

/// The alerts, in the order every surface lists them (the §11.2 table's).
const RULES: [Rule; 9] = [
    Rule {
        metric: "reservation_mq_pending_oldest_age_seconds",
        runbook: "runbooks/pending-oldest-age.md",
        read: |i| i.pending_oldest_age_s,
        judge: Judge::Above(|c| &c.pending_oldest_age_s, Unit::Seconds),
    },
    Rule {
        metric: "mq_consumer_lag_seconds",
        runbook: "runbooks/consumer-lag.md",
        read: |i| i.consumer_lag_s,
        judge: Judge::Above(|c| &c.consumer_lag_s, Unit::Seconds),
    },
    Rule {
        metric: "mq_publish_unknown_ratio",
        runbook: "runbooks/send-unknown.md",
        read: |i| i.send_unknown.map(Ratio::value),
        judge: Judge::Above(|c| &c.send_unknown_ratio, Unit::Percent),
    },
    Rule {
        metric: "mq_ack_failure_ratio",
        runbook: "runbooks/ack-failure.md",
        read: |i| i.ack_failure.map(Ratio::value),
        judge: Judge::Above(|c| &c.ack_failure_ratio, Unit::Percent),
    },
    Rule {
        metric: "mq_dlq_messages",
        runbook: "runbooks/dlq.md",
        read: |i| i.dlq_dead.map(|d| d as f64),
        judge: Judge::Dlq,
    },
    Rule {
        metric: "pg_pool_wait_seconds_p95",
        runbook: "runbooks/pg-pool-wait.md",
        read: |i| i.pool_wait_p95_ms,
        judge: Judge::Above(|c| &c.pool_wait_p95_ms, Unit::Millis),
    },
    Rule {
        metric: "order_tx_latency_seconds_p99",
        runbook: "runbooks/order-tx-latency.md",
        read: |i| i.order_tx_p99_ms,
        judge: Judge::Above(|c| &c.order_tx_p99_ms, Unit::Millis),
    },
    Rule {
        metric: "reservation_expiring_unconsumed",
        runbook: "runbooks/expiring-reservations.md",
        read: |i| i.expiring.map(|n| n as f64),
        judge: Judge::Expiring,
    },
    Rule {
        metric: "redis_state_lost",
        runbook: "runbooks/redis_state_lost.md",
        read: |i| i.redis_state_lost.as_ref().map(|v| v.len() as f64),
        judge: Judge::AnyCritical,
    },
];

impl Unit {
    /// A value as people read it: "1.5 s", "20.0 ms", "0.200%".
    fn show(self, v: f64) -> String {
        match self {
            Unit::Seconds => format!("{v:.1} s"),
            Unit::Millis => format!("{v:.1} ms"),
            Unit::Percent => format!("{:.3}%", v * 100.0),
        }
    }

    /// Thresholds as people read them: "> 1 s / > 3 s", "> 0.1% / > 1%".
    fn show_thresholds(self, t: &Thresholds) -> String {
        match self {
            Unit::Seconds => format!("> {} s / > {} s", t.warn, t.critical),
            Unit::Millis => format!("> {} ms / > {} ms", t.warn, t.critical),
            Unit::Percent => format!("> {}% / > {}%", t.warn * 100.0, t.critical * 100.0),
        }
    }
}

impl Judge {
    fn thresholds(self, c: &AlertConfig) -> String {
        match self {
            Judge::Above(limits, unit) => unit.show_thresholds(limits(c)),
            Judge::Dlq => format!("> 0 / unresolved > {} s", c.dlq_unresolved_s),
            Judge::Expiring => format!(
                "> 0 / growing (valid_until within {} s)",
                c.expiry_horizon_s
            ),
            Judge::AnyCritical => "- / > 0".to_owned(),
        }
    }

    fn shown(self, v: f64, i: &AlertInputs) -> String {
        match self {
            Judge::Above(_, unit) => unit.show(v),
            Judge::Dlq => match i.dlq_oldest_age_s {
                Some(age) if v > 0.0 => format!("{v} dead, oldest {age:.0} s"),
                _ => format!("{v} dead"),
            },
            Judge::Expiring => format!("{v}"),
            Judge::AnyCritical => match &i.redis_state_lost {
                Some(lost) if !lost.is_empty() => lost.join(", "),
                _ => format!("{v}"),
            },
        }
    }

    fn state(self, v: f64, c: &AlertConfig, i: &AlertInputs) -> AlertState {
        match self {
            Judge::Above(limits, _) => by(limits(c), v),
            Judge::Dlq => match (v, i.dlq_oldest_age_s) {
                (d, _) if d <= 0.0 => AlertState::Ok,
                (_, Some(age)) if age > c.dlq_unresolved_s => AlertState::Critical,
                _ => AlertState::Warn,
            },
            Judge::Expiring => match i.expiring_before {
                _ if v <= 0.0 => AlertState::Ok,
                Some(before) if v > before as f64 => AlertState::Critical,
                _ => AlertState::Warn,
            },
            Judge::AnyCritical if v > 0.0 => AlertState::Critical,
            Judge::AnyCritical => AlertState::Ok,
        }
    }
}

/// Every alert of docs/architecture.md §11.2, in [`RULES`] order. An
/// unreadable source gives NoData, which never fires and never hides one.
pub fn evaluate(c: &AlertConfig, i: &AlertInputs) -> Vec<Alert> {
    RULES
        .iter()
        .map(|r| {
            alert(
                r.metric,
                r.runbook,
                r.judge.thresholds(c),
                (r.read)(i),
                |v| r.judge.shown(v, i),
                |v| r.judge.state(v, c, i),
            )
        })
        .collect()
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
        assert_eq!(a.len(), 9);
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
                redis_state_lost: Some(vec!["activity 7 (LOST)".into()]),
            },
        );
        assert_eq!(state(&a, "redis_state_lost"), AlertState::Critical);
        let lost = a.iter().find(|a| a.metric == "redis_state_lost").unwrap();
        assert_eq!(lost.shown, "activity 7 (LOST)");
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
