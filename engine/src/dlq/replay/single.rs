//! Guarded replay of one dead message (docs/architecture.md §9.3–9.5).
//!
//! A replay re-sends the *original* body to the *original* topic with the
//! *original* `message_id`, plus `replay_id` and `replay_count + 1` (§9.4).
//! It never mints a new `message_id`: the inbox must be able to recognise a
//! message it already applied. Before sending, the facts are gathered
//! read-only and [`verdicts`] (pure) turns them into pass, warn or block;
//! [`decide`] sends only when nothing blocks. Every attempt, dry runs and
//! refusals included, writes one `replay_audit` row.

use super::checks::{Check, Facts, Verdict, decide, parse_for, verdicts};
use crate::decide::retention::PruneTable;
use crate::dlq::entry::{EntryMove, MoveFacts, next};
use crate::dlq::verifier;
use crate::domain::auth::Actor;
use crate::domain::ids::{MessageId, ReplayId, TicketId};
use crate::domain::status::{
    CompensationSource, CompensationStatus, DlqEntryStatus, InboxStatus, OrderStatus,
    ReplayDecision, ReplayOutcome,
};
use crate::mq::{
    Names, OutgoingMessage, PROP_MESSAGE_ID, PROP_REPLAY_COUNT, PROP_REPLAY_ID, PROP_TRACEPARENT,
    Producer, SendOutcome, TopicKind,
};
use crate::store::audit::{self, AuditId};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sqlx::PgPool;
use std::time::{Duration, Instant};

/// What the operator asked for.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// The original `message_id`, kept by the replay (§9.4).
    pub message_id: MessageId,
    /// Needed only when the message is dead in more than one group.
    pub group: Option<String>,
    pub reason: String,
    /// Who asks: named on the `replay_audit` row and on the
    /// `operator_audit` intent (docs/security.md).
    pub actor: Actor,
    pub dry_run: bool,
    pub force: Vec<Check>,
    /// How long to wait for the consumer's verdict after sending.
    pub verify_within: Duration,
    /// Send again an entry whose earlier replay went out and was not
    /// verified (REPLAYED, or REPLAYING after an unknown send).
    pub include_replayed: bool,
    /// The broker's retention of dead messages (`[dlq] broker_retention_hours`).
    pub retention: Duration,
}

/// The answer: the verdict table, the decision and how it ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayReport {
    /// `None` for an entry a halted bulk run never attempted; shown (and
    /// serialized) as `""`, as it always was.
    #[serde(serialize_with = "id_or_empty", deserialize_with = "empty_or_id")]
    pub replay_id: Option<ReplayId>,
    pub consumer_group: String,
    pub message_id: MessageId,
    pub ticket_id: Option<TicketId>,
    pub checks: Vec<Verdict>,
    pub decision: ReplayDecision,
    pub outcome: ReplayOutcome,
    pub replay_count: i32,
    pub detail: String,
}

impl ReplayReport {
    /// The replay id as text, `""` when the entry was never attempted.
    pub fn replay_id_str(&self) -> &str {
        self.replay_id.as_ref().map_or("", ReplayId::as_str)
    }
}

fn id_or_empty<S: Serializer>(id: &Option<ReplayId>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(id.as_ref().map_or("", ReplayId::as_str))
}

/// The other way: `""` is an entry never attempted (the operator API's
/// answer, read back by the CLI and the TUI).
fn empty_or_id<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ReplayId>, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() {
        return Ok(None);
    }
    ReplayId::parse(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("--reason is required and must not be empty: say why this replay is safe")]
    NoReason,
    #[error("no dead message {0}; list them with `seckillctl dlq list`")]
    Unknown(MessageId),
    #[error("{id} is dead in several groups ({groups}); choose one with --group")]
    Ambiguous { id: MessageId, groups: String },
    #[error("--force {0} is not allowed: that check protects data, not idempotency")]
    NotForceable(Check),
    #[error("no ticket {0}; list them with `seckillctl dlq ticket list`")]
    UnknownTicket(TicketId),
    #[error("ticket {0} is CLOSED; reopen work under a new ticket, or replay one --message-id")]
    ClosedTicket(TicketId),
    #[error("--rate must be between 0.01/s and 100000/s, not {0}")]
    BadRate(f64),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The mirrored copy a replay re-sends.
#[derive(sqlx::FromRow)]
struct Entry {
    status: DlqEntryStatus,
    dead_at: DateTime<Utc>,
    consumer_group: String,
    ticket_id: Option<TicketId>,
    original_topic: String,
    body: Vec<u8>,
    properties: serde_json::Value,
    replay_count: i32,
}

