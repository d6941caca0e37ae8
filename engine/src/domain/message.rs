//! Message bodies (docs/architecture.md §3): the order-create request of docs/architecture.md §3.3 and
//! the cancel message of docs/architecture.md §8.2, with the validation that decides
//! quarantine. Parsing is pure: a body either becomes a typed message or a
//! [`Malformed`] naming why, and a malformed message is never retried.

use crate::domain::ids::{ActivityId, MessageId, OrderId, RequestId, ReservationId, SkuId, UserId};
use crate::domain::status::{CompensationSource, OrderStatus, QuarantineReason};
use crate::domain::trace::TraceId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The only body version this build understands.
pub const SCHEMA_VERSION: u32 = 1;
pub const ORDER_CREATE_EVENT: &str = "ORDER_CREATE_REQUESTED";
pub const CANCEL_EVENT: &str = "CANCEL_ORDER_IF_UNPAID";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    pub trace_id: String,
    pub span_id: String,
    pub traceparent: String,
}

impl TraceContext {
    /// A new span of the reservation's trace: each send of its message is
    /// one (docs/architecture.md §11.5).
    pub fn child_of(trace: &TraceId) -> Self {
        let trace_id = trace.to_string();
        let span_id = format!("{:016x}", rand::random::<u64>() | 1);
        let traceparent = format!("00-{trace_id}-{span_id}-01");
        Self {
            trace_id,
            span_id,
            traceparent,
        }
    }

    /// A fresh W3C trace context (version 00, sampled).
    pub fn generate() -> Self {
        let trace_id = format!("{:032x}", rand::random::<u128>());
        let span_id = format!("{:016x}", rand::random::<u64>());
        let traceparent = format!("00-{trace_id}-{span_id}-01");
        Self {
            trace_id,
            span_id,
            traceparent,
        }
    }
}

/// docs/architecture.md §3.3. `message_id` is fixed before the Redis reservation and never
/// changes; `retry_count` counts producer-side re-sends only (docs/architecture.md §3.4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderCreateRequested {
    pub schema_version: u32,
    pub event_type: String,
    pub message_id: MessageId,
    pub message_key: ReservationId,
    pub request_id: RequestId,
    pub reservation_id: ReservationId,
    pub order_id: OrderId,
    pub activity_id: ActivityId,
    pub sku_id: SkuId,
    pub user_id: UserId,
    pub quantity: i32,
    pub reservation_created_at: DateTime<Utc>,
    pub reservation_valid_until: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub retry_count: i32,
    pub replay_count: i32,
    pub producer: String,
    pub trace: TraceContext,
}

/// Why a body can never be processed, whatever the retry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {detail}")]
pub struct Malformed {
    pub reason: QuarantineReason,
    pub detail: String,
}

impl Malformed {
    fn new(reason: QuarantineReason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}

/// Parses a versioned JSON body into `T`: the version is looked at first,
/// so a newer producer's body is reported as an unsupported schema rather
/// than as a pile of unknown fields.
pub fn parse_versioned<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Malformed> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Malformed::new(QuarantineReason::BadJson, e.to_string()))?;
    let obj = value
        .as_object()
        .ok_or_else(|| Malformed::new(QuarantineReason::BadJson, "body is not a JSON object"))?;
    match obj.get("schema_version") {
        None => {
            return Err(Malformed::new(
                QuarantineReason::MissingField,
                "schema_version is missing",
            ));
        }
        Some(v) if v.as_u64() != Some(SCHEMA_VERSION as u64) => {
            return Err(Malformed::new(
                QuarantineReason::UnsupportedSchema,
                format!("schema_version {v} is not supported (this build reads {SCHEMA_VERSION})"),
            ));
        }
        Some(_) => {}
    }
    serde_json::from_value(value).map_err(|e| {
        let text = e.to_string();
        let reason = if text.starts_with("missing field") {
            QuarantineReason::MissingField
        } else {
            QuarantineReason::InvalidField
        };
        Malformed::new(reason, text)
    })
}

fn expect_event_type(got: &str, want: &[&str]) -> Result<(), Malformed> {
    if want.contains(&got) {
        Ok(())
    } else {
        Err(Malformed::new(
            QuarantineReason::InvalidField,
            format!("event_type {got:?} is not {}", want.join(" or ")),
        ))
    }
}

/// Parses and validates an order-create body.
pub fn parse_order_create(body: &[u8]) -> Result<OrderCreateRequested, Malformed> {
    let msg: OrderCreateRequested = parse_versioned(body)?;
    expect_event_type(&msg.event_type, &[ORDER_CREATE_EVENT])?;
    if msg.quantity != 1 {
        return Err(Malformed::new(
            QuarantineReason::InvalidField,
            format!(
                "quantity {} is not 1 (one unit per flash-sale order)",
                msg.quantity
            ),
        ));
    }
    if msg.message_key != msg.reservation_id {
        return Err(Malformed::new(
            QuarantineReason::InvalidField,
            "message_key differs from reservation_id",
        ));
    }
    if msg.activity_id.0 <= 0 || msg.sku_id.0 <= 0 || msg.user_id.0 <= 0 {
        return Err(Malformed::new(
            QuarantineReason::InvalidField,
            "activity_id, sku_id and user_id must be positive",
        ));
    }
    Ok(msg)
}

