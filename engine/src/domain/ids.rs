//! Identifier newtypes (docs/architecture.md §3). The business `message_id` is generated
//! before the Redis reservation and never changes across sends, re-sends and
//! replays; it is the inbox key. The broker's ids are only for locating.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, sqlx::Type)]
        #[serde(try_from = "String", into = "String")]
        #[sqlx(transparent)]
        pub struct $name(String);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            /// A fresh, time-ordered id.
            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, ulid::Ulid::new()))
            }

            /// Parses an id, checking its prefix and ULID part.
            pub fn parse(s: &str) -> Result<Self, IdError> {
                let ulid = s.strip_prefix($prefix).ok_or_else(|| IdError {
                    kind: stringify!($name),
                    value: s.to_owned(),
                    expected: concat!($prefix, "<ULID>"),
                })?;
                ulid::Ulid::from_string(ulid).map_err(|_| IdError {
                    kind: stringify!($name),
                    value: s.to_owned(),
                    expected: concat!($prefix, "<ULID>"),
                })?;
                Ok(Self(s.to_owned()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// When the id was made: a ULID carries its millisecond
            /// timestamp (checked by [`Self::parse`]).
            pub fn created_at_ms(&self) -> Option<i64> {
                let ulid = ulid::Ulid::from_string(self.0.strip_prefix($prefix)?).ok()?;
                i64::try_from(ulid.timestamp_ms()).ok()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::parse(&s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::parse(s)
            }
        }
    };
}

prefixed_id!(
    /// The business message id, `evt_<ULID>`: the inbox key.
    MessageId,
    "evt_"
);
prefixed_id!(
    /// One Redis stock reservation, `rsv_<ULID>`: the message key.
    ReservationId,
    "rsv_"
);
prefixed_id!(
    /// Pre-allocated at reservation time, so every re-send names the same order.
    OrderId,
    "ord_"
);
prefixed_id!(
    /// A client's idempotency key, `req_<ULID>`.
    RequestId,
    "req_"
);
prefixed_id!(
    /// A DLQ ticket, `tkt_<ULID>`: one per (consumer group, error class)
    /// while not closed, and the webhook's `Idempotency-Key`
    /// (docs/architecture.md §9.2).
    TicketId,
    "tkt_"
);
prefixed_id!(
    /// One replay attempt, `rpl_<ULID>`: the `replay_id` property the
    /// consumer records in its inbox row, and the `replay_audit` key
    /// (docs/architecture.md §9.4).
    ReplayId,
    "rpl_"
);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {value:?}: expected {expected}")]
pub struct IdError {
    pub kind: &'static str,
    pub value: String,
    pub expected: &'static str,
}

macro_rules! numeric_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, sqlx::Type)]
        #[serde(transparent)]
        #[sqlx(transparent)]
        pub struct $name(pub i64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                match s.parse::<i64>() {
                    Ok(v) if v > 0 => Ok(Self(v)),
                    _ => Err(IdError {
                        kind: stringify!($name),
                        value: s.to_owned(),
                        expected: "a positive integer",
                    }),
                }
            }
        }
    };
}

numeric_id!(ActivityId);
numeric_id!(SkuId);
numeric_id!(UserId);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_round_trip() {
        let id = MessageId::generate();
        assert!(id.as_str().starts_with("evt_"));
        assert_eq!(MessageId::parse(id.as_str()).unwrap(), id);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<MessageId>(&json).unwrap(), id);
        let now = chrono::Utc::now().timestamp_millis();
        let at = ReservationId::generate().created_at_ms().unwrap();
        assert!((now - at).abs() < 5_000, "{now} vs {at}");
    }

    #[test]
    fn ticket_and_replay_ids_carry_their_prefix() {
        let t = TicketId::generate();
        assert!(t.as_str().starts_with("tkt_"));
        assert_eq!(TicketId::parse(t.as_str()).unwrap(), t);
        assert!(TicketId::parse("tkt_nope").is_err());
        assert!(ReplayId::generate().as_str().starts_with("rpl_"));
        assert!(ReplayId::parse(t.as_str()).is_err());
    }

    #[test]
    fn wrong_prefix_or_garbage_is_rejected() {
        let rsv = ReservationId::generate();
        assert!(MessageId::parse(rsv.as_str()).is_err());
        assert!(MessageId::parse("evt_not-a-ulid").is_err());
        assert!(MessageId::parse("").is_err());
        assert!(serde_json::from_str::<MessageId>("\"evt_x\"").is_err());
    }

    #[test]
    fn numeric_ids_must_be_positive() {
        assert_eq!("42".parse::<ActivityId>().unwrap(), ActivityId(42));
        assert!("0".parse::<ActivityId>().is_err());
        assert!("-1".parse::<SkuId>().is_err());
        assert!("abc".parse::<UserId>().is_err());
    }
}
