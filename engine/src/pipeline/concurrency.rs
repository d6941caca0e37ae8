//! Adaptive order-consumer concurrency within the PostgreSQL budget
//! (docs/architecture.md §10.7, §10.10): the budget is a hard ceiling, and inside it the
//! limit backs off when the pool queues or transactions slow down, and
//! creeps back up while the work keeps every permit busy.
//!
//! [`next_limit`] is the pure decision; [`Limiter`] is the gate the
//! consumer passes before each transaction.

use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use tokio::sync::Notify;

/// What the governor measured since its last tick.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Signals {
    pub pool_wait_p95_ms: f64,
    pub tx_p99_ms: f64,
    /// Every permit was taken at some point since the last tick: more
    /// concurrency could be used.
    pub saturated: bool,
}

/// When to back off: the docs/architecture.md §11.2 warning levels of the two signals.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Targets {
    pub pool_wait_p95_ms: f64,
    pub tx_p99_ms: f64,
}

pub const TARGETS: Targets = Targets {
    pool_wait_p95_ms: 20.0,
    tx_p99_ms: 300.0,
};

/// Additive increase, multiplicative decrease, clamped to `1..=budget`.
/// Backing off wins over growing: a queueing pool means more workers only
/// add lock and WAL waits (docs/architecture.md §10.7).
pub fn next_limit(current: u32, budget: u32, s: Signals, t: Targets) -> u32 {
    let budget = budget.max(1);
    let next = if s.pool_wait_p95_ms > t.pool_wait_p95_ms || s.tx_p99_ms > t.tx_p99_ms {
        current.saturating_mul(3) / 4
    } else if s.saturated {
        current.saturating_add(1)
    } else {
        current
    };
    next.clamp(1, budget)
}

/// A resizable gate: at most `limit` holders at once.
#[derive(Debug)]
pub struct Limiter {
    budget: u32,
    limit: AtomicU32,
    held: AtomicU32,
    /// Set when a holder found every permit taken (cleared by the governor).
    saturated: std::sync::atomic::AtomicBool,
    freed: Notify,
}

/// Held while a transaction runs; gives the permit back on drop.
#[derive(Debug)]
pub struct Permit(Arc<Limiter>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_one();
    }
}

impl Limiter {
    /// Starts at the full budget: the governor only ever lowers it on evidence.
    pub fn new(budget: u32) -> Arc<Self> {
        let budget = budget.max(1);
        Arc::new(Self {
            budget,
            limit: AtomicU32::new(budget),
            held: AtomicU32::new(0),
            saturated: false.into(),
            freed: Notify::new(),
        })
    }

    pub fn budget(&self) -> u32 {
        self.budget
    }

    pub fn limit(&self) -> u32 {
        self.limit.load(Ordering::Acquire)
    }

    pub fn held(&self) -> u32 {
        self.held.load(Ordering::Acquire)
    }

    /// Sets the limit (clamped to the budget); waiters recheck at once.
    pub fn set_limit(&self, limit: u32) {
        self.limit
            .store(limit.clamp(1, self.budget), Ordering::Release);
        self.freed.notify_waiters();
    }

    /// Whether every permit was in use since the last call; resets it.
    pub fn take_saturated(&self) -> bool {
        self.saturated.swap(false, Ordering::AcqRel)
    }

    fn try_take(&self) -> bool {
        let limit = self.limit();
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                (h < limit).then_some(h + 1)
            })
            .map(|h| {
                if h + 1 >= limit {
                    self.saturated.store(true, Ordering::Release);
                }
            })
            .is_ok()
    }

    pub async fn acquire(self: &Arc<Self>) -> Permit {
        loop {
            // Register for a wake-up before checking, so a release between
            // the check and the wait is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.try_take() {
                return Permit(self.clone());
            }
            self.saturated.store(true, Ordering::Release);
            freed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(wait: f64, tx: f64, saturated: bool) -> Signals {
        Signals {
            pool_wait_p95_ms: wait,
            tx_p99_ms: tx,
            saturated,
        }
    }

    #[test]
    fn backs_off_on_a_queueing_pool_or_slow_transactions() {
        assert_eq!(next_limit(8, 8, sig(25.0, 10.0, true), TARGETS), 6);
        assert_eq!(next_limit(8, 8, sig(1.0, 400.0, false), TARGETS), 6);
        assert_eq!(
            next_limit(1, 8, sig(500.0, 5_000.0, true), TARGETS),
            1,
            "never zero"
        );
    }

    #[test]
    fn grows_by_one_while_busy_and_never_past_the_budget() {
        assert_eq!(next_limit(4, 8, sig(1.0, 10.0, true), TARGETS), 5);
        assert_eq!(next_limit(8, 8, sig(1.0, 10.0, true), TARGETS), 8);
        assert_eq!(
            next_limit(4, 8, sig(1.0, 10.0, false), TARGETS),
            4,
            "idle: hold"
        );
        assert_eq!(
            next_limit(20, 8, sig(1.0, 10.0, false), TARGETS),
            8,
            "clamped"
        );
    }

    #[tokio::test]
    async fn the_gate_holds_at_most_the_limit_and_wakes_on_release() {
        let l = Limiter::new(4);
        l.set_limit(2);
        let a = l.acquire().await;
        let _b = l.acquire().await;
        assert_eq!(l.held(), 2);
        assert!(l.take_saturated());
        let waiter = {
            let l = l.clone();
            tokio::spawn(async move { l.acquire().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a third holder must wait");
        drop(a);
        let _c = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken by the release")
            .unwrap();
        assert_eq!(l.held(), 2);
        l.set_limit(100);
        assert_eq!(l.limit(), 4, "never above the budget");
    }
}
