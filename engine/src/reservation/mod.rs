//! Redis reservation model (docs/architecture.md §4): the hot path's stock reservation
//! and the send state of each reservation, which the publisher and scanner move.
//!
//! Inputs:
//! - a [`ReserveRequest`] from ingress, its ids made by the caller beforehand
//!   (the `message_id` is fixed before the reservation, docs/architecture.md §3);
//! - send outcomes from the publisher ([`ReservationStore::mark_sent_many`],
//!   [`ReservationStore::mark_send_failed`]);
//! - scanner passes ([`ReservationStore::claim_due`], [`ReservationStore::reschedule`]);
//! - compensations ([`ReservationStore::release`], docs/architecture.md §8).
//!
//! Outputs: typed outcomes ([`ReserveOutcome`], [`ReleaseOutcome`], ...),
//! [`Reservation`] snapshots, and the figures backlog and reconcile read
//! (pending count, most overdue reservation, live reservations).
//!
//! Every multi-key step is one Lua script (`*.lua` beside this file), so a
//! crash between two Redis commands cannot leave stock taken without a
//! pending entry, or given back twice. Every time is an explicit `now_ms`
//! (milliseconds since the epoch) so the state machine is deterministic.
//!
//! The hash's `mq_status` is the only status kept in Redis: docs/architecture.md §4
//! also lists a `status` field, but it would only repeat `mq_status`, whose
//! `RELEASED` says the stock is back.

mod epoch;
mod store;

pub use epoch::{LiveOrder, RestoredState};
pub use store::{ReplicaWait, ReservationStore};

use crate::domain::ids::{ActivityId, MessageId, OrderId, RequestId, ReservationId, SkuId, UserId};
use crate::domain::status::UnknownVariant;
use crate::domain::trace::TraceId;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

/// Where a reservation's message stands (docs/architecture.md §4):
/// `MQ_PENDING → SENDING → MQ_SENT`, or back to `MQ_PENDING` on an UNKNOWN
/// send; `MQ_PENDING | SENDING → SEND_FAILED`; anything → `RELEASED` through
/// the compensation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MqStatus {
    MqPending,
    /// Leased by one scanner until `lease_until`.
    Sending,
    MqSent,
    SendFailed,
    /// The stock and the buyer slot were given back; final.
    Released,
}

impl MqStatus {
    pub const ALL: &'static [MqStatus] = &[
        MqStatus::MqPending,
        MqStatus::Sending,
        MqStatus::MqSent,
        MqStatus::SendFailed,
        MqStatus::Released,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MqStatus::MqPending => "MQ_PENDING",
            MqStatus::Sending => "SENDING",
            MqStatus::MqSent => "MQ_SENT",
            MqStatus::SendFailed => "SEND_FAILED",
            MqStatus::Released => "RELEASED",
        }
    }
}

impl fmt::Display for MqStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MqStatus {
    type Err = UnknownVariant;
    fn from_str(s: &str) -> Result<Self, UnknownVariant> {
        Self::ALL
            .iter()
            .copied()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnknownVariant {
                kind: "mq_status",
                value: s.to_owned(),
                expected: &[
                    "MQ_PENDING",
                    "SENDING",
                    "MQ_SENT",
                    "SEND_FAILED",
                    "RELEASED",
                ],
            })
    }
}

/// What `seckillctl pending` needs of one pending reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PendingEntry {
    /// The scanner's next look (the pending set's score).
    pub next_retry_at_ms: i64,
    pub created_at_ms: i64,
    pub send_attempt: u32,
    pub valid_until_ms: i64,
}

/// One reservation hash, parsed. Empty strings in Redis are `None` here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reservation {
    pub reservation_id: ReservationId,
    pub message_id: MessageId,
    pub request_id: RequestId,
    pub order_id: OrderId,
    pub activity_id: ActivityId,
    pub sku_id: SkuId,
    pub user_id: UserId,
    pub mq_status: MqStatus,
    /// Scanner claims so far; the in-process first send is attempt 0.
    pub send_attempt: u32,
    pub next_retry_at_ms: i64,
    pub lease_owner: Option<String>,
    /// 0 when no lease is held.
    pub lease_until_ms: i64,
    pub created_at_ms: i64,
    /// The business validity the consumer checks (docs/architecture.md §4.4), not the key's TTL.
    pub valid_until_ms: i64,
    pub broker_message_id: Option<String>,
    pub last_error: Option<String>,
    /// Its W3C trace (docs/architecture.md §11.5): the incoming
    /// `traceparent`'s, or derived from the id.
    pub trace_id: TraceId,
}

