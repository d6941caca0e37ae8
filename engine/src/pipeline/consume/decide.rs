//! The consume decision table of docs/architecture.md §7 as pure functions: what a
//! listener batch's result means for the broker (ACK, retry, quarantine).
//! No I/O, so every row of the table is unit-tested.

use super::ProcessError;
use crate::domain::message::Malformed;
use crate::domain::status::FailureClass;
use crate::mq::ConsumeVerdict;

/// What to do with a message after trying it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Committed (created, already processed, duplicate or rejected): ACK.
    Ack,
    /// Nothing was committed and a later attempt may succeed: ask for a
    /// redelivery, bounded by the group's max reconsume times, then DLQ.
    Retry { class: FailureClass, detail: String },
    /// The body can never be processed: record it and ACK.
    Quarantine(Malformed),
}

/// The broker verdict for a listener batch: ACK only when every message is
/// settled (committed or quarantined); one retry redelivers the batch, and
/// the inbox makes the settled ones no-ops the second time.
pub fn verdict(decisions: &[Decision]) -> ConsumeVerdict {
    if decisions
        .iter()
        .any(|d| matches!(d, Decision::Retry { .. }))
    {
        ConsumeVerdict::Retry
    } else {
        ConsumeVerdict::Ack
    }
}

/// Classifies a failed order transaction. Never ACK: nothing was committed.
pub fn classify(e: &ProcessError) -> Decision {
    Decision::Retry {
        class: failure_class(e),
        detail: e.to_string(),
    }
}

/// The retry class of a failed order transaction.
pub fn failure_class(e: &ProcessError) -> FailureClass {
    match e {
        ProcessError::Db(e) => db_failure_class(e),
        // A configuration error (docs/architecture.md §7, "unknown error"): retrying is
        // cheap and lets an operator fix the row; if nobody does, the broker
        // moves the message to the DLQ, where it is ticketed. Rejecting
        // instead would compensate a reservation that may well be sellable.
        ProcessError::MissingInventory { .. } => FailureClass::Unknown,
    }
}

/// Whether a failed batch may have failed for one message's sake, and so
/// is worth running again message by message: the server refused it for a
/// reason of its data (a constraint, a trigger). Pool, connection, timeout,
/// deadlock and serialization failures are the batch's circumstances, not a
/// message's: running 32 messages one by one into a dead pool would only
/// wait 32 times.
pub fn may_be_one_message(class: FailureClass) -> bool {
    matches!(class, FailureClass::Unknown)
}

/// Classifies a `sqlx` error. Every one retries: the class only decides how
/// a message that dies of it is ticketed (docs/architecture.md §9.2).
pub fn classify_db_error(e: &sqlx::Error) -> Decision {
    Decision::Retry {
        class: db_failure_class(e),
        detail: e.to_string(),
    }
}

/// The retry class of a `sqlx` error.
pub fn db_failure_class(e: &sqlx::Error) -> FailureClass {
    use sqlx::Error as E;
    match e {
        E::PoolTimedOut => FailureClass::DbPoolExhausted,
        E::PoolClosed | E::Io(_) | E::Tls(_) | E::Protocol(_) | E::WorkerCrashed => {
            FailureClass::DbConnection
        }
        E::Database(db) => db
            .code()
            .map_or(FailureClass::Unknown, |code| classify_sqlstate(&code)),
        _ => FailureClass::Unknown,
    }
}

