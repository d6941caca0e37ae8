//! Ingress: one reservation request from validated ids to a Redis
//! reservation and an offer to the publisher (docs/architecture.md §2, §4).
//! The HTTP handler in `daemon::http` parses the request and maps a
//! [`Refusal`] to a status code; everything between lives here.

use crate::domain::ids::{ActivityId, MessageId, OrderId, RequestId, ReservationId, SkuId, UserId};
use crate::domain::message::TraceContext;
use crate::pipeline::publish::{Publisher, order_message};
use crate::reservation::{
    Reservation, ReservationError, ReservationStore, ReserveOutcome, ReserveRequest,
};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::RwLock;

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
        }
    }
}

/// A request the HTTP layer has already parsed and validated.
#[derive(Debug, Clone)]
pub struct ReserveCall {
    pub activity: ActivityId,
    pub sku: SkuId,
    pub user: UserId,
    pub request_id: RequestId,
}

#[derive(Clone)]
pub struct Ingress {
    store: ReservationStore,
    pool: PgPool,
    publisher: Publisher,
    /// Activity validity windows, read from PostgreSQL once per activity.
    activities: Arc<RwLock<HashMap<ActivityId, i64>>>,
    first_retry_after_ms: i64,
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
            first_retry_after_ms,
        }
    }

    /// Reserves one unit, or says why not. A new reservation is offered to
    /// the publisher; if its queue is full the scanner sends it, so nothing
    /// is lost (§6). The same `request_id` returns the same reservation.
    pub async fn reserve(&self, call: ReserveCall) -> Result<Reservation, Refusal> {
        let valid_for = self
            .valid_for_ms(call.activity)
            .await?
            .ok_or(Refusal::UnknownActivity(call.activity))?;
        let now = chrono::Utc::now().timestamp_millis();
        let valid_until_ms = now
            .checked_add(valid_for)
            .ok_or(Refusal::BadActivityConfig(call.activity))?;
        // The message_id is fixed here, before the reservation, and never
        // changes (docs/architecture.md §3).
        let req = ReserveRequest {
            activity_id: call.activity,
            sku_id: call.sku,
            user_id: call.user,
            request_id: call.request_id,
            reservation_id: ReservationId::generate(),
            message_id: MessageId::generate(),
            order_id: OrderId::generate(),
            now_ms: now,
            valid_until_ms,
        };
        match self
            .store
            .reserve(&req, now + self.first_retry_after_ms)
            .await?
        {
            ReserveOutcome::Reserved(r) => {
                self.publisher
                    .offer(order_message(&r, TraceContext::generate()));
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
        }
    }

    async fn valid_for_ms(&self, activity: ActivityId) -> Result<Option<i64>, sqlx::Error> {
        if let Some(v) = self.activities.read().await.get(&activity) {
            return Ok(Some(*v));
        }
        let v: Option<i64> =
            sqlx::query_scalar("SELECT valid_for_ms FROM activities WHERE activity_id = $1")
                .bind(activity)
                .fetch_optional(&self.pool)
                .await?;
        if let Some(v) = v {
            self.activities.write().await.insert(activity, v);
        }
        Ok(v)
    }
}
