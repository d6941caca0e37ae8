//! What became of a reservation, for `GET /v1/reservations/{id}`: the
//! query projection first (docs/architecture.md §8.7: ORDER_CREATED, PAID or CANCELED as
//! the order events said), then PostgreSQL's `reservations` row, the final
//! truth of the reservation (docs/architecture.md §4); until either exists, a
//! reservation that Redis still holds is QUEUED.

use crate::domain::ids::ReservationId;
use crate::domain::status::{OrderStatus, ReservationOutcome};
use crate::reservation::{MqStatus, ReservationStore};
use sqlx::PgPool;

/// The status shown for a projected order.
pub fn view_status(status: OrderStatus) -> &'static str {
    match status {
        OrderStatus::Created | OrderStatus::Paying => "ORDER_CREATED",
        OrderStatus::Paid => "PAID",
        OrderStatus::Canceled => "CANCELED",
    }
}

/// `Some("ORDER_CREATED" | "PAID" | "CANCELED" | "REJECTED_<reason>" | "RELEASED" | "QUEUED" | "SEND_FAILED")`, or `None` if unknown.
pub async fn lookup(
    pool: &PgPool,
    store: &ReservationStore,
    id: &ReservationId,
) -> Result<Option<String>, String> {
    let activities = store.activities().await.map_err(|e| e.to_string())?;
    for activity in &activities {
        if let Some(v) = store
            .order_view(*activity, id)
            .await
            .map_err(|e| e.to_string())?
        {
            return Ok(Some(view_status(v.status).to_owned()));
        }
    }
    let outcome: Option<ReservationOutcome> =
        sqlx::query_scalar("SELECT outcome FROM reservations WHERE reservation_id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await
            .map_err(|e| e.to_string())?;
    if let Some(o) = outcome {
        return Ok(Some(o.as_str().to_owned()));
    }
    for activity in activities {
        if let Some(r) = store.get(activity, id).await.map_err(|e| e.to_string())? {
            return Ok(Some(
                match r.mq_status {
                    MqStatus::SendFailed => "SEND_FAILED",
                    MqStatus::Released => "RELEASED",
                    _ => "QUEUED",
                }
                .to_owned(),
            ));
        }
    }
    Ok(None)
}
