//! Retention's pure decisions (docs/architecture.md §16.2): which tables a
//! prune may touch, the floor under the age it deletes at, the bounds of a
//! request, and whether the daemon's run is due.
//!
//! Inputs: durations, timestamps read from PostgreSQL's clock. Outputs: a
//! verdict or a refusal that names the fix. No I/O.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How long after its first delivery a message can still reach the
/// consumer as a redelivery of the same attempt chain: RocketMQ's 16
/// retries add up to 4 h 46 m, and a commit whose reply was lost retries
/// until the message dies, while its inbox row dates from the first
/// delivery. A day covers that with room; the replay pre-check
/// `inbox_kept` blocks a message that died within it of the inbox's
/// retention mark (§9.3).
pub const REDELIVERY_SPAN: Duration = Duration::from_secs(24 * 3600);

/// The most a prune keeps: past ten years the interval is a typo, and
/// PostgreSQL's timestamps would be near their range.
pub const MAX_KEEP: Duration = Duration::from_secs(3650 * 24 * 3600);

/// Rows a prune deletes per transaction, by default and at most: small
/// enough that a batch holds its locks and its WAL for a moment only.
pub const DEFAULT_BATCH: i64 = 5_000;
pub const MAX_BATCH: i64 = 100_000;

/// The tables a prune may touch: the pipeline's finished history. Audit
/// tables (operator_audit, redis_epochs, replay_audit, ticket events, the
/// quarantine) and the business facts (orders, reservations, the ledger,
/// compensations) have no variant, so no code path can prune them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PruneTable {
    /// `consumer_inbox`: SUCCEEDED and REJECTED rows, never PROCESSING.
    Inbox,
    /// `event_outbox`: SENT rows, never PENDING or DEAD.
    Outbox,
    /// `consumer_failures`: every old row.
    Failures,
}

impl PruneTable {
    pub const ALL: [PruneTable; 3] = [PruneTable::Inbox, PruneTable::Outbox, PruneTable::Failures];

    /// The name `--table` takes and the JSON shows.
    pub fn as_str(self) -> &'static str {
        match self {
            PruneTable::Inbox => "inbox",
            PruneTable::Outbox => "outbox",
            PruneTable::Failures => "failures",
        }
    }

    /// The PostgreSQL table, and its row in `retention_marks`.
    pub fn relation(self) -> &'static str {
        match self {
            PruneTable::Inbox => "consumer_inbox",
            PruneTable::Outbox => "event_outbox",
            PruneTable::Failures => "consumer_failures",
        }
    }

    fn from_relation(s: &str) -> Option<PruneTable> {
        PruneTable::ALL.into_iter().find(|t| t.relation() == s)
    }
}

