//! Ingress: one reservation request from validated ids to a Redis
//! reservation and an offer to the publisher (docs/architecture.md §2, §4).
//! The HTTP handler in `daemon::http` parses the request and maps a
//! [`Refusal`] to a status code; everything between lives here.

use crate::domain::ids::{ActivityId, MessageId, OrderId, RequestId, ReservationId, SkuId, UserId};
use crate::domain::trace::TraceId;
use crate::pipeline::publish::{Publisher, order_message};
use crate::pipeline::trail;
use crate::reservation::{
    Reservation, ReservationError, ReservationStore, ReserveOutcome, ReserveRequest, Sale,
};
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::RwLock;

/// How long the ingress trusts what it read of an activity: an `activity
/// end` reaches every engine's ingress within this (docs/architecture.md
/// §16.3), at the cost of one PostgreSQL read per activity per period.
pub const FACTS_FRESH: Duration = Duration::from_secs(5);

/// Why a reservation request got no reservation. Each has a stable code
/// (the HTTP `error` field) and a reason for people.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("activity {0} does not exist")]
    UnknownActivity(ActivityId),
    #[error("{0}")]
    DatabaseUnavailable(#[from] sqlx::Error),
    #[error("validity window overflows")]
    BadActivityConfig(ActivityId),
    #[error("this request_id already belongs to another user or sku")]
    RequestIdConflict,
    #[error("no stock left")]
    SoldOut,
    #[error("this user already holds a reservation in this activity")]
    DuplicateUser,
    #[error("sku {sku} has no stock seeded in activity {activity}")]
    UnknownSku { activity: ActivityId, sku: SkuId },
    #[error("{0}")]
    RedisUnavailable(#[from] ReservationError),
    /// Redis lost the activity's state (docs/architecture.md §4.5): admitting
    /// against what is left could oversell, so the sale waits for a restore.
    #[error("{0}")]
    RedisStateLost(String),
    /// `seckillctl activity end` closed the sale (docs/architecture.md §16.3).
    #[error("activity {0} has ended; no new reservations are taken")]
    ActivityEnded(ActivityId),
}

impl Refusal {
    /// The machine-readable code clients branch on.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::UnknownActivity(_) => "UNKNOWN_ACTIVITY",
            Refusal::DatabaseUnavailable(_) => "DATABASE_UNAVAILABLE",
            Refusal::BadActivityConfig(_) => "BAD_ACTIVITY_CONFIG",
            Refusal::RequestIdConflict => "REQUEST_ID_CONFLICT",
            Refusal::SoldOut => "SOLD_OUT",
            Refusal::DuplicateUser => "DUPLICATE_USER",
            Refusal::UnknownSku { .. } => "UNKNOWN_SKU",
            Refusal::RedisUnavailable(_) => "REDIS_UNAVAILABLE",
            Refusal::RedisStateLost(_) => "REDIS_STATE_LOST",
            Refusal::ActivityEnded(_) => "ACTIVITY_ENDED",
        }
    }
}

/// What the ingress knows of an activity from PostgreSQL, read again
/// once it is [`FACTS_FRESH`] old.
#[derive(Debug, Clone, Copy)]
struct ActivityFacts {
    valid_for_ms: i64,
    /// It has a Redis epoch (docs/architecture.md §4.5): a missing epoch
    /// key then means lost state, not an activity never seeded.
    seeded: bool,
    /// When the sale ends, in ms since the Unix epoch, once `activity end`
    /// set it (docs/architecture.md §16.3).
    ends_at_ms: Option<i64>,
    read_at: Instant,
}

impl ActivityFacts {
    /// Pure: whether the sale is still open at `now_ms`.
    fn sale(&self, now_ms: i64) -> Sale {
        match self.ends_at_ms {
            Some(end) if end <= now_ms => Sale::Ended,
            _ => Sale::Open,
        }
    }
}

/// The activities whose Redis state the watcher found lost or stale, with
/// the words for the client; shared by the watcher (writer) and the
/// ingress (reader).
pub type LostStates = Arc<std::sync::RwLock<HashMap<ActivityId, String>>>;

/// Reservations this process accepted, per activity, since it started
/// (flushed to `ingress_tallies`, docs/architecture.md §4.5).
pub type Tally = Arc<std::sync::Mutex<HashMap<ActivityId, i64>>>;

/// A request the HTTP layer has already parsed and validated.
#[derive(Debug, Clone)]
pub struct ReserveCall {
    pub activity: ActivityId,
    pub sku: SkuId,
    pub user: UserId,
    pub request_id: RequestId,
    /// The trace of a valid incoming `traceparent`; else the reservation
    /// traces by its own id (docs/architecture.md §11.5).
    pub trace: Option<TraceId>,
}

