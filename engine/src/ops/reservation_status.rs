//! What became of a reservation, for `GET /v1/reservations/{id}`: the
//! query projection first (docs/architecture.md §8.7: ORDER_CREATED, PAID or CANCELED as
//! the order events said), then PostgreSQL's `reservations` row, the final
//! truth of the reservation (docs/architecture.md §4); until either exists, a
//! reservation that Redis still holds is QUEUED.

use crate::domain::ids::{ActivityId, ReservationId};
use crate::domain::status::{OrderStatus, ReservationOutcome};
use crate::reservation::{MqStatus, ReservationError, ReservationStore};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::fmt;

/// The status the API shows for a reservation. It serializes to the
/// strings the HTTP API has always returned (clients and tests compare
/// them), one per source: the projection (ORDER_CREATED, PAID, CANCELED),
/// PostgreSQL's outcome (ORDER_CREATED, REJECTED_<reason>, RELEASED), or
/// Redis while neither has spoken (QUEUED, SEND_FAILED, RELEASED).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReservationStatus {
    /// Reserved in Redis; the order is on its way.
    Queued,
    /// The send failed for certain; the stock goes back (§6.6).
    SendFailed,
    /// An order exists (CREATED or PAYING).
    OrderCreated,
    Paid,
    Canceled,
    RejectedNoStock,
    RejectedDuplicate,
    RejectedExpired,
    /// The stock and the buyer slot were given back.
    Released,
    /// Redis lost it before it was sent, with the rest of its activity's
    /// state (docs/architecture.md §4.5): no order will be created; try again.
    Lost,
}

impl ReservationStatus {
    pub const ALL: [ReservationStatus; 10] = [
        ReservationStatus::Queued,
        ReservationStatus::SendFailed,
        ReservationStatus::OrderCreated,
        ReservationStatus::Paid,
        ReservationStatus::Canceled,
        ReservationStatus::RejectedNoStock,
        ReservationStatus::RejectedDuplicate,
        ReservationStatus::RejectedExpired,
        ReservationStatus::Released,
        ReservationStatus::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReservationStatus::Queued => "QUEUED",
            ReservationStatus::SendFailed => "SEND_FAILED",
            ReservationStatus::OrderCreated => "ORDER_CREATED",
            ReservationStatus::Paid => "PAID",
            ReservationStatus::Canceled => "CANCELED",
            ReservationStatus::RejectedNoStock => "REJECTED_NO_STOCK",
            ReservationStatus::RejectedDuplicate => "REJECTED_DUPLICATE",
            ReservationStatus::RejectedExpired => "REJECTED_EXPIRED",
            ReservationStatus::Released => "RELEASED",
            ReservationStatus::Lost => "LOST",
        }
    }
}

impl fmt::Display for ReservationStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// PostgreSQL's final word on the reservation (§4): shown as it is.
impl From<ReservationOutcome> for ReservationStatus {
    fn from(o: ReservationOutcome) -> Self {
        match o {
            ReservationOutcome::OrderCreated => ReservationStatus::OrderCreated,
            ReservationOutcome::RejectedNoStock => ReservationStatus::RejectedNoStock,
            ReservationOutcome::RejectedDuplicate => ReservationStatus::RejectedDuplicate,
            ReservationOutcome::RejectedExpired => ReservationStatus::RejectedExpired,
            ReservationOutcome::Released => ReservationStatus::Released,
        }
    }
}

/// The status shown for a projected order (pure): a buyer sees an order
/// being paid as created until the payment lands (§8.4).
pub fn view_status(status: OrderStatus) -> ReservationStatus {
    match status {
        OrderStatus::Created | OrderStatus::Paying => ReservationStatus::OrderCreated,
        OrderStatus::Paid => ReservationStatus::Paid,
        OrderStatus::Canceled => ReservationStatus::Canceled,
    }
}

/// The status of a reservation only Redis knows of (pure): anything not
/// yet failed or released is still on its way.
pub fn queued_status(mq: MqStatus) -> ReservationStatus {
    match mq {
        MqStatus::SendFailed => ReservationStatus::SendFailed,
        MqStatus::Released => ReservationStatus::Released,
        MqStatus::MqPending | MqStatus::Sending | MqStatus::MqSent => ReservationStatus::Queued,
    }
}

/// Why the status could not be read; the HTTP API answers 503 with this
/// text, as it always did (the store's own message).
#[derive(Debug, thiserror::Error)]
pub enum ReservationStatusError {
    /// Redis (the projection or the reservation hash) did not answer.
    #[error(transparent)]
    Redis(#[from] ReservationError),
    /// PostgreSQL did not answer.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The reservation's status, or `None` if no store knows it. One that
/// neither store knows but that was made before a restore of its
/// activity's Redis state is `LOST`: a definite answer, where "unknown"
/// would leave the client waiting for an order that will never come.
pub async fn lookup(
    pool: &PgPool,
    store: &ReservationStore,
    id: &ReservationId,
) -> Result<Option<ReservationStatus>, ReservationStatusError> {
    let activities = store.activities().await?;
    for activity in &activities {
        if let Some(v) = store.order_view(*activity, id).await? {
            return Ok(Some(view_status(v.status)));
        }
    }
    let outcome: Option<(ReservationOutcome, ActivityId)> =
        sqlx::query_as("SELECT outcome, activity_id FROM reservations WHERE reservation_id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?;
    if let Some((o, activity)) = outcome {
        // A retired activity left the set above (docs/architecture.md
        // §16.3), but its order's projection outlives it.
        if !activities.contains(&activity)
            && let Some(v) = store.order_view(activity, id).await?
        {
            return Ok(Some(view_status(v.status)));
        }
        return Ok(Some(o.into()));
    }
    for activity in activities {
        if let Some(r) = store.get(activity, id).await? {
            return Ok(Some(queued_status(r.mq_status)));
        }
    }
    if crate::ops::redis_state::lost_before_restore(pool, id).await? {
        return Ok(Some(ReservationStatus::Lost));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_serializes_to_the_string_the_api_always_returned() {
        for s in ReservationStatus::ALL {
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
            assert_eq!(
                serde_json::from_str::<ReservationStatus>(&format!("\"{s}\"")).unwrap(),
                s
            );
        }
        // PostgreSQL's outcome was shown by its label.
        for o in ReservationOutcome::ALL {
            assert_eq!(ReservationStatus::from(*o).as_str(), o.as_str());
        }
    }

    #[test]
    fn projected_orders_and_redis_states_map_as_before() {
        assert_eq!(view_status(OrderStatus::Paying).as_str(), "ORDER_CREATED");
        assert_eq!(view_status(OrderStatus::Paid).as_str(), "PAID");
        assert_eq!(view_status(OrderStatus::Canceled).as_str(), "CANCELED");
        assert_eq!(queued_status(MqStatus::SendFailed).as_str(), "SEND_FAILED");
        assert_eq!(queued_status(MqStatus::Released).as_str(), "RELEASED");
        assert_eq!(queued_status(MqStatus::MqSent).as_str(), "QUEUED");
    }
}
