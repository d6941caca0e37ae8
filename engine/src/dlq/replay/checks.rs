//! The pre-checks of a replay as pure functions (docs/architecture.md §9.3):
//! the facts gathered read-only go in, a verdict per check and the decision
//! come out. No I/O here, so every row of the §9.3 table is unit-tested
//! with literals.

use crate::decide::retention::{REDELIVERY_SPAN, inbox_maybe_pruned};
use crate::domain::message::{Malformed, Message};
use crate::domain::status::{
    CompensationSource, CompensationStatus, InboxStatus, OrderStatus, ReplayDecision,
};
use crate::mq::TopicKind;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// One pre-check of docs/architecture.md §9.3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// The message is in the DLQ mirror (body and topic are known).
    Mirrored,
    /// The group's inbox does not hold the `message_id` yet.
    Inbox,
    /// No prune can have taken the message's inbox row: it died at least
    /// [`REDELIVERY_SPAN`] after the inbox's retention mark (§16.2).
    InboxKept,
    /// No order exists for the body's order (order-create only).
    Order,
    /// The reservation was not compensated (order-create only).
    Compensation,
    /// No ledger row for the reservation (order-create only).
    Ledger,
    /// The body parses under a supported `schema_version`.
    Schema,
    /// `reservation_valid_until` has not passed (order-create only).
    Validity,
    /// Every consumer group of the target topic is idempotent.
    Idempotent,
}

