//! Every status of docs/architecture.md §5 as a Rust enum, mapped one-to-one to its
//! PostgreSQL enum type. A new variant needs a migration in the same change;
//! the `enums_match_the_schema` integration test catches drift.

use serde::{Deserialize, Serialize};

macro_rules! pg_enum {
    ($(#[$doc:meta])* $name:ident = $pg:literal { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
        #[sqlx(type_name = $pg)]
        pub enum $name {
            $(
                #[sqlx(rename = $text)]
                #[serde(rename = $text)]
                $variant,
            )+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The PostgreSQL type this enum maps to.
            pub const PG_TYPE: &'static str = $pg;

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownVariant;
            fn from_str(s: &str) -> Result<Self, UnknownVariant> {
                match s.to_ascii_uppercase().as_str() {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownVariant {
                        kind: $pg,
                        value: s.to_owned(),
                        expected: &[$($text),+],
                    }),
                }
            }
        }
    };
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {value:?}; expected one of {}", expected.join(", "))]
pub struct UnknownVariant {
    pub kind: &'static str,
    pub value: String,
    pub expected: &'static [&'static str],
}

pg_enum!(
    /// Order lifecycle; PAID and CANCELED are final and exclusive (docs/architecture.md §8.4).
    OrderStatus = "order_status" {
        Created => "CREATED",
        Paying => "PAYING",
        Paid => "PAID",
        Canceled => "CANCELED",
    }
);

pg_enum!(
    /// What finally became of a reservation: the PostgreSQL truth (docs/architecture.md §4).
    ReservationOutcome = "reservation_outcome" {
        OrderCreated => "ORDER_CREATED",
        RejectedNoStock => "REJECTED_NO_STOCK",
        RejectedDuplicate => "REJECTED_DUPLICATE",
        RejectedExpired => "REJECTED_EXPIRED",
        Released => "RELEASED",
    }
);

pg_enum!(
    LedgerReason = "ledger_reason" {
        OrderCreated => "ORDER_CREATED",
        OrderCanceled => "ORDER_CANCELED",
    }
);

pg_enum!(
    InboxStatus = "inbox_status" {
        Processing => "PROCESSING",
        Succeeded => "SUCCEEDED",
        Rejected => "REJECTED",
    }
);

pg_enum!(
    OutboxStatus = "outbox_status" {
        Pending => "PENDING",
        Sent => "SENT",
        Dead => "DEAD",
    }
);

pg_enum!(
    /// The three sources of compensation (issue: cancel/compensation).
    CompensationSource = "compensation_source" {
        BusinessRejection => "BUSINESS_REJECTION",
        SendFailure => "SEND_FAILURE",
        Cancellation => "CANCELLATION",
    }
);

pg_enum!(
    /// ORPHANED: the Redis reservation was gone (TTL) when the release ran.
    /// SETTLED_BY_RESTORE: Redis lost the activity's state, and the restore
    /// rebuilt the stock from PostgreSQL, which already counts the unit
    /// (docs/architecture.md §4.5).
    CompensationStatus = "compensation_status" {
        Pending => "PENDING",
        Released => "RELEASED",
        Orphaned => "ORPHANED",
        SettledByRestore => "SETTLED_BY_RESTORE",
    }
);

pg_enum!(
    /// Why an activity's Redis state started a new epoch (docs/architecture.md §4.5).
    RedisEpochKind = "redis_epoch_kind" {
        Seed => "SEED",
        Restore => "RESTORE",
    }
);

pg_enum!(
    QuarantineReason = "quarantine_reason" {
        BadJson => "BAD_JSON",
        UnsupportedSchema => "UNSUPPORTED_SCHEMA",
        MissingField => "MISSING_FIELD",
        InvalidField => "INVALID_FIELD",
    }
);

pg_enum!(
    /// The class of a consumer failure that asked for a retry; a dead message
    /// is ticketed by it (docs/architecture.md §9.2).
    FailureClass = "failure_class" {
        DbConnection => "DB_CONNECTION",
        DbTimeout => "DB_TIMEOUT",
        DbDeadlock => "DB_DEADLOCK",
        DbSerialization => "DB_SERIALIZATION",
        DbPoolExhausted => "DB_POOL_EXHAUSTED",
        RedisUnavailable => "REDIS_UNAVAILABLE",
        Unknown => "UNKNOWN",
    }
);

pg_enum!(
    DlqEntryStatus = "dlq_entry_status" {
        Dead => "DEAD",
        Replaying => "REPLAYING",
        Replayed => "REPLAYED",
        Verified => "VERIFIED",
        Discarded => "DISCARDED",
    }
);

