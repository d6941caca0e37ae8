//! The outbox payloads of the order lifecycle, besides the seed §19.1
//! cancel message ([`crate::message::CancelOrderIfUnpaid`]): order events
//! (created, paid, canceled) and the compensation. Their readers (the query
//! projection and the compensation consumer) deserialize these same types.

use crate::ids::{ActivityId, MessageId, OrderId, ReservationId, SkuId, UserId};
use crate::status::{CompensationSource, OrderStatus};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub const ORDER_CREATED_EVENT: &str = "ORDER_CREATED";
pub const ORDER_PAID_EVENT: &str = "ORDER_PAID";
pub const ORDER_CANCELED_EVENT: &str = "ORDER_CANCELED";
pub const RELEASE_RESERVATION_EVENT: &str = "RELEASE_RESERVATION";

/// Tag of the delayed cancel on the ORDER_TIMEOUT topic (DESIGN.md §3).
pub const TAG_CANCEL_IF_UNPAID: &str = "CANCEL_IF_UNPAID";
/// Tags of the order events on the ORDER_EVENT topic: the event type itself.
pub const TAG_ORDER_CREATED: &str = ORDER_CREATED_EVENT;
pub const TAG_ORDER_PAID: &str = ORDER_PAID_EVENT;
pub const TAG_ORDER_CANCELED: &str = ORDER_CANCELED_EVENT;
/// Tag of the compensation on the INVENTORY_COMPENSATE topic.
pub const TAG_RELEASE_RESERVATION: &str = "RELEASE_RESERVATION";

/// `ORDER_CREATED`, `ORDER_PAID` or `ORDER_CANCELED` on the ORDER_EVENT
/// topic, keyed by `order_id`. `status` and `aggregate_version` are the
/// order's right after the change; the projection drops events whose
/// version is not newer than what it holds (seed §18.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderEvent {
    pub schema_version: u32,
    pub event_type: String,
    pub message_id: MessageId,
    pub order_id: OrderId,
    pub reservation_id: ReservationId,
    pub activity_id: ActivityId,
    pub sku_id: SkuId,
    pub user_id: UserId,
    pub status: OrderStatus,
    pub aggregate_version: i64,
    pub occurred_at: DateTime<Utc>,
}

/// `RELEASE_RESERVATION` on the INVENTORY_COMPENSATE topic, keyed by
/// `reservation_id`: give the Redis reservation back, once (DESIGN.md §8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseReservation {
    pub schema_version: u32,
    pub event_type: String,
    pub message_id: MessageId,
    pub reservation_id: ReservationId,
    pub activity_id: ActivityId,
    pub sku_id: SkuId,
    pub user_id: UserId,
    pub source: CompensationSource,
    /// Why: the reservation outcome text for business rejections.
    pub reason: String,
    pub created_at: DateTime<Utc>,
}

impl OrderEvent {
    /// The event type (and tag) announcing that an order reached `status`.
    pub fn event_type_for(status: OrderStatus) -> &'static str {
        match status {
            OrderStatus::Created | OrderStatus::Paying => ORDER_CREATED_EVENT,
            OrderStatus::Paid => ORDER_PAID_EVENT,
            OrderStatus::Canceled => ORDER_CANCELED_EVENT,
        }
    }
}

/// An outbox payload as JSON. Payloads are plain structs of strings,
/// numbers and timestamps: they always serialize.
pub(crate) fn json(v: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(v).expect("outbox payloads are plain data")
}