impl fmt::Display for PruneTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--table` value that names no prunable table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown table {0:?}; one of inbox, outbox, failures (audit tables are never pruned)")]
pub struct UnknownTable(pub String);

impl FromStr for PruneTable {
    type Err = UnknownTable;
    fn from_str(s: &str) -> Result<Self, UnknownTable> {
        PruneTable::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .or_else(|| PruneTable::from_relation(s))
            .ok_or_else(|| UnknownTable(s.to_owned()))
    }
}

/// Why a prune request (or a `[retention]` section) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Below the broker's retention an inbox row could go while the broker
    /// may still redeliver its message, and the duplicate guard with it.
    #[error(
        "keeping {keep_h} h is below the floor of {floor_h} h ([dlq] broker_retention_hours): below it an inbox row could be deleted while the broker can still redeliver its message, and the duplicate guard would be gone; keep at least {floor_h}h"
    )]
    BelowFloor { keep_h: u64, floor_h: u64 },
    #[error("keeping more than {} days is not a retention; use at most {}d", MAX_KEEP.as_secs() / 86_400, MAX_KEEP.as_secs() / 86_400)]
    TooLong,
    #[error("a batch of {0} rows is out of range; use 1 to {MAX_BATCH}")]
    BadBatch(i64),
    #[error("a run every 0 h never pauses; use every_hours of 1 or more")]
    NeverPauses,
}

/// The floor check: a prune keeps at least the broker's retention of a
/// message (`[dlq] broker_retention_hours`), and at most [`MAX_KEEP`].
pub fn check_keep(keep: Duration, floor: Duration) -> Result<(), Refusal> {
    if keep < floor {
        return Err(Refusal::BelowFloor {
            // Rounded up, so "keeping 71 h" is never shown for 71.5 h.
            keep_h: keep.as_secs().div_ceil(3600),
            floor_h: floor.as_secs().div_ceil(3600),
        });
    }
    if keep > MAX_KEEP {
        return Err(Refusal::TooLong);
    }
    Ok(())
}

/// A batch size within bounds (STYLE.md: every batch has a bound).
pub fn check_batch(batch: i64) -> Result<(), Refusal> {
    if (1..=MAX_BATCH).contains(&batch) {
        Ok(())
    } else {
        Err(Refusal::BadBatch(batch))
    }
}

/// The `[retention]` section against the floor: a run every hour or more
/// rarely, keeping at least the broker's retention.
pub fn check_schedule(every: Duration, keep: Duration, floor: Duration) -> Result<(), Refusal> {
    if every < Duration::from_secs(3600) {
        return Err(Refusal::NeverPauses);
    }
    check_keep(keep, floor)
}

/// Whether the daemon's run over a table is due: never finished, or last
/// finished `every` ago or more. Both instants are PostgreSQL's, so
/// daemons with skewed clocks agree, and a restart or a lease hand-over
/// reads the same answer; a run cut short never set `last_done`.
pub fn is_due(last_done: Option<DateTime<Utc>>, now: DateTime<Utc>, every: Duration) -> bool {
    let Some(last) = last_done else {
        return true;
    };
    match chrono::Duration::from_std(every) {
        Ok(every) => now.signed_duration_since(last) >= every,
        // An interval chrono cannot hold is never reached.
        Err(_) => false,
    }
}

/// Whether a message that died at `dead_at` may have lost its inbox row to
/// a prune whose mark is `horizon` (§9.3 `inbox_kept`): it could have been
/// first delivered up to [`REDELIVERY_SPAN`] before it died.
pub fn inbox_maybe_pruned(dead_at: DateTime<Utc>, horizon: DateTime<Utc>) -> bool {
    let span = chrono::Duration::from_std(REDELIVERY_SPAN).unwrap_or(chrono::Duration::MAX);
    match horizon.checked_add_signed(span) {
        Some(limit) => dead_at < limit,
        // A mark at the end of time: everything may be gone.
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3600;

    #[test]
    fn the_floor_is_the_brokers_retention() {
        let floor = Duration::from_secs(72 * H);
        assert_eq!(check_keep(Duration::from_secs(72 * H), floor), Ok(()));
        assert_eq!(check_keep(Duration::from_secs(336 * H), floor), Ok(()));
        let below = check_keep(Duration::from_secs(48 * H), floor).unwrap_err();
        assert_eq!(
            below,
            Refusal::BelowFloor {
                keep_h: 48,
                floor_h: 72
            }
        );
        assert!(below.to_string().contains("keep at least 72h"), "{below}");
        assert!(below.to_string().contains("broker_retention_hours"));
        // Half an hour short is still short, and says so.
        let short = check_keep(Duration::from_secs(71 * H + 1800), floor).unwrap_err();
        assert_eq!(
            short,
            Refusal::BelowFloor {
                keep_h: 72,
                floor_h: 72
            }
        );
        assert_eq!(
            check_keep(MAX_KEEP + Duration::from_secs(1), floor),
            Err(Refusal::TooLong)
        );
    }

    #[test]
    fn batches_are_bounded() {
        assert_eq!(check_batch(DEFAULT_BATCH), Ok(()));
        assert_eq!(check_batch(1), Ok(()));
        assert_eq!(check_batch(0), Err(Refusal::BadBatch(0)));
        assert_eq!(check_batch(-5), Err(Refusal::BadBatch(-5)));
        assert_eq!(
            check_batch(MAX_BATCH + 1),
            Err(Refusal::BadBatch(MAX_BATCH + 1))
        );
    }

    #[test]
    fn the_schedule_runs_at_most_hourly_above_the_floor() {
        let floor = Duration::from_secs(72 * H);
        let day = Duration::from_secs(24 * H);
        assert_eq!(
            check_schedule(day, Duration::from_secs(336 * H), floor),
            Ok(())
        );
        assert_eq!(
            check_schedule(Duration::ZERO, Duration::from_secs(336 * H), floor),
            Err(Refusal::NeverPauses)
        );
        assert_eq!(
            check_schedule(day, Duration::from_secs(24 * H), floor),
            Err(Refusal::BelowFloor {
                keep_h: 24,
                floor_h: 72
            })
        );
    }

    #[test]
    fn a_run_is_due_when_never_done_or_done_long_enough_ago() {
        let now = Utc::now();
        let day = Duration::from_secs(24 * H);
        assert!(is_due(None, now, day), "never finished");
        assert!(!is_due(Some(now - chrono::Duration::hours(23)), now, day));
        assert!(is_due(Some(now - chrono::Duration::hours(24)), now, day));
        assert!(is_due(Some(now - chrono::Duration::days(3)), now, day));
        // A clock that went back (another daemon's write in the future)
        // is not due; the mark's own time passes eventually.
        assert!(!is_due(Some(now + chrono::Duration::hours(1)), now, day));
        assert!(!is_due(Some(now), now, Duration::MAX));
    }

    #[test]
    fn a_message_dead_within_a_day_of_the_mark_may_have_lost_its_inbox_row() {
        let mark = Utc::now() - chrono::Duration::days(14);
        assert!(inbox_maybe_pruned(mark - chrono::Duration::hours(1), mark));
        assert!(inbox_maybe_pruned(mark + chrono::Duration::hours(5), mark));
        assert!(inbox_maybe_pruned(mark + chrono::Duration::hours(23), mark));
        assert!(!inbox_maybe_pruned(
            mark + chrono::Duration::hours(24),
            mark
        ));
        assert!(!inbox_maybe_pruned(mark + chrono::Duration::days(3), mark));
        assert!(inbox_maybe_pruned(
            DateTime::<Utc>::MAX_UTC,
            DateTime::<Utc>::MAX_UTC
        ));
    }

    #[test]
    fn tables_parse_by_name_or_relation_and_nothing_else() {
        for t in PruneTable::ALL {
            assert_eq!(t.as_str().parse::<PruneTable>(), Ok(t));
            assert_eq!(t.relation().parse::<PruneTable>(), Ok(t));
        }
        for audit in ["operator_audit", "orders", "replay_audit", "quarantine"] {
            let e = audit.parse::<PruneTable>().unwrap_err();
            assert!(e.to_string().contains("never pruned"), "{e}");
        }
    }
}