#[derive(Clone)]
pub struct Ingress {
    store: ReservationStore,
    pool: PgPool,
    publisher: Publisher,
    /// Activity facts, read from PostgreSQL and again once stale.
    activities: Arc<RwLock<HashMap<ActivityId, ActivityFacts>>>,
    /// Activities whose facts one request is reading again; the others
    /// go on with what is known (one read per activity per period, not
    /// one per request).
    refreshing: Arc<std::sync::Mutex<HashSet<ActivityId>>>,
    first_retry_after_ms: i64,
    lost: LostStates,
    tally: Tally,
}

impl Ingress {
    pub fn new(
        store: ReservationStore,
        pool: PgPool,
        publisher: Publisher,
        first_retry_after_ms: i64,
    ) -> Self {
        Self {
            store,
            pool,
            publisher,
            activities: Default::default(),
            refreshing: Default::default(),
            first_retry_after_ms,
            lost: Default::default(),
            tally: Default::default(),
        }
    }

    /// The map the Redis state watcher fills.
    pub fn lost_states(&self) -> LostStates {
        self.lost.clone()
    }

    pub fn tally(&self) -> Tally {
        self.tally.clone()
    }

    fn refused_for_lost_state(&self, activity: ActivityId) -> Option<Refusal> {
        let lost = self.lost.read().unwrap_or_else(|e| e.into_inner());
        lost.get(&activity).cloned().map(Refusal::RedisStateLost)
    }

    fn count_accepted(&self, activity: ActivityId) {
        let mut tally = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        *tally.entry(activity).or_default() += 1;
    }

    /// Reserves one unit, or says why not. A new reservation is offered to
    /// the publisher; if its queue is full the scanner sends it, so nothing
    /// is lost (§6). The same `request_id` returns the same reservation.
    pub async fn reserve(&self, call: ReserveCall) -> Result<Reservation, Refusal> {
        let started = std::time::Instant::now();
        let (activity, sku, user) = (call.activity, call.sku, call.user);
        let result = self.take(call).await;
        match &result {
            Ok(r) => trail::queued(r, started.elapsed()),
            Err(refusal) => trail::refused(activity.0, sku.0, user.0, refusal.code()),
        }
        result
    }

    async fn take(&self, call: ReserveCall) -> Result<Reservation, Refusal> {
        let facts = self
            .facts(call.activity, false)
            .await?
            .ok_or(Refusal::UnknownActivity(call.activity))?;
        if let Some(refusal) = self.refused_for_lost_state(call.activity) {
            return Err(refusal);
        }
        let valid_for = facts.valid_for_ms;
        let now = chrono::Utc::now().timestamp_millis();
        let sale = facts.sale(now);
        let valid_until_ms = now
            .checked_add(valid_for)
            .ok_or(Refusal::BadActivityConfig(call.activity))?;
        // The message_id is fixed here, before the reservation, and never
        // changes (docs/architecture.md §3).
        let reservation_id = ReservationId::generate();
        let req = ReserveRequest {
            activity_id: call.activity,
            sku_id: call.sku,
            user_id: call.user,
            request_id: call.request_id,
            trace_id: call
                .trace
                .unwrap_or_else(|| TraceId::of_reservation(&reservation_id)),
            reservation_id,
            message_id: MessageId::generate(),
            order_id: OrderId::generate(),
            now_ms: now,
            valid_until_ms,
        };
        match self
            .store
            .reserve_in(&req, now + self.first_retry_after_ms, sale)
            .await?
        {
            ReserveOutcome::Reserved(r) => {
                self.count_accepted(call.activity);
                self.publisher.offer(order_message(&r));
                Ok(r)
            }
            // The same request_id must mean the same request: another user
            // or SKU reusing it is told so, never handed someone else's
            // reservation.
            ReserveOutcome::Existing(r) if r.user_id != req.user_id || r.sku_id != req.sku_id => {
                Err(Refusal::RequestIdConflict)
            }
            ReserveOutcome::Existing(r) => Ok(r),
            ReserveOutcome::SoldOut => Err(Refusal::SoldOut),
            ReserveOutcome::DuplicateUser => Err(Refusal::DuplicateUser),
            ReserveOutcome::NotSeeded => Err(Refusal::UnknownSku {
                activity: call.activity,
                sku: call.sku,
            }),
            ReserveOutcome::NoEpoch => Err(self.no_epoch(call.activity, call.sku).await?),
            ReserveOutcome::Ended => Err(Refusal::ActivityEnded(call.activity)),
        }
    }