impl Reservation {
    /// Parses a hash (`HGETALL`) read from `key`. A missing or malformed
    /// field is [`ReservationError::Corrupt`], never a panic.
    fn from_hash(
        activity_id: ActivityId,
        reservation_id: ReservationId,
        key: &str,
        hash: &HashMap<String, String>,
    ) -> Result<Self, ReservationError> {
        let f = Fields { key, hash };
        Ok(Self {
            message_id: f.parse("message_id")?,
            request_id: f.parse("request_id")?,
            order_id: f.parse("order_id")?,
            activity_id,
            sku_id: f.parse("sku_id")?,
            user_id: f.parse("user_id")?,
            mq_status: f.parse("mq_status")?,
            send_attempt: f.parse("send_attempt")?,
            next_retry_at_ms: f.parse("next_retry_at")?,
            lease_owner: f.optional("lease_owner")?,
            lease_until_ms: f.parse("lease_until")?,
            created_at_ms: f.parse("created_at")?,
            valid_until_ms: f.parse("valid_until")?,
            broker_message_id: f.optional("broker_message_id")?,
            last_error: f.optional("last_error")?,
            // A hash written before traces were stored, or rebuilt from
            // PostgreSQL, traces by its id, as its first send did.
            trace_id: hash
                .get("trace_id")
                .and_then(|t| TraceId::parse(t))
                .unwrap_or_else(|| TraceId::of_reservation(&reservation_id)),
            reservation_id,
        })
    }
}

struct Fields<'a> {
    key: &'a str,
    hash: &'a HashMap<String, String>,
}

impl Fields<'_> {
    fn raw(&self, name: &str) -> Result<&str, ReservationError> {
        self.hash
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| corrupt(self.key, format!("field {name} is missing")))
    }

    fn parse<T>(&self, name: &str) -> Result<T, ReservationError>
    where
        T: FromStr,
        T::Err: fmt::Display,
    {
        let raw = self.raw(name)?;
        raw.parse()
            .map_err(|e| corrupt(self.key, format!("field {name} = {raw:?}: {e}")))
    }

    fn optional(&self, name: &str) -> Result<Option<String>, ReservationError> {
        let raw = self.raw(name)?;
        Ok((!raw.is_empty()).then(|| raw.to_owned()))
    }
}

fn corrupt(key: &str, detail: impl Into<String>) -> ReservationError {
    ReservationError::Corrupt {
        key: key.to_owned(),
        detail: detail.into(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReservationError {
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    /// Redis holds something this code never writes.
    #[error("corrupt reservation data at {key}: {detail}")]
    Corrupt { key: String, detail: String },
    /// The caller reused a reservation id; ids are meant to be fresh ULIDs.
    #[error("reservation id {0} is already in use")]
    IdInUse(ReservationId),
}

/// A reservation attempt. Every id is generated by the caller before the
/// call, so a retried request can carry the same ones (docs/architecture.md §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveRequest {
    pub activity_id: ActivityId,
    pub sku_id: SkuId,
    pub user_id: UserId,
    pub request_id: RequestId,
    pub reservation_id: ReservationId,
    pub message_id: MessageId,
    pub order_id: OrderId,
    pub now_ms: i64,
    pub valid_until_ms: i64,
    pub trace_id: TraceId,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// Stock taken; the reservation is `MQ_PENDING` and in the scanner's ZSET.
    Reserved(Reservation),
    /// This `request_id` was seen before: its reservation, as it is now.
    Existing(Reservation),
    NotSeeded,
    /// The activity's epoch key is missing: never seeded, or Redis lost
    /// its state (docs/architecture.md §4.5). PostgreSQL tells which.
    NoEpoch,
    SoldOut,
    /// The user already holds a live reservation in this activity.
    DuplicateUser,
    /// The sale has ended and this `request_id` was never seen
    /// (docs/architecture.md §16.3).
    Ended,
}

/// Whether the ingress still sells in an activity, as it last read
/// PostgreSQL (docs/architecture.md §16.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sale {
    Open,
    Ended,
}

/// What [`ReservationStore::retire`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(
    tag = "outcome",
    content = "pending",
    rename_all = "SCREAMING_SNAKE_CASE"
)]
pub enum RetireOutcome {
    /// The epoch is gone, the keys expire, the scanner no longer looks.
    Retired,
    /// This many reservations still wait for their send: not yet.
    Pending(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedOutcome {
    Seeded,
    /// The key existed and `force` was not given: nothing was written.
    AlreadySeeded {
        current: i64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// This call gave the stock and the buyer slot back.
    Released,
    /// An earlier call did; nothing was written.
    AlreadyReleased,
    /// No such reservation (never made, or past its physical TTL).
    Unknown,
}

/// The projected order status of a reservation, as the query side sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderView {
    pub order_id: OrderId,
    pub status: crate::domain::status::OrderStatus,
    pub aggregate_version: i64,
    pub occurred_at_ms: i64,
}

/// The key names of one activity (docs/architecture.md §4). The `{activity}` hash tag
/// puts them all in one Cluster slot, which every multi-key script needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    base: String,
}

impl Keys {
    pub fn new(prefix: &str, activity: ActivityId) -> Self {
        Self {
            base: format!("{prefix}:{{{activity}}}"),
        }
    }