impl Check {
    pub const ALL: [Check; 9] = [
        Check::Mirrored,
        Check::Inbox,
        Check::InboxKept,
        Check::Order,
        Check::Compensation,
        Check::Ledger,
        Check::Schema,
        Check::Validity,
        Check::Idempotent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Check::Mirrored => "mirrored",
            Check::Inbox => "inbox",
            Check::InboxKept => "inbox_kept",
            Check::Order => "order",
            Check::Compensation => "compensation",
            Check::Ledger => "ledger",
            Check::Schema => "schema",
            Check::Validity => "validity",
            Check::Idempotent => "idempotent",
        }
    }

    /// Checks an operator may override with `--force`: those whose block
    /// protects against a no-op or a duplicate the inbox still stops.
    /// Missing data and an unsupported body can never be forced (§9.3),
    /// nor `inbox_kept`: there the inbox no longer stops a duplicate.
    pub fn forceable(self) -> bool {
        matches!(
            self,
            Check::Inbox | Check::Order | Check::Compensation | Check::Ledger
        )
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--force` value that names no check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown check {value:?}; one of {}", Check::ALL.map(Check::as_str).join(", "))]
pub struct UnknownCheck {
    pub value: String,
}

impl FromStr for Check {
    type Err = UnknownCheck;
    fn from_str(s: &str) -> Result<Self, UnknownCheck> {
        Check::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownCheck {
                value: s.to_owned(),
            })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Level {
    Pass,
    Warn,
    Block,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub check: Check,
    pub level: Level,
    pub evidence: String,
    /// An operator's `--force` turned a block into this warning.
    pub forced: bool,
}

/// Why a dead body fails the `schema` check (§9.3: never forceable).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// The group is none of the four seckill groups, so no body layout
    /// applies (the mirror reads only seckill groups: a renamed prefix?).
    #[error("not a seckill consumer group")]
    NotSeckillGroup,
    /// The body is malformed for its group's layout (§3.3).
    #[error(transparent)]
    Malformed(#[from] Malformed),
}

/// Everything the pre-checks look at, gathered read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub mirrored: bool,
    /// When the broker dead-lettered it, and how long the broker keeps a
    /// dead message: past that, the mirror is the only copy left.
    pub dead_at: DateTime<Utc>,
    pub retention: Duration,
    pub kind: Option<TopicKind>,
    /// The inbox row of this group for the message: (status, result code).
    pub inbox: Option<(InboxStatus, Option<String>)>,
    pub order_status: Option<OrderStatus>,
    pub compensation: Option<(CompensationSource, CompensationStatus)>,
    pub ledger_rows: i64,
    pub schema: Result<(), SchemaError>,
    pub valid_until: Option<DateTime<Utc>>,
    pub now: DateTime<Utc>,
    /// The inbox's retention mark (`retention_marks`): rows older than it
    /// may have been pruned. `None` when no prune ever ran (§16.2).
    pub inbox_horizon: Option<DateTime<Utc>>,
}

/// Whether the body parses as its group's message (pure).
pub(super) fn parse_for(kind: Option<TopicKind>, body: &[u8]) -> Result<(), SchemaError> {
    let kind = kind.ok_or(SchemaError::NotSeckillGroup)?;
    Message::parse(kind.message_kind(), body)?;
    Ok(())
}

/// The verdict of every check (pure). `forced` turns the named blocks into
/// warnings, when the check allows it.
pub fn verdicts(f: &Facts, forced: &[Check]) -> Vec<Verdict> {
    Check::ALL
        .into_iter()
        .map(|check| {
            let (level, evidence) = judge(f, check);
            let force = level == Level::Block && check.forceable() && forced.contains(&check);
            Verdict {
                check,
                level: if force { Level::Warn } else { level },
                evidence: if force {
                    format!("{evidence} (forced)")
                } else {
                    evidence
                },
                forced: force,
            }
        })
        .collect()
}

/// One row of the §9.3 table, before any `--force`.
fn judge(f: &Facts, check: Check) -> (Level, String) {
    // The order, compensation, ledger and validity checks read an
    // order-create body; on other groups they have nothing to say.
    if f.kind != Some(TopicKind::OrderCreate)
        && matches!(
            check,
            Check::Order | Check::Compensation | Check::Ledger | Check::Validity
        )
    {
        return (Level::Pass, "not applicable to this group".to_owned());
    }
    match check {
        Check::Mirrored => retention(f),
        Check::Inbox => match &f.inbox {
            None => (
                Level::Pass,
                "the inbox has never applied this message_id".into(),
            ),
            Some((status, code)) => (
                Level::Block,
                format!(
                    "already applied: inbox {status} {}; a replay would be a no-op",
                    code.as_deref().unwrap_or("")
                ),
            ),
        },
        Check::InboxKept => inbox_kept(f),
        Check::Order => match f.order_status {
            None => (Level::Pass, "no order for this reservation yet".into()),
            Some(s) => (Level::Block, format!("the order exists ({s})")),
        },
        Check::Compensation => match f.compensation {
            None => (Level::Pass, "the reservation was not compensated".into()),
            Some((source, status)) => (
                Level::Block,
                format!(
                    "the reservation was compensated ({source}, {status}); its stock went back"
                ),
            ),
        },
        Check::Ledger if f.ledger_rows == 0 => (Level::Pass, "no ledger row".into()),
        Check::Ledger => (
            Level::Block,
            format!("{} ledger row(s) for the reservation", f.ledger_rows),
        ),
        Check::Schema => match &f.schema {
            Ok(()) => (Level::Pass, "the body parses (schema_version 1)".into()),
            Err(why) => (Level::Block, format!("the body does not parse: {why}")),
        },
        Check::Validity => validity(f.valid_until, f.now),
        Check::Idempotent => idempotent(f),
    }
}

/// The body must be in the mirror; past the broker's retention the mirror
/// is the only copy left, which warns (keep the row: nothing can rebuild it).
fn retention(f: &Facts) -> (Level, String) {
    if !f.mirrored {
        return (
            Level::Block,
            "no body in the DLQ mirror; nothing to replay".into(),
        );
    }
    let kept_until = chrono::Duration::from_std(f.retention)
        .ok()
        .and_then(|r| f.dead_at.checked_add_signed(r));
    match kept_until {
        Some(until) if until > f.now => (
            Level::Pass,
            format!(
                "body kept in dlq_messages; the broker keeps its DLQ copy {} h more",
                (until - f.now).num_hours()
            ),
        ),
        _ => (
            Level::Warn,
            format!(
                "dead {} h ago, past the broker's retention ({} h): the mirror is the only copy left; keep its row",
                (f.now - f.dead_at).num_hours(),
                f.retention.as_secs() / 3600
            ),
        ),
    }
}

/// A replay leans on the inbox to stop a duplicate; a prune may have taken
/// the row that would. A message first delivered before the inbox's mark
/// may have lost its row, and one that died less than [`REDELIVERY_SPAN`]
/// after the mark may have been first delivered before it (a commit whose
/// reply was lost retries until the message dies). Never forceable: no
/// one can say any more whether it was applied.
fn inbox_kept(f: &Facts) -> (Level, String) {
    let Some(horizon) = f.inbox_horizon else {
        return (Level::Pass, "no inbox row was ever pruned".into());
    };
    if let Some(k) = f.kind
        && !k.has_inbox()
    {
        return (
            Level::Pass,
            format!("the {} consumer keeps no inbox", k.base_name()),
        );
    }
    let span_h = REDELIVERY_SPAN.as_secs() / 3600;
    let mark = horizon.format("%Y-%m-%d %H:%M:%S UTC");
    if inbox_maybe_pruned(f.dead_at, horizon) {
        let h = f.dead_at.signed_duration_since(horizon).num_hours();
        let when = if f.dead_at < horizon {
            format!("{} h before", -h)
        } else {
            format!("{h} h after")
        };
        (
            Level::Block,
            format!(
                "died {when} the inbox's retention mark ({mark}), within {span_h} h of it: its inbox row may have been pruned, so nothing can tell whether it was applied"
            ),
        )
    } else {
        (
            Level::Pass,
            format!(
                "died {span_h} h or more after the inbox's retention mark ({mark}): its inbox row is kept"
            ),
        )
    }
}

/// A replay is safe only into a consumer that recognises a message it
/// applied: an inbox on `message_id` (every seckill group but the
/// projection, which keeps only newer `aggregate_version`s). A group that
/// is none of ours has no such guarantee, and blocks.
fn idempotent(f: &Facts) -> (Level, String) {
    match f.kind {
        None => (
            Level::Block,
            "not a seckill consumer group: nothing says a replay would be applied once".into(),
        ),
        Some(TopicKind::OrderEvent) => (
            Level::Pass,
            "the projection applies only newer aggregate_versions (no inbox needed)".into(),
        ),
        Some(k) if k.has_inbox() => (
            Level::Pass,
            format!(
                "the {} consumer keeps an inbox on message_id ({})",
                k.base_name(),
                if f.inbox.is_some() {
                    "it holds this one: see the inbox check"
                } else {
                    "no row for this one yet"
                }
            ),
        ),
        Some(k) => (
            Level::Block,
            format!("the {} consumer keeps no inbox", k.base_name()),
        ),
    }
}

/// Past `valid_until` a replay is still safe: the consumer rejects it as
/// REJECTED_EXPIRED and compensates once (§4.4), so this only warns.
fn validity(valid_until: Option<DateTime<Utc>>, now: DateTime<Utc>) -> (Level, String) {
    match valid_until {
        Some(v) if v > now => (
            Level::Pass,
            format!("valid for {} s more", (v - now).num_seconds()),
        ),
        Some(v) => (
            Level::Warn,
            format!(
                "expired {} s ago: the replay will be rejected (REJECTED_EXPIRED) and compensated once",
                (now - v).num_seconds()
            ),
        ),
        None => (Level::Pass, "no validity in the body".into()),
    }
}

/// Send only when nothing blocks.
pub fn decide(v: &[Verdict], dry_run: bool) -> ReplayDecision {
    if v.iter().any(|v| v.level == Level::Block) {
        ReplayDecision::Blocked
    } else if dry_run {
        ReplayDecision::DryRun
    } else {
        ReplayDecision::Sent
    }
}

/// When the `i`-th paced send (0-based) may go, measured from the first,
/// so at most `rate` go out per second (pure).
/// Total: a rate so small that the slot is past what a `Duration` holds
/// (a hostile `rate_per_s` of 1e-300) saturates instead of panicking
/// (found by engine/tests/hostile.rs); the bulk replay refuses rates
/// outside [`RATE_RANGE`] before pacing anything.
pub fn pace(i: usize, rate_per_s: f64) -> Duration {
    if rate_per_s <= 0.0 || !rate_per_s.is_finite() {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(i as f64 / rate_per_s).unwrap_or(Duration::MAX)
}

/// The replay rates a bulk run takes, per second: from one send every
/// 100 s to more than the pipeline's own burst.
pub const RATE_RANGE: std::ops::RangeInclusive<f64> = 0.01..=100_000.0;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::status::QuarantineReason;

    fn fresh() -> Facts {
        let now = Utc::now();
        Facts {
            mirrored: true,
            dead_at: now - chrono::Duration::minutes(5),
            retention: Duration::from_secs(72 * 3600),
            kind: Some(TopicKind::OrderCreate),
            inbox: None,
            order_status: None,
            compensation: None,
            ledger_rows: 0,
            schema: Ok(()),
            valid_until: Some(now + chrono::Duration::minutes(1)),
            now,
            inbox_horizon: None,
        }
    }

    fn level(v: &[Verdict], c: Check) -> Level {
        v.iter().find(|v| v.check == c).map(|v| v.level).unwrap()
    }

    fn evidence(v: &[Verdict], c: Check) -> &str {
        v.iter()
            .find(|v| v.check == c)
            .map(|v| v.evidence.as_str())
            .unwrap()
    }

    #[test]
    fn a_fresh_dead_order_passes_every_check_and_is_sent() {
        let v = verdicts(&fresh(), &[]);
        assert!(v.iter().all(|v| v.level == Level::Pass), "{v:#?}");
        assert_eq!(decide(&v, false), ReplayDecision::Sent);
        assert_eq!(decide(&v, true), ReplayDecision::DryRun);
    }

    #[test]
    fn an_applied_message_is_blocked_unless_forced() {
        let f = Facts {
            inbox: Some((InboxStatus::Succeeded, Some("ORDER_CREATED".into()))),
            order_status: Some(OrderStatus::Created),
            ledger_rows: 1,
            ..fresh()
        };
        let v = verdicts(&f, &[]);
        assert_eq!(level(&v, Check::Inbox), Level::Block);
        assert_eq!(level(&v, Check::Order), Level::Block);
        assert_eq!(level(&v, Check::Ledger), Level::Block);
        assert_eq!(decide(&v, false), ReplayDecision::Blocked);
        let forced = verdicts(&f, &[Check::Inbox, Check::Order, Check::Ledger]);
        assert_eq!(decide(&forced, false), ReplayDecision::Sent);
        assert!(forced.iter().filter(|v| v.forced).count() == 3);
    }

    #[test]
    fn typed_facts_read_as_the_database_labels() {
        let f = Facts {
            inbox: Some((InboxStatus::Succeeded, Some("ORDER_CREATED".into()))),
            order_status: Some(OrderStatus::Created),
            compensation: Some((
                CompensationSource::BusinessRejection,
                CompensationStatus::Released,
            )),
            ..fresh()
        };
        let v = verdicts(&f, &[]);
        assert_eq!(
            evidence(&v, Check::Inbox),
            "already applied: inbox SUCCEEDED ORDER_CREATED; a replay would be a no-op"
        );
        assert_eq!(evidence(&v, Check::Order), "the order exists (CREATED)");
        assert_eq!(
            evidence(&v, Check::Compensation),
            "the reservation was compensated (BUSINESS_REJECTION, RELEASED); its stock went back"
        );
    }

    #[test]
    fn an_expired_reservation_warns_but_does_not_block() {
        let now = Utc::now();
        let f = Facts {
            valid_until: Some(now - chrono::Duration::seconds(90)),
            ..fresh()
        };
        let v = verdicts(&f, &[]);
        assert_eq!(level(&v, Check::Validity), Level::Warn);
        assert_eq!(decide(&v, false), ReplayDecision::Sent);
    }

    #[test]
    fn missing_data_and_bad_bodies_block_and_cannot_be_forced() {
        let f = Facts {
            mirrored: false,
            schema: Err(SchemaError::Malformed(Malformed {
                reason: QuarantineReason::UnsupportedSchema,
                detail: "schema_version 2 is not supported".into(),
            })),
            ..fresh()
        };
        let v = verdicts(&f, &[Check::Mirrored, Check::Schema]);
        assert_eq!(level(&v, Check::Mirrored), Level::Block);
        assert_eq!(level(&v, Check::Schema), Level::Block);
        assert!(!Check::Mirrored.forceable() && !Check::Schema.forceable());
        assert_eq!("inbox".parse::<Check>(), Ok(Check::Inbox));
        let unknown = "nope".parse::<Check>().unwrap_err().to_string();
        assert!(unknown.contains("one of mirrored, inbox"), "{unknown}");
    }

    #[test]
    fn a_body_of_no_seckill_group_does_not_parse() {
        assert_eq!(parse_for(None, b"{}"), Err(SchemaError::NotSeckillGroup));
        assert!(matches!(
            parse_for(Some(TopicKind::OrderCreate), b"not json"),
            Err(SchemaError::Malformed(_))
        ));
    }

    #[test]
    fn pacing_spaces_sends_by_the_rate() {
        assert_eq!(pace(0, 20.0), Duration::ZERO);
        assert_eq!(pace(1, 20.0), Duration::from_millis(50));
        assert_eq!(pace(40, 20.0), Duration::from_secs(2));
        assert_eq!(pace(5, 0.0), Duration::ZERO);
    }

    #[test]
    fn order_checks_do_not_apply_to_other_groups() {
        let f = Facts {
            kind: Some(TopicKind::OrderTimeout),
            order_status: Some(OrderStatus::Canceled),
            ledger_rows: 2,
            ..fresh()
        };
        let v = verdicts(&f, &[]);
        assert_eq!(decide(&v, false), ReplayDecision::Sent, "{v:#?}");
    }

    #[test]
    fn retention_passes_warns_past_the_broker_keeping_it_and_blocks_without_a_body() {
        let now = Utc::now();
        let v = verdicts(&fresh(), &[]);
        assert_eq!(level(&v, Check::Mirrored), Level::Pass);
        assert!(
            evidence(&v, Check::Mirrored).contains("71 h more"),
            "{v:#?}"
        );
        let old = Facts {
            dead_at: now - chrono::Duration::hours(80),
            ..fresh()
        };
        let v = verdicts(&old, &[]);
        assert_eq!(level(&v, Check::Mirrored), Level::Warn);
        assert!(evidence(&v, Check::Mirrored).contains("the mirror is the only copy left"));
        assert_eq!(
            decide(&v, false),
            ReplayDecision::Sent,
            "a warning never blocks"
        );
        let empty = Facts {
            mirrored: false,
            ..fresh()
        };
        assert_eq!(level(&verdicts(&empty, &[]), Check::Mirrored), Level::Block);
    }

    #[test]
    fn a_message_dead_within_a_day_of_the_inbox_mark_is_blocked_and_cannot_be_forced() {
        let now = Utc::now();
        let mark = now - chrono::Duration::days(14);
        // Died 5 h after the mark: its first delivery may predate it.
        let f = Facts {
            dead_at: mark + chrono::Duration::hours(5),
            inbox_horizon: Some(mark),
            ..fresh()
        };
        let v = verdicts(&f, &[Check::InboxKept]);
        assert_eq!(level(&v, Check::InboxKept), Level::Block, "{v:#?}");
        assert!(!v.iter().any(|v| v.forced), "never forceable");
        assert!(!Check::InboxKept.forceable());
        assert!(
            evidence(&v, Check::InboxKept).contains("may have been pruned"),
            "{v:#?}"
        );
        assert_eq!(decide(&v, false), ReplayDecision::Blocked);
        // Died before the mark: blocked too.
        let before = Facts {
            dead_at: mark - chrono::Duration::days(1),
            ..f.clone()
        };
        assert_eq!(
            level(&verdicts(&before, &[]), Check::InboxKept),
            Level::Block
        );
        // A day and more after the mark, the row is kept.
        let later = Facts {
            dead_at: mark + chrono::Duration::hours(25),
            ..f.clone()
        };
        assert_eq!(level(&verdicts(&later, &[]), Check::InboxKept), Level::Pass);
        // No prune ever ran, or a group without an inbox: nothing to lose.
        assert_eq!(
            level(&verdicts(&fresh(), &[]), Check::InboxKept),
            Level::Pass
        );
        let projection = Facts {
            kind: Some(TopicKind::OrderEvent),
            ..f
        };
        assert_eq!(
            level(&verdicts(&projection, &[]), Check::InboxKept),
            Level::Pass
        );
        assert_eq!("inbox_kept".parse::<Check>(), Ok(Check::InboxKept));
    }

    #[test]
    fn idempotency_passes_for_an_inbox_or_versions_and_blocks_an_unknown_group() {
        for kind in [
            TopicKind::OrderCreate,
            TopicKind::OrderTimeout,
            TopicKind::InventoryCompensate,
        ] {
            let f = Facts {
                kind: Some(kind),
                ..fresh()
            };
            let v = verdicts(&f, &[]);
            assert_eq!(level(&v, Check::Idempotent), Level::Pass, "{kind:?}");
            assert!(evidence(&v, Check::Idempotent).contains("inbox"));
        }
        let f = Facts {
            kind: Some(TopicKind::OrderEvent),
            ..fresh()
        };
        assert!(evidence(&verdicts(&f, &[]), Check::Idempotent).contains("aggregate_version"));
        let unknown = Facts {
            kind: None,
            ..fresh()
        };
        let v = verdicts(&unknown, &[Check::Idempotent]);
        assert_eq!(
            level(&v, Check::Idempotent),
            Level::Block,
            "never forceable"
        );
        assert_eq!(decide(&v, false), ReplayDecision::Blocked);
    }
}