    /// The epoch key is gone. PostgreSQL says whether the activity was
    /// ever seeded: if so, Redis lost its state and the sale fails closed
    /// until a restore; if not, the SKU was never seeded. A cached "not
    /// seeded" is read again, since a seed may have come since.
    async fn no_epoch(&self, activity: ActivityId, sku: SkuId) -> Result<Refusal, Refusal> {
        let seeded = match self.facts(activity, false).await? {
            Some(f) if f.seeded => true,
            _ => self.facts(activity, true).await?.is_some_and(|f| f.seeded),
        };
        if seeded {
            return Ok(Refusal::RedisStateLost(format!(
                "Redis lost activity {a}'s state (its epoch key is gone), so no reservation can be admitted against it; retry later. On-call: `seckillctl activity restore --activity {a} --reason \"...\"` rebuilds it from PostgreSQL",
                a = activity
            )));
        }
        Ok(Refusal::UnknownSku { activity, sku })
    }

    async fn facts(
        &self,
        activity: ActivityId,
        fresh: bool,
    ) -> Result<Option<ActivityFacts>, sqlx::Error> {
        let known = self.activities.read().await.get(&activity).copied();
        let refresh = match known {
            None => None,
            Some(_) if fresh => None,
            Some(k) if k.read_at.elapsed() < FACTS_FRESH => return Ok(Some(k)),
            Some(k) => match Refreshing::claim(&self.refreshing, activity) {
                Some(claim) => Some((k, claim)),
                // Another request is reading them: go on with what is known.
                None => return Ok(Some(k)),
            },
        };
        let read = self.read_facts(activity).await;
        match (read, refresh) {
            (Ok(facts), _) => {
                if let Some(f) = facts {
                    self.activities.write().await.insert(activity, f);
                }
                Ok(facts)
            }
            // A stale read that failed keeps the sale going on what was
            // known: PostgreSQL being away must not stop Redis admission
            // (docs/architecture.md §10.9); the next request tries again.
            (Err(e), Some((known, _claim))) => {
                tracing::debug!(activity = activity.0, error = %e, "re-reading activity facts failed");
                Ok(Some(known))
            }
            (Err(e), None) => Err(e),
        }
    }

    async fn read_facts(&self, activity: ActivityId) -> Result<Option<ActivityFacts>, sqlx::Error> {
        let row: Option<(i64, bool, Option<i64>)> = sqlx::query_as(
            "SELECT valid_for_ms, EXISTS (SELECT 1 FROM redis_epochs e WHERE e.activity_id = a.activity_id),
                    (extract(epoch FROM ends_at) * 1000)::int8
             FROM activities a WHERE activity_id = $1",
        )
        .bind(activity)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(valid_for_ms, seeded, ends_at_ms)| ActivityFacts {
            valid_for_ms,
            seeded,
            ends_at_ms,
            read_at: Instant::now(),
        }))
    }
}

/// One request's claim to re-read an activity's facts, given back on drop
/// (also when the read fails or the request is cancelled).
struct Refreshing<'a> {
    set: &'a std::sync::Mutex<HashSet<ActivityId>>,
    activity: ActivityId,
}

impl<'a> Refreshing<'a> {
    fn claim(set: &'a std::sync::Mutex<HashSet<ActivityId>>, activity: ActivityId) -> Option<Self> {
        let won = set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(activity);
        // Built only once the claim is won and the lock let go: a
        // `Refreshing` made and dropped under the lock (`then_some` builds
        // it either way) would lock again, and give back another
        // request's claim.
        won.then(|| Refreshing { set, activity })
    }
}

impl Drop for Refreshing<'_> {
    fn drop(&mut self) {
        let mut held = self.set.lock().unwrap_or_else(|e| e.into_inner());
        held.remove(&self.activity);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(ends_at_ms: Option<i64>) -> ActivityFacts {
        ActivityFacts {
            valid_for_ms: 1_000,
            seeded: true,
            ends_at_ms,
            read_at: Instant::now(),
        }
    }

    #[test]
    fn a_sale_is_open_until_its_end() {
        assert_eq!(facts(None).sale(i64::MAX), Sale::Open);
        assert_eq!(facts(Some(1_000)).sale(999), Sale::Open);
        assert_eq!(facts(Some(1_000)).sale(1_000), Sale::Ended);
        assert_eq!(facts(Some(1_000)).sale(5_000), Sale::Ended);
    }

    #[test]
    fn one_claim_per_activity_until_dropped() {
        let set = std::sync::Mutex::new(HashSet::new());
        let a = Refreshing::claim(&set, ActivityId(1)).expect("first claim");
        assert!(Refreshing::claim(&set, ActivityId(1)).is_none());
        assert!(Refreshing::claim(&set, ActivityId(2)).is_some());
        drop(a);
        assert!(Refreshing::claim(&set, ActivityId(1)).is_some());
    }
}
