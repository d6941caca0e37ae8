//! Backlog arithmetic (docs/architecture.md §10) and the lag verdict of
//! §11.2, as pure functions of measured rates. The `backlog` command and the
//! TUI feed them measurements; the math is tested on the worked examples of
//! §10.1–§10.3.

use serde::Serialize;

/// When the backlog clears.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(
    tag = "drain",
    content = "seconds",
    rename_all = "SCREAMING_SNAKE_CASE"
)]
pub enum Drain {
    /// Nothing waiting.
    Empty,
    /// Clears in this many seconds at the current rates.
    In(f64),
    /// Consumption does not outpace production: it only grows.
    Never,
}

/// How fast the backlog grows (negative: shrinks), messages per second.
pub fn growth(produce_per_s: f64, consume_per_s: f64) -> f64 {
    produce_per_s - consume_per_s
}

/// The backlog a burst leaves: growth × duration, never negative.
pub fn peak_after_burst(produce_per_s: f64, consume_per_s: f64, burst_s: f64) -> f64 {
    (growth(produce_per_s, consume_per_s) * burst_s).max(0.0)
}

/// docs/architecture.md §10.2: backlog / (consume − produce), defined only while
/// consumption outpaces production.
pub fn drain(backlog: f64, consume_per_s: f64, produce_per_s: f64) -> Drain {
    if backlog <= 0.0 {
        return Drain::Empty;
    }
    let net = consume_per_s - produce_per_s;
    if net <= 0.0 || !net.is_finite() {
        Drain::Never
    } else {
        Drain::In(backlog / net)
    }
}

/// docs/architecture.md §10.3: when the last order of the backlog is created, from the
/// drain time, the order transaction's p99 and the MQ/network budget.
pub fn last_order_after(drain: Drain, tx_p99_s: f64, budget_s: f64) -> Option<f64> {
    match drain {
        Drain::Empty => Some(tx_p99_s + budget_s),
        Drain::In(s) => Some(s + tx_p99_s + budget_s),
        Drain::Never => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Level {
    Ok,
    Warn,
    Critical,
}

/// Warning and critical thresholds of one metric (docs/architecture.md §11.2 defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct Thresholds {
    pub warn: f64,
    pub critical: f64,
}

/// `mq_consumer_lag_seconds`: warning above 1 s, critical above 2.5 s.
pub const LAG_SECONDS: Thresholds = Thresholds {
    warn: 1.0,
    critical: 2.5,
};

/// `reservation_mq_pending_oldest_age`: warning above 1 s, critical above 3 s.
pub const PENDING_OLDEST_AGE: Thresholds = Thresholds {
    warn: 1.0,
    critical: 3.0,
};

impl Thresholds {
    /// Strictly above a threshold trips it, as docs/architecture.md §11.2 writes "> 1 s".
    pub fn level(&self, value: f64) -> Level {
        if value > self.critical {
            Level::Critical
        } else if value > self.warn {
            Level::Warn
        } else {
            Level::Ok
        }
    }
}

/// The backlog verdict: the lag threshold, raised to CRITICAL when the
/// backlog will never clear, or will not clear before the oldest pending
/// reservation's `valid_until` (docs/architecture.md §4.4).
pub fn verdict(lag_seconds: f64, drain: Drain, seconds_to_oldest_expiry: Option<f64>) -> Level {
    let by_lag = LAG_SECONDS.level(lag_seconds);
    let doomed = match (drain, seconds_to_oldest_expiry) {
        (Drain::Never, _) => true,
        (Drain::In(s), Some(left)) => s > left,
        _ => false,
    };
    if doomed { Level::Critical } else { by_lag }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_burst_leaves_8000_and_clears_in_2_seconds() {
        // docs/architecture.md §10.1: 20,000/s produced against 4,000/s consumed for 0.5 s.
        assert_eq!(growth(20_000.0, 4_000.0), 16_000.0);
        let peak = peak_after_burst(20_000.0, 4_000.0, 0.5);
        assert_eq!(peak, 8_000.0);
        // Production then stops: 8,000 / 4,000.
        assert_eq!(drain(peak, 4_000.0, 0.0), Drain::In(2.0));
        // docs/architecture.md §10.3: 2 s + 0.1 s transaction p99 + 0.5 s budget = 2.6 s, inside the 3 s SLO.
        let last = last_order_after(Drain::In(2.0), 0.1, 0.5).unwrap();
        assert!((last - 2.6).abs() < 1e-9);
    }

    #[test]
    fn six_thousand_against_four_thousand_never_clears() {
        assert_eq!(growth(6_000.0, 4_000.0), 2_000.0);
        assert_eq!(drain(8_000.0, 4_000.0, 6_000.0), Drain::Never);
        assert_eq!(
            drain(8_000.0, 4_000.0, 4_000.0),
            Drain::Never,
            "equal rates never clear either"
        );
        assert_eq!(last_order_after(Drain::Never, 0.1, 0.5), None);
        assert_eq!(drain(0.0, 4_000.0, 6_000.0), Drain::Empty);
        assert_eq!(peak_after_burst(1_000.0, 4_000.0, 3.0), 0.0);
    }

    #[test]
    fn thresholds_trip_strictly_above() {
        assert_eq!(LAG_SECONDS.level(1.0), Level::Ok);
        assert_eq!(LAG_SECONDS.level(1.01), Level::Warn);
        assert_eq!(LAG_SECONDS.level(2.5), Level::Warn);
        assert_eq!(LAG_SECONDS.level(2.51), Level::Critical);
        assert_eq!(PENDING_OLDEST_AGE.level(3.5), Level::Critical);
    }

    #[test]
    fn a_backlog_that_outlives_its_reservations_is_critical_whatever_the_lag() {
        assert_eq!(verdict(0.5, Drain::In(2.0), Some(300.0)), Level::Ok);
        assert_eq!(verdict(1.5, Drain::In(2.0), Some(300.0)), Level::Warn);
        assert_eq!(verdict(0.5, Drain::In(20.0), Some(10.0)), Level::Critical);
        assert_eq!(verdict(0.5, Drain::Never, None), Level::Critical);
        assert_eq!(verdict(3.0, Drain::Empty, None), Level::Critical);
    }
}