    pub fn stock(&self, sku: SkuId) -> String {
        format!("{}:stock:{sku}", self.base)
    }

    pub fn buyers(&self) -> String {
        format!("{}:buyers", self.base)
    }

    pub fn req(&self, id: &RequestId) -> String {
        format!("{}:req:{id}", self.base)
    }

    pub fn rsv(&self, id: &ReservationId) -> String {
        format!("{}{id}", self.rsv_prefix())
    }

    /// The query projection of the reservation's order (docs/architecture.md §8.7).
    pub fn view(&self, id: &ReservationId) -> String {
        format!("{}:view:{id}", self.base)
    }

    fn rsv_prefix(&self) -> String {
        format!("{}:rsv:", self.base)
    }

    pub fn pending(&self) -> String {
        format!("{}:reservation:mq_pending", self.base)
    }

    /// The epoch of the activity's Redis state (docs/architecture.md §4.5):
    /// written with the stock by every seed and restore, and checked by
    /// every reservation. Gone means Redis lost the activity's state.
    pub fn epoch(&self) -> String {
        format!("{}:epoch", self.base)
    }
}

/// `<prefix>:activities`: every seeded activity, so the scanner can find them.
/// Deliberately outside any hash tag: it spans activities.
pub fn activities_key(prefix: &str) -> String {
    format!("{prefix}:activities")
}

/// The longest `--valid-for` or `--pay-within`. The Redis reservation's
/// physical TTL outlives both ([`physical_ttl_ms`]), so a cancel at the end
/// of the longest pay window still finds the hash its release must flip
/// exactly once.
pub const MAX_WINDOW_MS: i64 = 7 * 24 * 3600 * 1000;

/// How long the req and rsv keys live: past the business validity, the
/// longest pay window and a day more. It only bounds memory (the consumer
/// decides validity from the message, docs/architecture.md §4.4), but it must outlive the
/// order's cancel: the compensation flips the hash's `mq_status` to RELEASED
/// exactly once, and a hash that expired first leaves nothing to flip
/// (the task would end ORPHANED).
pub fn physical_ttl_ms(now_ms: i64, valid_until_ms: i64) -> i64 {
    const DAY_MS: i64 = 24 * 60 * 60 * 1000;
    valid_until_ms
        .saturating_sub(now_ms)
        .max(0)
        .saturating_add(MAX_WINDOW_MS)
        .saturating_add(DAY_MS)
}

/// Delay before re-send `attempt` (1-based; 0 counts as 1): `base * 2^(attempt-1)`
/// capped at `max`, then spread over its upper half by `jitter` in `0..=1`
/// (from the caller's RNG), so a crowd of failed sends does not retry in step
/// while each still waits at least half its step (docs/architecture.md §6).
pub fn backoff_ms(attempt: u32, base_ms: u64, max_ms: u64, jitter: f64) -> u64 {
    let step = base_ms
        .saturating_mul(2u64.saturating_pow(attempt.saturating_sub(1)))
        .min(max_ms);
    let half = step / 2;
    // `as` saturates, and NaN becomes 0; `min` guards f64 rounding up.
    let spread = ((jitter.clamp(0.0, 1.0) * half as f64) as u64).min(half);
    step - half + spread
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_then_caps() {
        assert_eq!(backoff_ms(0, 500, 30_000, 1.0), 500);
        assert_eq!(backoff_ms(1, 500, 30_000, 1.0), 500);
        assert_eq!(backoff_ms(2, 500, 30_000, 1.0), 1_000);
        assert_eq!(backoff_ms(3, 500, 30_000, 1.0), 2_000);
        assert_eq!(backoff_ms(7, 500, 30_000, 1.0), 30_000);
        assert_eq!(backoff_ms(100, 500, 30_000, 1.0), 30_000);
        assert_eq!(backoff_ms(u32::MAX, u64::MAX, u64::MAX, 1.0), u64::MAX);
        let mut last = 0;
        for attempt in 0..200 {
            let d = backoff_ms(attempt, 500, 30_000, 1.0);
            assert!(d >= last && d <= 30_000, "attempt {attempt}: {d}");
            last = d;
        }
    }

    #[test]
    fn jitter_spreads_over_the_upper_half() {
        assert_eq!(backoff_ms(3, 500, 30_000, 0.0), 1_000);
        assert_eq!(backoff_ms(3, 500, 30_000, 0.5), 1_500);
        assert_eq!(backoff_ms(100, 500, 30_000, 0.0), 15_000);
        // Out-of-range jitter is clamped, never widens the bounds.
        assert_eq!(backoff_ms(3, 500, 30_000, -3.0), 1_000);
        assert_eq!(backoff_ms(3, 500, 30_000, 7.0), 2_000);
        assert_eq!(backoff_ms(3, 500, 30_000, f64::NAN), 1_000);
        for j in [0.0, 0.1, 0.33, 0.9, 1.0] {
            let d = backoff_ms(100, u64::MAX / 3, u64::MAX, j);
            assert!(d >= u64::MAX / 2, "{j}: {d}");
        }
        assert_eq!(backoff_ms(1, 1, 30_000, 0.0), 1);
        assert_eq!(backoff_ms(1, 0, 30_000, 1.0), 0);
    }

    #[test]
    fn mq_status_round_trips() {
        for s in MqStatus::ALL {
            assert_eq!(s.as_str().parse::<MqStatus>().unwrap(), *s);
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::json!(s.as_str())
            );
        }
        assert!("mq_pending".parse::<MqStatus>().is_err());
        assert!("".parse::<MqStatus>().is_err());
    }