pg_enum!(
    /// OPEN → ACKED → FIXED → REPLAYING → VERIFIED → CLOSED (docs/architecture.md §9.2).
    TicketStatus = "ticket_status" {
        Open => "OPEN",
        Acked => "ACKED",
        Fixed => "FIXED",
        Replaying => "REPLAYING",
        Verified => "VERIFIED",
        Closed => "CLOSED",
    }
);

pg_enum!(
    ReplayDecision = "replay_decision" {
        Sent => "SENT",
        Blocked => "BLOCKED",
        DryRun => "DRY_RUN",
        Discarded => "DISCARDED",
    }
);

pg_enum!(
    ReplayOutcome = "replay_outcome" {
        Pending => "PENDING",
        Verified => "VERIFIED",
        SendFailed => "SEND_FAILED",
        SendUnknown => "SEND_UNKNOWN",
        VerifyFailed => "VERIFY_FAILED",
        NotSent => "NOT_SENT",
    }
);

/// Every mapped enum as (PostgreSQL type, labels in declaration order), for the
/// schema drift check.
pub fn all_pg_enums() -> Vec<(&'static str, Vec<&'static str>)> {
    fn labels<T: Copy>(all: &[T], f: fn(T) -> &'static str) -> Vec<&'static str> {
        all.iter().map(|v| f(*v)).collect()
    }
    vec![
        (
            OrderStatus::PG_TYPE,
            labels(OrderStatus::ALL, OrderStatus::as_str),
        ),
        (
            ReservationOutcome::PG_TYPE,
            labels(ReservationOutcome::ALL, ReservationOutcome::as_str),
        ),
        (
            LedgerReason::PG_TYPE,
            labels(LedgerReason::ALL, LedgerReason::as_str),
        ),
        (
            InboxStatus::PG_TYPE,
            labels(InboxStatus::ALL, InboxStatus::as_str),
        ),
        (
            OutboxStatus::PG_TYPE,
            labels(OutboxStatus::ALL, OutboxStatus::as_str),
        ),
        (
            CompensationSource::PG_TYPE,
            labels(CompensationSource::ALL, CompensationSource::as_str),
        ),
        (
            CompensationStatus::PG_TYPE,
            labels(CompensationStatus::ALL, CompensationStatus::as_str),
        ),
        (
            QuarantineReason::PG_TYPE,
            labels(QuarantineReason::ALL, QuarantineReason::as_str),
        ),
        (
            FailureClass::PG_TYPE,
            labels(FailureClass::ALL, FailureClass::as_str),
        ),
        (
            DlqEntryStatus::PG_TYPE,
            labels(DlqEntryStatus::ALL, DlqEntryStatus::as_str),
        ),
        (
            TicketStatus::PG_TYPE,
            labels(TicketStatus::ALL, TicketStatus::as_str),
        ),
        (
            ReplayDecision::PG_TYPE,
            labels(ReplayDecision::ALL, ReplayDecision::as_str),
        ),
        (
            ReplayOutcome::PG_TYPE,
            labels(ReplayOutcome::ALL, ReplayOutcome::as_str),
        ),
        (
            RedisEpochKind::PG_TYPE,
            labels(RedisEpochKind::ALL, RedisEpochKind::as_str),
        ),
    ]
}

/// Why a cancel changed nothing (docs/architecture.md §8: a no-op ACK, counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CancelNoop {
    /// Payment won: a paid order is never canceled.
    AlreadyPaid,
    AlreadyCanceled,
    /// The pay window is still open (an early or clock-skewed delivery).
    NotYetDue,
    /// No such order.
    UnknownOrder,
}

impl CancelNoop {
    pub const ALL: [CancelNoop; 4] = [
        CancelNoop::AlreadyPaid,
        CancelNoop::AlreadyCanceled,
        CancelNoop::NotYetDue,
        CancelNoop::UnknownOrder,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CancelNoop::AlreadyPaid => "ALREADY_PAID",
            CancelNoop::AlreadyCanceled => "ALREADY_CANCELED",
            CancelNoop::NotYetDue => "NOT_YET_DUE",
            CancelNoop::UnknownOrder => "UNKNOWN_ORDER",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_case_insensitively_and_names_the_choices() {
        assert_eq!("paid".parse::<OrderStatus>().unwrap(), OrderStatus::Paid);
        let err = "SHIPPED".parse::<OrderStatus>().unwrap_err();
        assert!(
            err.to_string().contains("CREATED, PAYING, PAID, CANCELED"),
            "{err}"
        );
    }

    #[test]
    fn serde_uses_the_database_labels() {
        let json = serde_json::to_string(&TicketStatus::Replaying).unwrap();
        assert_eq!(json, "\"REPLAYING\"");
    }
}