/// Classifies a PostgreSQL SQLSTATE.
pub fn classify_sqlstate(code: &str) -> FailureClass {
    match code {
        "40P01" => FailureClass::DbDeadlock,
        "40001" => FailureClass::DbSerialization,
        // query_canceled (statement_timeout), lock_not_available
        // (lock_timeout, NOWAIT), idle_in_transaction_session_timeout.
        "57014" | "55P03" | "25P03" => FailureClass::DbTimeout,
        // The server is out of connection slots: pool pressure, seen from
        // the server side (docs/architecture.md §10).
        "53300" => FailureClass::DbPoolExhausted,
        // admin_shutdown, crash_shutdown, cannot_connect_now: the server is
        // restarting or failing over; the connection is gone.
        "57P01" | "57P02" | "57P03" => FailureClass::DbConnection,
        c if c.starts_with("08") => FailureClass::DbConnection,
        _ => FailureClass::Unknown,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_refusal_of_the_data_is_split_message_by_message() {
        use super::*;
        assert!(
            may_be_one_message(classify_sqlstate("P0001")),
            "a trigger's RAISE"
        );
        assert!(
            may_be_one_message(classify_sqlstate("23514")),
            "a check constraint"
        );
        for transient in ["40P01", "40001", "57014", "53300", "57P01", "08006"] {
            assert!(
                !may_be_one_message(classify_sqlstate(transient)),
                "{transient}"
            );
        }
        assert!(!may_be_one_message(db_failure_class(
            &sqlx::Error::PoolTimedOut
        )));
    }

    use super::*;
    use crate::domain::ids::{ActivityId, SkuId};
    use crate::domain::status::QuarantineReason;

    fn class(d: Decision) -> FailureClass {
        match d {
            Decision::Retry { class, .. } => class,
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    #[test]
    fn sqlstates_follow_the_design_table() {
        let cases = [
            ("40P01", FailureClass::DbDeadlock),
            ("40001", FailureClass::DbSerialization),
            ("57014", FailureClass::DbTimeout),
            ("55P03", FailureClass::DbTimeout),
            ("25P03", FailureClass::DbTimeout),
            ("53300", FailureClass::DbPoolExhausted),
            ("08000", FailureClass::DbConnection),
            ("08003", FailureClass::DbConnection),
            ("08006", FailureClass::DbConnection),
            ("08P01", FailureClass::DbConnection),
            ("57P01", FailureClass::DbConnection),
            ("57P02", FailureClass::DbConnection),
            ("57P03", FailureClass::DbConnection),
            // A check violation (the oversell backstop), a unique violation
            // the statements do not absorb, an undefined table: unknown,
            // retried a bounded number of times, then DLQ.
            ("23514", FailureClass::Unknown),
            ("23505", FailureClass::Unknown),
            ("42P01", FailureClass::Unknown),
            ("", FailureClass::Unknown),
        ];
        for (code, want) in cases {
            assert_eq!(classify_sqlstate(code), want, "SQLSTATE {code:?}");
        }
    }

    #[test]
    fn pool_and_transport_errors_retry_by_class() {
        assert_eq!(
            class(classify_db_error(&sqlx::Error::PoolTimedOut)),
            FailureClass::DbPoolExhausted
        );
        assert_eq!(
            class(classify_db_error(&sqlx::Error::PoolClosed)),
            FailureClass::DbConnection
        );
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(
            class(classify_db_error(&sqlx::Error::Io(io))),
            FailureClass::DbConnection
        );
        assert_eq!(
            class(classify_db_error(&sqlx::Error::Protocol("bad".into()))),
            FailureClass::DbConnection
        );
        assert_eq!(
            class(classify_db_error(&sqlx::Error::WorkerCrashed)),
            FailureClass::DbConnection
        );
        assert_eq!(
            class(classify_db_error(&sqlx::Error::RowNotFound)),
            FailureClass::Unknown
        );
        assert_eq!(
            class(classify_db_error(&sqlx::Error::ColumnNotFound("x".into()))),
            FailureClass::Unknown
        );
    }

    #[test]
    fn a_missing_inventory_row_retries_as_unknown_and_names_the_row() {
        let d = classify(&ProcessError::MissingInventory {
            activity_id: ActivityId(7),
            sku_id: SkuId(8),
        });
        match d {
            Decision::Retry { class, detail } => {
                assert_eq!(class, FailureClass::Unknown);
                assert!(
                    detail.contains("activity 7") && detail.contains("sku 8"),
                    "{detail}"
                );
            }
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    #[test]
    fn the_detail_keeps_the_error_text() {
        let Decision::Retry { detail, .. } = classify_db_error(&sqlx::Error::PoolTimedOut) else {
            panic!("expected a retry");
        };
        assert!(detail.contains("pool timed out"), "{detail}");
    }

    #[test]
    fn a_batch_is_acked_only_when_every_message_is_settled() {
        let retry = Decision::Retry {
            class: FailureClass::DbTimeout,
            detail: "lock timeout".into(),
        };
        let bad = crate::domain::message::parse_order_create(b"{").unwrap_err();
        assert_eq!(bad.reason, QuarantineReason::BadJson);
        assert_eq!(verdict(&[]), ConsumeVerdict::Ack);
        assert_eq!(
            verdict(&[Decision::Ack, Decision::Quarantine(bad.clone())]),
            ConsumeVerdict::Ack
        );
        assert_eq!(
            verdict(&[Decision::Ack, Decision::Quarantine(bad), retry]),
            ConsumeVerdict::Retry
        );
    }
}