    #[test]
    fn keys_carry_prefix_and_hash_tag() {
        let k = Keys::new("seckill", ActivityId(7));
        let rsv = ReservationId::generate();
        let req = RequestId::generate();
        assert_eq!(k.stock(SkuId(42)), "seckill:{7}:stock:42");
        assert_eq!(k.buyers(), "seckill:{7}:buyers");
        assert_eq!(k.pending(), "seckill:{7}:reservation:mq_pending");
        assert_eq!(k.epoch(), "seckill:{7}:epoch");
        assert_eq!(k.rsv(&rsv), format!("seckill:{{7}}:rsv:{rsv}"));
        assert_eq!(k.req(&req), format!("seckill:{{7}}:req:{req}"));
        assert_eq!(activities_key("t1"), "t1:activities");
    }

    #[test]
    fn physical_ttl_outlives_validity() {
        let week = MAX_WINDOW_MS;
        assert_eq!(physical_ttl_ms(1_000, 61_000), 60_000 + week + 86_400_000);
        assert_eq!(physical_ttl_ms(61_000, 1_000), week + 86_400_000);
    }

    fn sample_hash() -> HashMap<String, String> {
        [
            ("message_id", MessageId::generate().to_string()),
            ("request_id", RequestId::generate().to_string()),
            ("order_id", OrderId::generate().to_string()),
            ("sku_id", "2".into()),
            ("user_id", "3".into()),
            ("mq_status", "SENDING".into()),
            ("send_attempt", "4".into()),
            ("next_retry_at", "1000".into()),
            ("lease_owner", "scanner-a".into()),
            ("lease_until", "2000".into()),
            ("created_at", "500".into()),
            ("valid_until", "9000".into()),
            ("broker_message_id", "".into()),
            ("last_error", "".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    #[test]
    fn parses_a_hash() {
        let id = ReservationId::generate();
        let r = Reservation::from_hash(ActivityId(1), id.clone(), "k", &sample_hash()).unwrap();
        assert_eq!(r.reservation_id, id);
        assert_eq!(r.sku_id, SkuId(2));
        assert_eq!(r.mq_status, MqStatus::Sending);
        assert_eq!(r.send_attempt, 4);
        assert_eq!(r.lease_owner.as_deref(), Some("scanner-a"));
        assert_eq!(r.broker_message_id, None);
        // A hash without a stored trace traces by its id.
        assert_eq!(r.trace_id, TraceId::of_reservation(&id));
        let mut h = sample_hash();
        h.insert("trace_id".into(), "4bf92f3577b34da6a3ce929d0e0e4736".into());
        let r = Reservation::from_hash(ActivityId(1), id.clone(), "k", &h).unwrap();
        assert_eq!(r.trace_id.as_str(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn bad_hashes_are_corrupt_not_panics() {
        let id = ReservationId::generate();
        let cases: [(&str, Option<&str>); 5] = [
            ("message_id", None),
            ("last_error", None),
            ("mq_status", Some("SENT")),
            ("send_attempt", Some("-1")),
            ("order_id", Some("rsv_x")),
        ];
        for (field, value) in cases {
            let mut h = sample_hash();
            match value {
                Some(v) => h.insert(field.to_owned(), v.to_owned()),
                None => h.remove(field),
            };
            match Reservation::from_hash(ActivityId(1), id.clone(), "the-key", &h) {
                Err(ReservationError::Corrupt { key, detail }) => {
                    assert_eq!(key, "the-key");
                    assert!(detail.contains(field), "{detail}");
                }
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