/// docs/architecture.md §8.2: the delayed cancel message, published from the outbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelOrderIfUnpaid {
    pub schema_version: u32,
    pub event_type: String,
    pub message_id: MessageId,
    pub message_key: OrderId,
    pub order_id: OrderId,
    pub reservation_id: ReservationId,
    pub activity_id: ActivityId,
    pub sku_id: SkuId,
    pub user_id: UserId,
    pub deliver_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub retry_count: i32,
    pub replay_count: i32,
}

/// Parses and validates a docs/architecture.md §8.2 cancel body.
pub fn parse_cancel(body: &[u8]) -> Result<CancelOrderIfUnpaid, Malformed> {
    let msg: CancelOrderIfUnpaid = parse_versioned(body)?;
    expect_event_type(&msg.event_type, &[CANCEL_EVENT])?;
    if msg.message_key != msg.order_id {
        return Err(Malformed::new(
            QuarantineReason::InvalidField,
            "message_key differs from order_id",
        ));
    }
    Ok(msg)
}

/// Parses and validates a `RELEASE_RESERVATION` body.
pub fn parse_release(body: &[u8]) -> Result<ReleaseReservation, Malformed> {
    let msg: ReleaseReservation = parse_versioned(body)?;
    expect_event_type(&msg.event_type, &[RELEASE_RESERVATION_EVENT])?;
    Ok(msg)
}

/// Parses and validates an order event body.
pub fn parse_order_event(body: &[u8]) -> Result<OrderEvent, Malformed> {
    let msg: OrderEvent = parse_versioned(body)?;
    expect_event_type(&msg.event_type, &[OrderEvent::event_type_for(msg.status)])?;
    if msg.aggregate_version < 1 {
        return Err(Malformed::new(
            QuarantineReason::InvalidField,
            format!(
                "aggregate_version {} is not positive",
                msg.aggregate_version
            ),
        ));
    }
    Ok(msg)
}

// ---------------------------------------------------------------------------
// The outbox payloads of the order lifecycle, besides the delayed cancel
// above: order events (created, paid, canceled) and the compensation. Their
// readers (the query projection and the compensation consumer) deserialize
// these same types.
// ---------------------------------------------------------------------------

pub const ORDER_CREATED_EVENT: &str = "ORDER_CREATED";
pub const ORDER_PAID_EVENT: &str = "ORDER_PAID";
pub const ORDER_CANCELED_EVENT: &str = "ORDER_CANCELED";
pub const RELEASE_RESERVATION_EVENT: &str = "RELEASE_RESERVATION";

/// Tag of the delayed cancel on the ORDER_TIMEOUT topic (docs/architecture.md §3).
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
/// version is not newer than what it holds (docs/architecture.md §8.7).
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
/// `reservation_id`: give the Redis reservation back, once (docs/architecture.md §8).
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

/// The four kinds of body, one per topic (docs/architecture.md §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// ORDER_CREATE: [`OrderCreateRequested`].
    OrderCreate,
    /// ORDER_TIMEOUT: [`CancelOrderIfUnpaid`].
    Cancel,
    /// ORDER_EVENT: [`OrderEvent`].
    OrderEvent,
    /// INVENTORY_COMPENSATE: [`ReleaseReservation`].
    Release,
}

/// Any body the engine sends, parsed and validated by its kind. Whoever
/// meets a body without its consumer (the DLQ replay pre-checks, §9.3)
/// reads it through here, with the same validation the consumer applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    OrderCreate(OrderCreateRequested),
    Cancel(CancelOrderIfUnpaid),
    OrderEvent(OrderEvent),
    Release(ReleaseReservation),
}

impl Message {
    pub fn parse(kind: MessageKind, body: &[u8]) -> Result<Self, Malformed> {
        Ok(match kind {
            MessageKind::OrderCreate => Message::OrderCreate(parse_order_create(body)?),
            MessageKind::Cancel => Message::Cancel(parse_cancel(body)?),
            MessageKind::OrderEvent => Message::OrderEvent(parse_order_event(body)?),
            MessageKind::Release => Message::Release(parse_release(body)?),
        })
    }

    pub fn kind(&self) -> MessageKind {
        match self {
            Message::OrderCreate(_) => MessageKind::OrderCreate,
            Message::Cancel(_) => MessageKind::Cancel,
            Message::OrderEvent(_) => MessageKind::OrderEvent,
            Message::Release(_) => MessageKind::Release,
        }
    }

