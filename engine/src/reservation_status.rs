//! What became of a reservation, for `GET /v1/reservations/{id}`:
//! PostgreSQL's `reservations` row is the final truth (DESIGN.md §4); until
//! it exists, a reservation that Redis still holds is QUEUED.

use crate::ids::ReservationId;
use crate::reservation::{MqStatus, ReservationStore};
use crate::status::ReservationOutcome;
use sqlx::PgPool;

/// `Some("ORDER_CREATED" | "REJECTED_<reason>" | "RELEASED" | "QUEUED" | "SEND_FAILED")`, or `None` if unknown.
pub async fn lookup(
    pool: &PgPool,
    store: &ReservationStore,
    id: &ReservationId,
) -> Result<Option<String>, String> {
    let outcome: Option<ReservationOutcome> =
        sqlx::query_scalar("SELECT outcome FROM reservations WHERE reservation_id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await
            .map_err(|e| e.to_string())?;
    if let Some(o) = outcome {
        return Ok(Some(o.as_str().to_owned()));
    }
    for activity in store.activities().await.map_err(|e| e.to_string())? {
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