fn kind_of(names: &Names, group: &str) -> Option<TopicKind> {
    TopicKind::ALL
        .into_iter()
        .find(|k| names.group(*k) == group)
}

/// The facts of §9.3, read-only. The body is the dead copy's and not
/// validated: its reservation id is looked up as text (the `schema` check
/// says whether it parses).
async fn gather(
    pool: &PgPool,
    names: &Names,
    group: &str,
    message_id: &MessageId,
    e: &Entry,
    retention: Duration,
) -> Result<Facts, sqlx::Error> {
    let kind = kind_of(names, group);
    let body: serde_json::Value = serde_json::from_slice(&e.body).unwrap_or_default();
    let inbox: Option<(InboxStatus, Option<String>)> = sqlx::query_as(
        "SELECT status, result_code FROM consumer_inbox WHERE consumer_group = $1 AND message_id = $2",
    )
    .bind(group)
    .bind(message_id)
    .fetch_optional(pool)
    .await?;
    let rsv = body["reservation_id"].as_str().unwrap_or_default();
    let order_status: Option<OrderStatus> =
        sqlx::query_scalar("SELECT status FROM orders WHERE reservation_id = $1")
            .bind(rsv)
            .fetch_optional(pool)
            .await?;
    let compensation: Option<(CompensationSource, CompensationStatus)> =
        sqlx::query_as("SELECT source, status FROM compensation_tasks WHERE reservation_id = $1")
            .bind(rsv)
            .fetch_optional(pool)
            .await?;
    let ledger_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inventory_ledger WHERE reservation_id = $1")
            .bind(rsv)
            .fetch_one(pool)
            .await?;
    // Read after the inbox: a prune commits its mark before deleting a
    // row, so a row found missing above is explained by the mark read here
    // (docs/architecture.md §16.2).
    let inbox_horizon: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT horizon FROM retention_marks WHERE table_name = $1")
            .bind(PruneTable::Inbox.relation())
            .fetch_optional(pool)
            .await?;
    let valid_until = body["reservation_valid_until"]
        .as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc));
    Ok(Facts {
        // The mirror keeps what it read: an empty body is nothing to send.
        mirrored: !e.body.is_empty(),
        dead_at: e.dead_at,
        retention,
        kind,
        inbox,
        order_status,
        compensation,
        ledger_rows,
        schema: parse_for(kind, &e.body),
        valid_until,
        now: Utc::now(),
        inbox_horizon,
    })
}

