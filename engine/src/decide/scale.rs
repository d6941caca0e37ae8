//! Scaling advice (docs/architecture.md §10): the docs/architecture.md §10.8 decision table
//! as a pure function of measured inputs, with the docs/architecture.md §10.7 budget
//! arithmetic. `seckillctl scale advise` shows it; the daemon's admission
//! control applies its last row.

use crate::decide::backlog::{Drain, LAG_SECONDS};
use serde::Serialize;

/// What the table reads. Every field is a measurement or a setting; `None`
/// means the source could not be read, and the advice says so.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScaleInputs {
    /// The worst order-path lag (seconds of the oldest unconsumed message).
    pub lag_seconds: f64,
    /// Backlog growth, messages per second (positive: growing).
    pub lag_growth_per_s: f64,
    pub drain: Drain,
    /// Seconds until the oldest unconsumed reservation's `valid_until`.
    pub seconds_to_oldest_expiry: Option<f64>,
    /// Unconsumed reservations due to expire within the horizon.
    pub expiring: u64,
    /// How close `valid_until` must be before a backlog that does not drain
    /// at current rates counts as "near expiry" (`[alerts] expiry_horizon_s`).
    pub near_horizon_s: f64,
    pub pool_wait_p95_ms: Option<f64>,
    pub tx_p99_ms: Option<f64>,
    /// Share of active server backends waiting on WAL or data-file I/O.
    pub io_wait_share: Option<f64>,
    /// Server backends waiting on a lock, and the oldest open transaction:
    /// a stuck transaction is invisible to the p99 until it ends.
    pub lock_waiters: Option<i64>,
    pub longest_tx_s: Option<f64>,
    /// Seconds since the broker (re)started, when it reports it.
    pub broker_uptime_s: Option<f64>,
    pub budget: BudgetInputs,
}

/// docs/architecture.md §10.7: safe PostgreSQL concurrency × order share / instances.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BudgetInputs {
    /// Order transactions PostgreSQL sustains (a load-test figure).
    pub safe_pg_concurrency: u32,
    /// The share left to order creation (the rest: pay, query, compensation, ops).
    pub order_share: f64,
    pub instances: u32,
    /// What each instance runs now.
    pub threads_per_instance: u32,
    /// The live engines' PostgreSQL pools, added up (their `[pg]
    /// max_connections`), when they answered.
    #[serde(default)]
    pub pools_max: Option<u32>,
    /// The server's `max_connections`, when read.
    #[serde(default)]
    pub server_max_connections: Option<i64>,
}

/// Whether every live engine's pool, full, fits in the server's connection
/// limit with room left for the console, payments and superusers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PoolFit {
    pub pools_max: u32,
    pub server_max_connections: i64,
    /// What the engines may take: [`POOLS_SHARE`] of the server's limit.
    pub allowed: u32,
    pub fits: bool,
}

/// The share of `max_connections` the engines' pools may add up to.
pub const POOLS_SHARE: f64 = 0.9;

