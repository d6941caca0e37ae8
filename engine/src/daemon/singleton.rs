//! Elected singletons on this daemon (docs/architecture.md §14.4): one task
//! takes or renews every role's lease each `[registry] heartbeat_ms`, and
//! the loops that must run on one daemon only (the DLQ mirror, the sweeps,
//! the webhook) ask [`Elected::holds`] before each pass.
//!
//! A lease is trusted locally until the moment the renewal was *sent* plus
//! a share of the TTL, on this process's monotonic clock. The database set
//! its expiry from a later instant, so this daemon stops believing it holds
//! a role before anyone else may take it, also after a pause (a frozen
//! process, a GC-like stall) that outlived the lease: on thaw its deadline
//! has passed and it waits for a fresh renewal. A pass already running
//! when the lease lapses finishes; the jobs are idempotent (the mirror
//! re-reads a copy to no effect, the sweeps' updates are conditional, the
//! webhook is at-least-once), so a short overlap costs work, not
//! correctness.

use crate::domain::singleton::Singleton;
use crate::store::leases;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use std::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The share of the TTL a renewal is trusted for locally.
const TRUST: f64 = 0.8;

/// Which roles this daemon holds, and until when it may act on them.
#[derive(Debug, Clone, Default)]
pub struct Elected {
    until: Arc<Mutex<HashMap<Singleton, Instant>>>,
    stopping: CancellationToken,
}

impl Elected {
    /// Whether a pass of `role` may start now.
    pub fn holds(&self, role: Singleton) -> bool {
        self.holds_at(role, Instant::now())
    }

    fn holds_at(&self, role: Singleton, now: Instant) -> bool {
        !self.stopping.is_cancelled() && self.lock().get(&role).is_some_and(|until| *until > now)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Singleton, Instant>> {
        self.until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records one renewal's answer; true when the role changed hands here.
    fn record(
        &self,
        role: Singleton,
        sent: Instant,
        ttl: Duration,
        held: bool,
        now: Instant,
    ) -> Option<bool> {
        let mut until = self.lock();
        let had = until.get(&role).is_some_and(|u| *u > now);
        if held {
            until.insert(role, sent + ttl.mul_f64(TRUST));
        } else {
            until.remove(&role);
        }
        (had != held).then_some(held)
    }
}

/// Takes and renews every role's lease for `me` until `cancel`, then gives
/// them back so another daemon takes over at once. The first round runs
/// before this returns, so a lone daemon's loops find their roles held.
pub(super) async fn spawn(
    pool: PgPool,
    me: String,
    every: Duration,
    ttl: Duration,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) -> Elected {
    let elected = Elected {
        until: Arc::default(),
        stopping: cancel.clone(),
    };
    round(&pool, &me, ttl, &elected).await;
    let e = elected.clone();
    tracker.spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
            round(&pool, &me, ttl, &e).await;
        }
        match leases::release_all(&pool, &me).await {
            Ok(n) if n > 0 => tracing::info!(roles = n, "gave the singleton leases back"),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not give the singleton leases back; they lapse on their own")
            }
        }
    });
    elected
}

/// One try at every role. A failed try (PostgreSQL away) changes nothing:
/// a held role lapses on its own local deadline.
async fn round(pool: &PgPool, me: &str, ttl: Duration, elected: &Elected) {
    for role in Singleton::ALL {
        let sent = Instant::now();
        match leases::hold(pool, role, me, ttl).await {
            Ok(held) => match elected.record(role, sent, ttl, held, Instant::now()) {
                Some(true) => {
                    tracing::info!(role = %role, "this daemon now runs the {role} singleton")
                }
                Some(false) => {
                    tracing::warn!(role = %role, "another daemon holds the {role} singleton now")
                }
                None => {}
            },
            Err(e) => tracing::warn!(role = %role, error = %e, "could not renew the {role} lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_trusted_for_a_share_of_its_ttl_from_when_it_was_asked() {
        let e = Elected::default();
        let ttl = Duration::from_secs(5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(!e.holds_at(Singleton::Sweeps, t0));
        assert_eq!(
            e.record(Singleton::Sweeps, t0, ttl, true, at(5)),
            Some(true)
        );
        assert!(e.holds_at(Singleton::Sweeps, at(10)));
        assert!(!e.holds_at(Singleton::DlqMirror, at(10)));
        // A renewal that keeps it is no change.
        assert_eq!(
            e.record(Singleton::Sweeps, at(1_000), ttl, true, at(1_005)),
            None
        );
        // A pause past the trusted share of the last renewal: no new pass.
        assert!(e.holds_at(Singleton::Sweeps, at(4_999)));
        assert!(!e.holds_at(Singleton::Sweeps, at(5_001)));
        // Renewed after the pause: it counts as taken again.
        assert_eq!(
            e.record(Singleton::Sweeps, at(9_000), ttl, true, at(9_010)),
            Some(true)
        );
        assert!(e.holds_at(Singleton::Sweeps, at(9_010)));
        // Another daemon took it.
        assert_eq!(
            e.record(Singleton::Sweeps, at(10_000), ttl, false, at(10_010)),
            Some(false)
        );
        assert!(!e.holds_at(Singleton::Sweeps, at(10_010)));
    }

    #[test]
    fn a_stopping_daemon_starts_no_pass() {
        let e = Elected::default();
        let now = Instant::now();
        e.record(Singleton::Webhook, now, Duration::from_secs(5), true, now);
        assert!(e.holds_at(Singleton::Webhook, now));
        e.stopping.cancel();
        assert!(!e.holds_at(Singleton::Webhook, now));
    }
}