/// The broker message of a replay: the original topic, tag, keys, body and
/// `message_id`, plus the replay lineage (§9.4). No other system property
/// is copied from the dead copy.
fn replay_message(
    e: &Entry,
    message_id: &MessageId,
    replay_id: &ReplayId,
    count: i32,
) -> OutgoingMessage {
    let prop = |k: &str| e.properties[k].as_str().map(str::to_owned);
    let mut properties = vec![
        (PROP_MESSAGE_ID.to_owned(), message_id.to_string()),
        (PROP_REPLAY_ID.to_owned(), replay_id.to_string()),
        (PROP_REPLAY_COUNT.to_owned(), count.to_string()),
    ];
    if let Some(tp) = prop(PROP_TRACEPARENT) {
        properties.push((PROP_TRACEPARENT.to_owned(), tp));
    }
    OutgoingMessage {
        topic: e.original_topic.clone(),
        tag: prop("TAGS").unwrap_or_else(|| "*".into()),
        keys: prop("KEYS")
            .map(|k| {
                k.split(' ')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        properties,
        body: e.body.clone(),
        deliver_time_ms: None,
    }
}

/// Runs the pre-checks, then (unless blocked or a dry run) re-sends and
/// waits for the consumer's verdict. Writes one `replay_audit` row.
pub async fn replay<P: Producer>(
    pool: &PgPool,
    names: &Names,
    producer: &P,
    req: &ReplayRequest,
) -> Result<ReplayReport, ReplayError> {
    validate(&req.reason, &req.force)?;
    let mut p = prepare(pool, names, req).await?;
    // A single replay is not paced: its slot is now.
    if p.report.decision == ReplayDecision::Sent
        && send(pool, producer, &mut p, std::future::ready(())).await?
    {
        p.report.outcome = verify(
            pool,
            &p.report.consumer_group,
            &req.message_id,
            &p.facts,
            req.verify_within,
        )
        .await?;
    }
    finish(pool, &mut p).await?;
    Ok(p.report)
}

/// The request checks that need no database: refused requests write no
/// audit row (§9.4 audits attempts, not typos).
pub(super) fn validate(reason: &str, force: &[Check]) -> Result<(), ReplayError> {
    if reason.trim().is_empty() {
        return Err(ReplayError::NoReason);
    }
    if let Some(c) = force.iter().find(|c| !c.forceable()) {
        return Err(ReplayError::NotForceable(*c));
    }
    Ok(())
}

/// A replay between its pre-checks and its verdict.
pub(super) struct Prepared {
    pub(super) replay_id: ReplayId,
    pub(super) report: ReplayReport,
    entry: Entry,
    pub(super) facts: Facts,
    /// The send was CONFIRMED; the outcome waits for verification.
    pub(super) confirmed: bool,
    /// The `operator_audit` intent, completed by [`finish`].
    op_audit: AuditId,
}

/// The pre-check verdicts of one dead message, read-only: no audit row,
/// nothing sent. What a screen shows before anyone asks for a replay.
pub async fn precheck(
    pool: &PgPool,
    names: &Names,
    group: &str,
    message_id: &MessageId,
    retention: Duration,
) -> Result<Vec<Verdict>, ReplayError> {
    let entry: Entry = sqlx::query_as(
        "SELECT status, dead_at, consumer_group, ticket_id, original_topic, body, properties, replay_count
         FROM dlq_messages WHERE message_id = $1 AND consumer_group = $2",
    )
    .bind(message_id)
    .bind(group)
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| ReplayError::Unknown(message_id.clone()))?;
    let facts = gather(pool, names, group, message_id, &entry, retention).await?;
    Ok(verdicts(&facts, &[]))
}

/// Finds the entry, runs the pre-checks and opens the audit row.
pub(super) async fn prepare(
    pool: &PgPool,
    names: &Names,
    req: &ReplayRequest,
) -> Result<Prepared, ReplayError> {
    let mut entries: Vec<Entry> = sqlx::query_as(
        "SELECT status, dead_at, consumer_group, ticket_id, original_topic, body, properties, replay_count
         FROM dlq_messages WHERE message_id = $1 AND ($2::text IS NULL OR consumer_group = $2)",
    )
    .bind(&req.message_id)
    .bind(&req.group)
    .fetch_all(pool)
    .await?;
    if entries.len() > 1 {
        return Err(ReplayError::Ambiguous {
            id: req.message_id.clone(),
            groups: entries
                .iter()
                .map(|e| e.consumer_group.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let entry = entries
        .pop()
        .ok_or_else(|| ReplayError::Unknown(req.message_id.clone()))?;
    let group = entry.consumer_group.clone();
    let facts = gather(pool, names, &group, &req.message_id, &entry, req.retention).await?;
    let checks = verdicts(&facts, &req.force);
    let mut decision = decide(&checks, req.dry_run);
    // The entry's own state may refuse what the checks allow (dlq::entry).
    let in_flight = replay_in_flight(pool, &group, &req.message_id).await?;
    let refused = next(
        entry.status,
        EntryMove::ReplaySent,
        MoveFacts {
            include_replayed: req.include_replayed,
            in_flight,
        },
    )
    .err();
    if refused.is_some() {
        decision = ReplayDecision::Blocked;
    }
    let replay_id = ReplayId::generate();
    let report = ReplayReport {
        replay_id: Some(replay_id.clone()),
        consumer_group: group,
        message_id: req.message_id.clone(),
        ticket_id: entry.ticket_id.clone(),
        checks,
        decision,
        outcome: ReplayOutcome::NotSent,
        replay_count: entry.replay_count + 1,
        detail: match (decision, refused) {
            (_, Some(why)) => format!("not replayed: {why}; nothing was sent"),
            (ReplayDecision::Blocked, None) => "blocked by a pre-check; nothing was sent".into(),
            (ReplayDecision::DryRun, None) => "dry run; nothing was sent".into(),
            (ReplayDecision::Sent | ReplayDecision::Discarded, None) => String::new(),
        },
    };
    audit_open(pool, &replay_id, &report, req).await?;
    // The operator audit log's intent, before anything is sent: the send
    // goes to the broker, not PostgreSQL (docs/security.md).
    let command = if req.dry_run {
        "dlq replay --dry-run"
    } else {
        "dlq replay"
    };
    let intent = audit::Entry::new(
        command,
        vec![
            req.message_id.to_string(),
            report.consumer_group.clone(),
            replay_id.to_string(),
        ],
    )
    .reason(Some(req.reason.trim()))
    .before(serde_json::json!({
        "status": entry.status,
        "replay_count": entry.replay_count,
        "decision": report.decision,
    }));
    let op_audit = audit::open(pool, &req.actor, &intent).await?;
    Ok(Prepared {
        replay_id,
        report,
        entry,
        facts,
        confirmed: false,
        op_audit,
    })
}

/// Marks the entry REPLAYING and sends it once `slot` is ready. True when
/// CONFIRMED. The slot is awaited after all database work and right before
/// the producer call, so a bulk run's pacer limits the sends themselves
/// (§9.3), not the bookkeeping around them.
pub(super) async fn send<P: Producer>(
    pool: &PgPool,
    producer: &P,
    p: &mut Prepared,
    slot: impl Future<Output = ()>,
) -> Result<bool, sqlx::Error> {
    let (group, id) = (&p.report.consumer_group, &p.report.message_id);
    // Fenced on the status and count this replay read: of two operators
    // replaying the same entry at once, one sends it (dlq::entry).
    let took = sqlx::query(
        "UPDATE dlq_messages SET status = 'REPLAYING', replay_count = $3
         WHERE consumer_group = $1 AND message_id = $2 AND status = $4 AND replay_count = $5",
    )
    .bind(group)
    .bind(id)
    .bind(p.report.replay_count)
    .bind(p.entry.status)
    .bind(p.entry.replay_count)
    .execute(pool)
    .await?
    .rows_affected();
    if took == 0 {
        p.report.decision = ReplayDecision::Blocked;
        p.report.detail = format!(
            "not replayed: {}; nothing was sent",
            crate::dlq::entry::EntryRefusal::InFlight
        );
        return Ok(false);
    }
    let msg = replay_message(&p.entry, id, &p.replay_id, p.report.replay_count);
    slot.await;
    match producer.send(msg, Duration::from_secs(3)).await {
        SendOutcome::Confirmed(r) => {
            p.report.detail = format!("sent to {} as {}", p.entry.original_topic, r.broker_msg_id);
            p.confirmed = true;
        }
        SendOutcome::Unknown { detail, .. } => {
            // It may have been stored: the entry stays REPLAYING, and a
            // later replay with the same message_id is still safe (§9.5).
            p.report.outcome = ReplayOutcome::SendUnknown;
            p.report.detail = format!("send outcome unknown: {detail}");
        }
        SendOutcome::DefiniteFailure { detail, .. } => {
            p.report.outcome = ReplayOutcome::SendFailed;
            p.report.detail = format!("send failed: {detail}");
            sqlx::query(
                "UPDATE dlq_messages SET status = 'DEAD'
                 WHERE consumer_group = $1 AND message_id = $2 AND status = 'REPLAYING'",
            )
            .bind(group)
            .bind(id)
            .execute(pool)
            .await?;
        }
    }
    Ok(p.confirmed)
}

/// Records the verdict on the entry and closes the audit row.
pub(super) async fn finish(pool: &PgPool, p: &mut Prepared) -> Result<(), sqlx::Error> {
    if p.report.outcome == ReplayOutcome::VerifyFailed {
        p.report
            .detail
            .push_str("; not verified in time: check `seckillctl dlq show`");
    }
    let (group, id) = (&p.report.consumer_group, &p.report.message_id);
    match p.report.outcome {
        ReplayOutcome::Verified => {
            for from in [
                DlqEntryStatus::Replaying,
                DlqEntryStatus::Replayed,
                DlqEntryStatus::Dead,
            ] {
                if verifier::mark_verified(pool, group, id, from).await? {
                    break;
                }
            }
        }
        // Only if still REPLAYING: the mirror may have found the copy dead
        // again meanwhile, and DEAD says more than REPLAYED.
        ReplayOutcome::VerifyFailed => {
            sqlx::query(
                "UPDATE dlq_messages SET status = 'REPLAYED'
                 WHERE consumer_group = $1 AND message_id = $2 AND status = 'REPLAYING'",
            )
            .bind(group)
            .bind(id)
            .execute(pool)
            .await?;
        }
        _ => {}
    }
    audit_close(pool, &p.replay_id, p.report.outcome).await?;
    let status: Option<DlqEntryStatus> = sqlx::query_scalar(
        "SELECT status FROM dlq_messages WHERE consumer_group = $1 AND message_id = $2",
    )
    .bind(group)
    .bind(id)
    .fetch_optional(pool)
    .await?;
    let after = serde_json::json!({ "status": status, "outcome": p.report.outcome });
    audit::complete(pool, p.op_audit, Some(after), outcome_label(&p.report)).await?;
    verifier::tickets_follow(pool).await?;
    Ok(())
}

/// The audit outcome of a replay: its decision when nothing was sent,
/// else how the send ended.
fn outcome_label(r: &ReplayReport) -> &'static str {
    match r.decision {
        ReplayDecision::Sent => r.outcome.as_str(),
        other => other.as_str(),
    }
}

/// Waits for the consumer's verdict (an inbox row past PROCESSING), then
/// checks the per-reservation invariants (docs/architecture.md §9.5, §12).
pub(super) async fn verify(
    pool: &PgPool,
    group: &str,
    message_id: &MessageId,
    facts: &Facts,
    within: Duration,
) -> Result<ReplayOutcome, sqlx::Error> {
    let deadline = Instant::now() + within;
    loop {
        // The projection keeps no inbox (it compares aggregate versions):
        // there is nothing to wait for.
        match verifier::effect_exists(pool, facts.kind, group, message_id).await? {
            Some(true) | None => return Ok(ReplayOutcome::Verified),
            Some(false) if Instant::now() >= deadline => return Ok(ReplayOutcome::VerifyFailed),
            Some(false) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Another replay of this entry is running now: an audit row that was
/// sent and has no outcome yet, younger than any verification wait.
async fn replay_in_flight(
    pool: &PgPool,
    group: &str,
    message_id: &MessageId,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM replay_audit
                        WHERE consumer_group = $1 AND message_id = $2 AND decision = 'SENT'
                          AND outcome = 'PENDING' AND created_at > now() - interval '10 minutes')",
    )
    .bind(group)
    .bind(message_id)
    .fetch_one(pool)
    .await
}

/// The audit row of §9.4, written before anything is sent, so a crash
/// mid-replay still leaves the attempt on record (outcome PENDING).
async fn audit_open(
    pool: &PgPool,
    replay_id: &ReplayId,
    r: &ReplayReport,
    req: &ReplayRequest,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO replay_audit (replay_id, consumer_group, message_id, ticket_id, operator, reason,
                                   checks, decision, forced, outcome, replay_count)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'PENDING', $10)",
    )
    .bind(replay_id)
    .bind(&r.consumer_group)
    .bind(&r.message_id)
    .bind(&r.ticket_id)
    .bind(&req.actor.name)
    .bind(req.reason.trim())
    .bind(serde_json::to_value(&r.checks).unwrap_or_default())
    .bind(r.decision)
    .bind(req.force.iter().map(|c| c.as_str()).collect::<Vec<_>>())
    .bind(r.replay_count)
    .execute(pool)
    .await?;
    Ok(())
}

async fn audit_close(
    pool: &PgPool,
    replay_id: &ReplayId,
    outcome: ReplayOutcome,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE replay_audit SET outcome = $2, finished_at = now() WHERE replay_id = $1")
        .bind(replay_id)
        .bind(outcome)
        .execute(pool)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(replay_id: Option<ReplayId>) -> ReplayReport {
        ReplayReport {
            replay_id,
            consumer_group: "G".into(),
            message_id: MessageId::generate(),
            ticket_id: Some(TicketId::generate()),
            checks: Vec::new(),
            decision: ReplayDecision::Blocked,
            outcome: ReplayOutcome::NotSent,
            replay_count: 0,
            detail: String::new(),
        }
    }

    #[test]
    fn the_report_serializes_its_ids_as_the_strings_it_always_had() {
        let r = report(None);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["replay_id"], "", "never attempted");
        assert_eq!(json["message_id"], r.message_id.as_str());
        assert_eq!(json["ticket_id"], r.ticket_id.as_ref().unwrap().as_str());
        let id = ReplayId::generate();
        let json = serde_json::to_value(report(Some(id.clone()))).unwrap();
        assert_eq!(json["replay_id"], id.as_str());
    }

    #[test]
    fn a_replay_keeps_the_original_message_id_and_adds_the_lineage() {
        let e = Entry {
            status: DlqEntryStatus::Dead,
            dead_at: Utc::now(),
            consumer_group: "G".into(),
            ticket_id: None,
            original_topic: "T".into(),
            body: b"{}".to_vec(),
            properties: serde_json::json!({"TAGS": "CREATE_ORDER", "KEYS": "rsv_1 ord_1", "UNIQ_KEY": "x"}),
            replay_count: 0,
        };
        let (id, rpl) = (MessageId::generate(), ReplayId::generate());
        let m = replay_message(&e, &id, &rpl, 2);
        assert_eq!((m.topic.as_str(), m.tag.as_str()), ("T", "CREATE_ORDER"));
        assert_eq!(m.keys, ["rsv_1", "ord_1"]);
        assert_eq!(
            m.properties,
            [
                (PROP_MESSAGE_ID.to_owned(), id.to_string()),
                (PROP_REPLAY_ID.to_owned(), rpl.to_string()),
                (PROP_REPLAY_COUNT.to_owned(), "2".to_owned()),
            ]
        );
    }
}