pub fn pool_fit(b: &BudgetInputs) -> Option<PoolFit> {
    let (pools_max, server) = (b.pools_max?, b.server_max_connections?);
    let allowed = (server.max(0) as f64 * POOLS_SHARE).floor() as u32;
    Some(PoolFit {
        pools_max,
        server_max_connections: server,
        allowed,
        fits: pools_max <= allowed,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Budget {
    pub order_budget: u32,
    pub per_instance: u32,
}

pub fn budget(b: &BudgetInputs) -> Budget {
    let order_budget =
        (b.safe_pg_concurrency as f64 * b.order_share.clamp(0.0, 1.0)).floor() as u32;
    Budget {
        order_budget,
        per_instance: (order_budget / b.instances.max(1)).max(1),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LagState {
    Low,
    High,
    /// High and climbing right after the broker came back (docs/architecture.md §10.8 row 5).
    Spike,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PgState {
    Healthy,
    /// Consumers queue for connections (pool wait p95 past its warning).
    PoolExhausted,
    /// Backends wait on WAL or disk.
    IoSaturated,
    /// Transactions slow (p99 past its warning), or stuck behind a lock
    /// for longer than the transaction critical, without either of the above.
    Busy,
}

impl PgState {
    pub fn has_headroom(self) -> bool {
        self == PgState::Healthy
    }
}

/// The rows of docs/architecture.md §10.8, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Action {
    /// Row 1: lag high, PostgreSQL healthy.
    ScaleOutConsumers,
    /// Row 2: lag high, pool exhausted (or busy): do not add consumers.
    ReduceConcurrency,
    /// Row 3: lag high, WAL or disk saturated.
    ThrottleIngress,
    /// Row 4: lag low, PostgreSQL under pressure.
    ScaleInOrSmallerBatches,
    /// Row 5: lag spike right after a broker recovery.
    RampSlowly,
    /// Row 6: lag high, reservations near expiry, no PostgreSQL headroom.
    FailClosed,
    /// No row applies: lag low and PostgreSQL healthy.
    Hold,
}

impl Action {
    /// The docs/architecture.md §10.8 row number; 0 for [`Action::Hold`].
    pub fn row(self) -> u8 {
        match self {
            Action::ScaleOutConsumers => 1,
            Action::ReduceConcurrency => 2,
            Action::ThrottleIngress => 3,
            Action::ScaleInOrSmallerBatches => 4,
            Action::RampSlowly => 5,
            Action::FailClosed => 6,
            Action::Hold => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Advice {
    pub lag: LagState,
    pub pg: PgState,
    pub near_expiry: bool,
    pub action: Action,
    pub row: u8,
    pub why: String,
    /// The concrete step, with the budget numbers.
    pub step: String,
    pub budget: Budget,
    /// The live engines' pools against the server's connection limit.
    pub pools: Option<PoolFit>,
}

/// Pool wait p95 and transaction p99 warnings of docs/architecture.md §11.2.
pub const POOL_WAIT_WARN_MS: f64 = 20.0;
pub const TX_P99_WARN_MS: f64 = 300.0;
/// Above this share of active backends on WAL/disk waits, I/O is the limit.
pub const IO_WAIT_SATURATED: f64 = 0.5;
/// A broker younger than this counts as "just recovered".
pub const BROKER_RECOVERY_S: f64 = 300.0;
/// Lock waiters behind a transaction open longer than this (docs/architecture.md
/// §11.2 transaction critical) mean the order path is stuck.
pub const STUCK_TX_S: f64 = 1.0;

pub fn classify_pg(i: &ScaleInputs) -> PgState {
    if i.pool_wait_p95_ms.is_some_and(|w| w > POOL_WAIT_WARN_MS) {
        PgState::PoolExhausted
    } else if i.io_wait_share.is_some_and(|s| s > IO_WAIT_SATURATED) {
        PgState::IoSaturated
    } else if i.tx_p99_ms.is_some_and(|t| t > TX_P99_WARN_MS)
        || (i.lock_waiters.is_some_and(|w| w > 0) && i.longest_tx_s.is_some_and(|t| t > STUCK_TX_S))
    {
        PgState::Busy
    } else {
        PgState::Healthy
    }
}

pub fn classify_lag(i: &ScaleInputs) -> LagState {
    let high = i.lag_seconds > LAG_SECONDS.warn;
    let just_recovered = i.broker_uptime_s.is_some_and(|u| u < BROKER_RECOVERY_S);
    if high && just_recovered && i.lag_growth_per_s > 0.0 {
        LagState::Spike
    } else if high {
        LagState::High
    } else {
        LagState::Low
    }
}

/// The backlog will not be consumed before reservations expire (docs/architecture.md
/// §10.5): the oldest reservation has less time left than the current
/// lag, or the backlog drains after its `valid_until`, or it does not
/// drain at current rates and that `valid_until` is within the horizon.
/// "Never" alone is not enough: during any burst production outpaces
/// consumption for a moment, and a 5-minute validity is not at risk then.
/// A short validity alone is not "near expiry" either (the `expiring`
/// alert covers that).
pub fn near_expiry(i: &ScaleInputs) -> bool {
    match (i.drain, i.seconds_to_oldest_expiry) {
        (_, Some(left)) if left < i.lag_seconds => true,
        (Drain::Never, Some(left)) => left < i.near_horizon_s,
        (Drain::In(s), Some(left)) => s > left,
        _ => false,
    }
}

pub fn advise(i: &ScaleInputs) -> Advice {
    let (lag, pg, near) = (classify_lag(i), classify_pg(i), near_expiry(i));
    let b = budget(&i.budget);
    let per = b.per_instance;
    let now = i.budget.threads_per_instance;
    let (action, why, step) = match (lag, pg) {
        (LagState::High | LagState::Spike, pg) if near && !pg.has_headroom() => (
            Action::FailClosed,
            format!("lag is high, reservations expire before the backlog drains, and PostgreSQL is {pg:?}"),
            "stop new reservations (the daemon answers 503 ADMISSION_CLOSED); reject-and-compensate what will expire; do not extend validity (docs/architecture.md §10.6)".to_owned(),
        ),
        (LagState::Spike, _) => (
            Action::RampSlowly,
            "lag jumped right after the broker came back".to_owned(),
            format!("keep consumers at {now} per instance and raise one step at a time toward {per}; avoid a recovery flood"),
        ),
        (LagState::High, PgState::PoolExhausted) => (
            Action::ReduceConcurrency,
            "lag is high but consumers already queue for PostgreSQL connections".to_owned(),
            format!("do not add consumers; lower per-instance concurrency from {now} toward {} (budget {} / {} instances = {per})", per.min(now.saturating_sub(1).max(1)), b.order_budget, i.budget.instances.max(1)),
        ),
        (LagState::High, PgState::Busy) => (
            Action::ReduceConcurrency,
            "lag is high and order transactions are slow (lock or CPU pressure)".to_owned(),
            format!("do not add consumers; lower per-instance concurrency from {now}; more workers only add lock waits"),
        ),
        (LagState::High, PgState::IoSaturated) => (
            Action::ThrottleIngress,
            "lag is high and PostgreSQL waits on WAL or disk".to_owned(),
            "throttle ingress (lower the offered rate); optimize or scale the database (WAL, disk); consumers will not help".to_owned(),
        ),
        (LagState::High, PgState::Healthy) => (
            Action::ScaleOutConsumers,
            "lag is high and PostgreSQL has headroom".to_owned(),
            if now < per {
                format!("raise per-instance concurrency from {now} to {per} (budget {} = {} x {:.0}% / {} instances)", b.order_budget, i.budget.safe_pg_concurrency, i.budget.order_share * 100.0, i.budget.instances.max(1))
            } else {
                format!("add consumer instances; keep each at or below {per} so the total stays within the order budget {}", b.order_budget)
            },
        ),
        (LagState::Low, pg) if !pg.has_headroom() => (
            Action::ScaleInOrSmallerBatches,
            format!("lag is low but PostgreSQL is {pg:?}"),
            "scale consumers in or lower the pull batch; leave PostgreSQL room for pay and query".to_owned(),
        ),
        (LagState::Low, _) => (
            Action::Hold,
            "lag is low and PostgreSQL has headroom".to_owned(),
            "nothing to do".to_owned(),
        ),
    };
    Advice {
        lag,
        pg,
        near_expiry: near,
        row: action.row(),
        action,
        why,
        step,
        budget: b,
        pools: pool_fit(&i.budget),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_pools_must_fit_the_servers_limit() {
        let mut b = BudgetInputs {
            safe_pg_concurrency: 100,
            order_share: 0.7,
            instances: 3,
            threads_per_instance: 8,
            pools_max: None,
            server_max_connections: Some(100),
        };
        assert_eq!(pool_fit(&b), None, "unmeasured pools say nothing");
        b.pools_max = Some(3 * 30);
        let fit = pool_fit(&b).unwrap();
        assert_eq!((fit.allowed, fit.fits), (90, true));
        b.pools_max = Some(4 * 30);
        assert!(
            !pool_fit(&b).unwrap().fits,
            "a fourth engine of 30 does not fit in 100"
        );
    }

    fn calm() -> ScaleInputs {
        ScaleInputs {
            lag_seconds: 0.2,
            lag_growth_per_s: 0.0,
            drain: Drain::Empty,
            seconds_to_oldest_expiry: None,
            expiring: 0,
            near_horizon_s: 30.0,
            pool_wait_p95_ms: Some(1.0),
            tx_p99_ms: Some(20.0),
            io_wait_share: Some(0.0),
            lock_waiters: Some(0),
            longest_tx_s: Some(0.05),
            broker_uptime_s: Some(86_400.0),
            budget: BudgetInputs {
                safe_pg_concurrency: 240,
                order_share: 0.7,
                instances: 12,
                threads_per_instance: 8,
                pools_max: None,
                server_max_connections: None,
            },
        }
    }

    fn lagging() -> ScaleInputs {
        ScaleInputs {
            lag_seconds: 2.0,
            lag_growth_per_s: 500.0,
            drain: Drain::In(4.0),
            seconds_to_oldest_expiry: Some(240.0),
            ..calm()
        }
    }

    #[test]
    fn the_seed_budget_168_over_12_is_14() {
        let b = budget(&calm().budget);
        assert_eq!(
            b,
            Budget {
                order_budget: 168,
                per_instance: 14
            }
        );
    }

    #[test]
    fn row_1_lag_high_pg_healthy_scales_out() {
        let a = advise(&lagging());
        assert_eq!(
            (a.action, a.row, a.pg),
            (Action::ScaleOutConsumers, 1, PgState::Healthy)
        );
        assert!(a.step.contains("from 8 to 14"), "{}", a.step);
        let mut full = lagging();
        full.budget.threads_per_instance = 14;
        assert!(advise(&full).step.contains("add consumer instances"));
    }

    #[test]
    fn row_2_lag_high_pool_exhausted_reduces_concurrency() {
        let mut i = lagging();
        i.pool_wait_p95_ms = Some(150.0);
        let a = advise(&i);
        assert_eq!(
            (a.action, a.row, a.pg),
            (Action::ReduceConcurrency, 2, PgState::PoolExhausted)
        );
        i.pool_wait_p95_ms = Some(2.0);
        i.tx_p99_ms = Some(900.0);
        assert_eq!(
            advise(&i).action,
            Action::ReduceConcurrency,
            "slow transactions too"
        );
        i.tx_p99_ms = Some(20.0);
        i.lock_waiters = Some(3);
        i.longest_tx_s = Some(4.0);
        assert_eq!(classify_pg(&i), PgState::Busy, "stuck behind a lock");
        i.longest_tx_s = Some(0.2);
        assert_eq!(
            classify_pg(&i),
            PgState::Healthy,
            "brief lock waits are normal"
        );
    }

    #[test]
    fn row_3_lag_high_wal_saturated_throttles_ingress() {
        let mut i = lagging();
        i.io_wait_share = Some(0.8);
        let a = advise(&i);
        assert_eq!(
            (a.action, a.row, a.pg),
            (Action::ThrottleIngress, 3, PgState::IoSaturated)
        );
    }

    #[test]
    fn row_4_lag_low_pg_pressured_scales_in() {
        let mut i = calm();
        i.tx_p99_ms = Some(700.0);
        let a = advise(&i);
        assert_eq!(
            (a.action, a.row, a.lag),
            (Action::ScaleInOrSmallerBatches, 4, LagState::Low)
        );
    }

    #[test]
    fn row_5_spike_after_broker_recovery_ramps_slowly() {
        let mut i = lagging();
        i.broker_uptime_s = Some(40.0);
        let a = advise(&i);
        assert_eq!(
            (a.action, a.row, a.lag),
            (Action::RampSlowly, 5, LagState::Spike)
        );
        i.lag_growth_per_s = -100.0;
        assert_eq!(
            classify_lag(&i),
            LagState::High,
            "a shrinking backlog is no spike"
        );
    }

    #[test]
    fn row_6_near_expiry_without_headroom_fails_closed() {
        let mut i = lagging();
        i.pool_wait_p95_ms = Some(150.0);
        i.drain = Drain::Never;
        // Not draining, but 240 s of validity left: a burst, not a shutdown.
        assert!(!near_expiry(&i));
        assert_eq!(advise(&i).action, Action::ReduceConcurrency);
        i.seconds_to_oldest_expiry = Some(20.0);
        let a = advise(&i);
        assert_eq!((a.action, a.row), (Action::FailClosed, 6));
        assert!(a.near_expiry);
        // Less time left than the lag counts too, even when the drain looks fine.
        let mut j = lagging();
        j.io_wait_share = Some(0.9);
        j.seconds_to_oldest_expiry = Some(1.5);
        assert_eq!(advise(&j).action, Action::FailClosed);
        // A short validity alone (expiring soon, but the backlog drains first) is not.
        let mut short = lagging();
        short.io_wait_share = Some(0.9);
        short.expiring = 3;
        assert_eq!(advise(&short).action, Action::ThrottleIngress);
        // With headroom the same backlog is a scale-out, not a shutdown.
        let mut k = lagging();
        k.drain = Drain::Never;
        assert_eq!(advise(&k).action, Action::ScaleOutConsumers);
    }

    #[test]
    fn lag_low_and_healthy_holds() {
        let a = advise(&calm());
        assert_eq!((a.action, a.row), (Action::Hold, 0));
        let mut unknown = calm();
        unknown.pool_wait_p95_ms = None;
        unknown.tx_p99_ms = None;
        unknown.io_wait_share = None;
        unknown.lock_waiters = None;
        unknown.longest_tx_s = None;
        assert_eq!(
            advise(&unknown).pg,
            PgState::Healthy,
            "unmeasured is not pressure"
        );
    }
}