    /// The business id every kind carries: the inbox key (§3.2).
    pub fn message_id(&self) -> &MessageId {
        match self {
            Message::OrderCreate(m) => &m.message_id,
            Message::Cancel(m) => &m.message_id,
            Message::OrderEvent(m) => &m.message_id,
            Message::Release(m) => &m.message_id,
        }
    }
}

/// An outbox payload as JSON. Payloads are plain structs of strings,
/// numbers and timestamps: they always serialize.
pub(crate) fn json(v: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(v).expect("outbox payloads are plain data")
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> OrderCreateRequested {
        let rsv = ReservationId::generate();
        let now = Utc::now();
        OrderCreateRequested {
            schema_version: 1,
            event_type: ORDER_CREATE_EVENT.into(),
            message_id: MessageId::generate(),
            message_key: rsv.clone(),
            request_id: RequestId::generate(),
            reservation_id: rsv,
            order_id: OrderId::generate(),
            activity_id: ActivityId(10001),
            sku_id: SkuId(20001),
            user_id: UserId(90000001),
            quantity: 1,
            reservation_created_at: now,
            reservation_valid_until: now + chrono::Duration::minutes(5),
            created_at: now,
            retry_count: 0,
            replay_count: 0,
            producer: "seckill-engine".into(),
            trace: TraceContext::generate(),
        }
    }

    fn with(f: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
        let mut v = serde_json::to_value(sample()).unwrap();
        f(&mut v);
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn one_parse_reads_every_kind_and_refuses_the_wrong_one() {
        let m = sample();
        let body = serde_json::to_vec(&m).unwrap();
        let parsed = Message::parse(MessageKind::OrderCreate, &body).unwrap();
        assert_eq!(parsed.kind(), MessageKind::OrderCreate);
        assert_eq!(parsed.message_id(), &m.message_id);
        // An order-create body is not a cancel: the cancel's own validation
        // (unknown fields, event type) says so.
        assert!(Message::parse(MessageKind::Cancel, &body).is_err());
        assert!(Message::parse(MessageKind::Release, b"{}").is_err());
    }

    #[test]
    fn a_good_body_round_trips() {
        let m = sample();
        let body = serde_json::to_vec(&m).unwrap();
        assert_eq!(parse_order_create(&body).unwrap(), m);
    }

    #[test]
    fn the_seed_example_parses() {
        let body = br#"{
          "schema_version": 1, "event_type": "ORDER_CREATE_REQUESTED",
          "message_id": "evt_01K0YV6M3RM4DAK1XKED6W9Y2Q", "message_key": "rsv_01K0YV6KZ8B8QNY6H5N6BMEPXV",
          "request_id": "req_01K0YV6HGNMTHWMTMH0PV40T58", "reservation_id": "rsv_01K0YV6KZ8B8QNY6H5N6BMEPXV",
          "order_id": "ord_01K0YV6MGJXYJ5SKPX0DPSV8G5", "activity_id": 10001, "sku_id": 20001,
          "user_id": 90000001, "quantity": 1,
          "reservation_created_at": "2026-06-25T17:00:00.123Z", "reservation_valid_until": "2026-06-25T17:05:00.123Z",
          "created_at": "2026-06-25T17:00:00.130Z", "retry_count": 0, "replay_count": 0,
          "producer": "seckill-access-service",
          "trace": {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7",
                    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
        }"#;
        let m = parse_order_create(body).unwrap();
        assert_eq!(m.user_id, UserId(90000001));
    }

    #[test]
    fn bad_bodies_are_classified_for_quarantine() {
        let reason = |b: &[u8]| parse_order_create(b).unwrap_err().reason;
        assert_eq!(reason(b"{not json"), QuarantineReason::BadJson);
        assert_eq!(reason(b"[1,2]"), QuarantineReason::BadJson);
        assert_eq!(
            reason(&with(|v| v["schema_version"] = 2.into())),
            QuarantineReason::UnsupportedSchema
        );
        assert_eq!(
            reason(&with(|v| {
                v.as_object_mut().unwrap().remove("schema_version");
            })),
            QuarantineReason::MissingField
        );
        assert_eq!(
            reason(&with(|v| {
                v.as_object_mut().unwrap().remove("order_id");
            })),
            QuarantineReason::MissingField
        );
        assert_eq!(
            reason(&with(|v| v["message_id"] = "not-an-id".into())),
            QuarantineReason::InvalidField
        );
        assert_eq!(
            reason(&with(|v| v["quantity"] = 2.into())),
            QuarantineReason::InvalidField
        );
        assert_eq!(
            reason(&with(|v| v["event_type"] = "OTHER".into())),
            QuarantineReason::InvalidField
        );
        assert_eq!(
            reason(&with(|v| v["user_id"] = (-1).into())),
            QuarantineReason::InvalidField
        );
    }
}
