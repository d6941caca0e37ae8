//! Guarded replay of one dead message (docs/architecture.md §9.3–9.5, §9.3).
//!
//! A replay re-sends the *original* body to the *original* topic with the
//! *original* `message_id`, plus `replay_id` and `replay_count + 1`. It
//! never mints a new `message_id`: the inbox must be able to recognise a
//! message it already applied. Before sending, the pre-checks gather the
//! business facts and [`verdicts`] (pure) turns them into pass, warn or
//! block; [`decide`] sends only when nothing blocks. Every attempt, dry runs
//! and refusals included, writes one `replay_audit` row.

use crate::domain::message::{parse_cancel, parse_order_create, parse_order_event, parse_release};
use crate::domain::status::{DlqEntryStatus, ReplayDecision, ReplayOutcome};
use crate::mq::{
    Names, OutgoingMessage, PROP_MESSAGE_ID, PROP_REPLAY_COUNT, PROP_REPLAY_ID, PROP_TRACEPARENT,
    Producer, SendOutcome, TopicKind,
};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// One pre-check of docs/architecture.md §9.3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// The message is in the DLQ mirror (body and topic are known).
    Mirrored,
    /// The group's inbox does not hold the `message_id` yet.
    Inbox,
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
    pub const ALL: [Check; 8] = [
        Check::Mirrored,
        Check::Inbox,
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
    /// Missing data and an unsupported body can never be forced.
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

impl FromStr for Check {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Check::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Check::ALL.iter().map(|c| c.as_str()).collect();
                format!("unknown check {s:?}; one of {}", names.join(", "))
            })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Level {
    Pass,
    Warn,
    Block,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub check: Check,
    pub level: Level,
    pub evidence: String,
    /// An operator's `--force` turned a block into this warning.
    pub forced: bool,
}

/// Everything the pre-checks look at, gathered read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub mirrored: bool,
    pub kind: Option<TopicKind>,
    /// The inbox row of this group for the message: (status, result code).
    pub inbox: Option<(String, Option<String>)>,
    pub order_status: Option<String>,
    pub compensation: Option<String>,
    pub ledger_rows: i64,
    /// `Err(why)` when the body does not parse.
    pub schema: Result<(), String>,
    pub valid_until: Option<DateTime<Utc>>,
    pub now: DateTime<Utc>,
}

/// The verdict of every check (pure). `forced` turns the named blocks into
/// warnings, when the check allows it.
pub fn verdicts(f: &Facts, forced: &[Check]) -> Vec<Verdict> {
    let order_create = f.kind == Some(TopicKind::OrderCreate);
    let na = || (Level::Pass, "not applicable to this group".to_owned());
    let mut out = Vec::new();
    for check in Check::ALL {
        let (level, evidence) = match check {
            Check::Mirrored if f.mirrored => {
                (Level::Pass, "body and topic kept in dlq_messages".into())
            }
            Check::Mirrored => (
                Level::Block,
                "not in the DLQ mirror; nothing to replay".into(),
            ),
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
            Check::Order if !order_create => na(),
            Check::Order => match &f.order_status {
                None => (Level::Pass, "no order for this reservation yet".into()),
                Some(s) => (Level::Block, format!("the order exists ({s})")),
            },
            Check::Compensation if !order_create => na(),
            Check::Compensation => match &f.compensation {
                None => (Level::Pass, "the reservation was not compensated".into()),
                Some(s) => (
                    Level::Block,
                    format!("the reservation was compensated ({s}); its stock went back"),
                ),
            },
            Check::Ledger if !order_create => na(),
            Check::Ledger if f.ledger_rows == 0 => (Level::Pass, "no ledger row".into()),
            Check::Ledger => (
                Level::Block,
                format!("{} ledger row(s) for the reservation", f.ledger_rows),
            ),
            Check::Schema => match &f.schema {
                Ok(()) => (Level::Pass, "the body parses (schema_version 1)".into()),
                Err(why) => (Level::Block, format!("the body does not parse: {why}")),
            },
            Check::Validity if !order_create => na(),
            Check::Validity => match f.valid_until {
                Some(v) if v > f.now => (
                    Level::Pass,
                    format!("valid for {} s more", (v - f.now).num_seconds()),
                ),
                Some(v) => (
                    Level::Warn,
                    format!(
                        "expired {} s ago: the replay will be rejected (REJECTED_EXPIRED) and compensated once",
                        (f.now - v).num_seconds()
                    ),
                ),
                None => (Level::Pass, "no validity in the body".into()),
            },
            Check::Idempotent => (
                Level::Pass,
                match f.kind {
                    Some(TopicKind::OrderEvent) => {
                        "the projection keeps only newer aggregate_versions".into()
                    }
                    _ => "the only consumer group keeps an inbox on message_id".into(),
                },
            ),
        };
        let force = level == Level::Block && check.forceable() && forced.contains(&check);
        out.push(Verdict {
            check,
            level: if force { Level::Warn } else { level },
            evidence: if force {
                format!("{evidence} (forced)")
            } else {
                evidence
            },
            forced: force,
        });
    }
    out
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

/// What the operator asked for.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    pub message_id: String,
    /// Needed only when the message is dead in more than one group.
    pub group: Option<String>,
    pub reason: String,
    pub operator: String,
    pub dry_run: bool,
    pub force: Vec<Check>,
    /// How long to wait for the consumer's verdict after sending.
    pub verify_within: Duration,
}

/// The answer: the verdict table, the decision and how it ended.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub replay_id: String,
    pub consumer_group: String,
    pub message_id: String,
    pub ticket_id: Option<String>,
    pub checks: Vec<Verdict>,
    pub decision: ReplayDecision,
    pub outcome: ReplayOutcome,
    pub replay_count: i32,
    pub detail: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("--reason is required and must not be empty: say why this replay is safe")]
    NoReason,
    #[error("no dead message {0}; list them with `seckillctl dlq list`")]
    Unknown(String),
    #[error("{id} is dead in several groups ({groups}); choose one with --group")]
    Ambiguous { id: String, groups: String },
    #[error("--force {0} is not allowed: that check protects data, not idempotency")]
    NotForceable(Check),
    #[error("no ticket {0}; list them with `seckillctl dlq ticket list`")]
    UnknownTicket(String),
    #[error("ticket {0} is CLOSED; reopen work under a new ticket, or replay one --message-id")]
    ClosedTicket(String),
    #[error("--rate must be a positive number of messages per second, not {0}")]
    BadRate(f64),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

#[derive(sqlx::FromRow)]
struct Entry {
    consumer_group: String,
    ticket_id: Option<String>,
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

fn parse_for(kind: Option<TopicKind>, body: &[u8]) -> Result<(), String> {
    let r = match kind {
        Some(TopicKind::OrderCreate) => parse_order_create(body).map(|_| ()),
        Some(TopicKind::OrderTimeout) => parse_cancel(body).map(|_| ()),
        Some(TopicKind::OrderEvent) => parse_order_event(body).map(|_| ()),
        Some(TopicKind::InventoryCompensate) => parse_release(body).map(|_| ()),
        None => return Err("not a seckill consumer group".into()),
    };
    r.map_err(|e| e.to_string())
}

async fn gather(
    pool: &PgPool,
    names: &Names,
    group: &str,
    message_id: &str,
    e: &Entry,
) -> Result<Facts, sqlx::Error> {
    let kind = kind_of(names, group);
    let body: serde_json::Value = serde_json::from_slice(&e.body).unwrap_or_default();
    let inbox: Option<(String, Option<String>)> = sqlx::query_as(
        "SELECT status::text, result_code FROM consumer_inbox WHERE consumer_group = $1 AND message_id = $2",
    )
    .bind(group)
    .bind(message_id)
    .fetch_optional(pool)
    .await?;
    let rsv = body["reservation_id"].as_str().unwrap_or_default();
    let order_status: Option<String> =
        sqlx::query_scalar("SELECT status::text FROM orders WHERE reservation_id = $1")
            .bind(rsv)
            .fetch_optional(pool)
            .await?;
    let compensation: Option<String> = sqlx::query_scalar(
        "SELECT source::text || ', ' || status::text FROM compensation_tasks WHERE reservation_id = $1",
    )
    .bind(rsv)
    .fetch_optional(pool)
    .await?;
    let ledger_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inventory_ledger WHERE reservation_id = $1")
            .bind(rsv)
            .fetch_one(pool)
            .await?;
    let valid_until = body["reservation_valid_until"]
        .as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc));
    Ok(Facts {
        mirrored: true,
        kind,
        inbox,
        order_status,
        compensation,
        ledger_rows,
        schema: parse_for(kind, &e.body),
        valid_until,
        now: Utc::now(),
    })
}

/// The broker message of a replay: the original topic, tag, keys, body and
/// `message_id`, plus the replay lineage. No other system property is
/// copied from the dead copy.
fn replay_message(e: &Entry, message_id: &str, replay_id: &str, count: i32) -> OutgoingMessage {
    let prop = |k: &str| e.properties[k].as_str().map(str::to_owned);
    let mut properties = vec![
        (PROP_MESSAGE_ID.to_owned(), message_id.to_owned()),
        (PROP_REPLAY_ID.to_owned(), replay_id.to_owned()),
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
    if p.report.decision == ReplayDecision::Sent && send(pool, producer, &mut p, None).await? {
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

fn validate(reason: &str, force: &[Check]) -> Result<(), ReplayError> {
    if reason.trim().is_empty() {
        return Err(ReplayError::NoReason);
    }
    if let Some(c) = force.iter().find(|c| !c.forceable()) {
        return Err(ReplayError::NotForceable(*c));
    }
    Ok(())
}

/// A replay between its pre-checks and its verdict.
struct Prepared {
    report: ReplayReport,
    entry: Entry,
    facts: Facts,
    /// The send was CONFIRMED; the outcome waits for verification.
    confirmed: bool,
}

/// Finds the entry, runs the pre-checks and opens the audit row.
/// The pre-check verdicts of one dead message, read-only: no audit row,
/// nothing sent. What a screen shows before anyone asks for a replay.
pub async fn precheck(
    pool: &PgPool,
    names: &Names,
    group: &str,
    message_id: &str,
) -> Result<Vec<Verdict>, ReplayError> {
    let entry: Entry = sqlx::query_as(
        "SELECT consumer_group, ticket_id, original_topic, body, properties, replay_count
         FROM dlq_messages WHERE message_id = $1 AND consumer_group = $2",
    )
    .bind(message_id)
    .bind(group)
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| ReplayError::Unknown(message_id.to_owned()))?;
    let facts = gather(pool, names, group, message_id, &entry).await?;
    Ok(verdicts(&facts, &[]))
}

async fn prepare(
    pool: &PgPool,
    names: &Names,
    req: &ReplayRequest,
) -> Result<Prepared, ReplayError> {
    let mut entries: Vec<Entry> = sqlx::query_as(
        "SELECT consumer_group, ticket_id, original_topic, body, properties, replay_count
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
    let facts = gather(pool, names, &group, &req.message_id, &entry).await?;
    let checks = verdicts(&facts, &req.force);
    let decision = decide(&checks, req.dry_run);
    let report = ReplayReport {
        replay_id: format!("rpl_{}", ulid::Ulid::new()),
        consumer_group: group,
        message_id: req.message_id.clone(),
        ticket_id: entry.ticket_id.clone(),
        checks,
        decision,
        outcome: ReplayOutcome::NotSent,
        replay_count: entry.replay_count + 1,
        detail: match decision {
            ReplayDecision::Blocked => "blocked by a pre-check; nothing was sent".into(),
            ReplayDecision::DryRun => "dry run; nothing was sent".into(),
            ReplayDecision::Sent => String::new(),
        },
    };
    audit_open(pool, &report, req).await?;
    Ok(Prepared {
        report,
        entry,
        facts,
        confirmed: false,
    })
}

/// Marks the entry REPLAYING and sends it. True when CONFIRMED.
async fn send<P: Producer>(
    pool: &PgPool,
    producer: &P,
    p: &mut Prepared,
    pacer: Option<&mut Pacer>,
) -> Result<bool, sqlx::Error> {
    let (group, id) = (&p.report.consumer_group, &p.report.message_id);
    sqlx::query(
        "UPDATE dlq_messages SET status = 'REPLAYING', replay_count = $3
         WHERE consumer_group = $1 AND message_id = $2",
    )
    .bind(group)
    .bind(id)
    .bind(p.report.replay_count)
    .execute(pool)
    .await?;
    let msg = replay_message(&p.entry, id, &p.report.replay_id, p.report.replay_count);
    if let Some(pacer) = pacer {
        pacer.wait().await;
    }
    match producer.send(msg, Duration::from_secs(3)).await {
        SendOutcome::Confirmed(r) => {
            p.report.detail = format!("sent to {} as {}", p.entry.original_topic, r.broker_msg_id);
            p.confirmed = true;
        }
        SendOutcome::Unknown { detail, .. } => {
            // It may have been stored: the entry stays REPLAYING, and a
            // later replay with the same message_id is still safe.
            p.report.outcome = ReplayOutcome::SendUnknown;
            p.report.detail = format!("send outcome unknown: {detail}");
        }
        SendOutcome::DefiniteFailure { detail, .. } => {
            p.report.outcome = ReplayOutcome::SendFailed;
            p.report.detail = format!("send failed: {detail}");
            sqlx::query(
                "UPDATE dlq_messages SET status = 'DEAD' WHERE consumer_group = $1 AND message_id = $2",
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
async fn finish(pool: &PgPool, p: &mut Prepared) -> Result<(), sqlx::Error> {
    if p.report.outcome == ReplayOutcome::VerifyFailed {
        p.report
            .detail
            .push_str("; not verified in time: check `seckillctl dlq show`");
    }
    let status = match p.report.outcome {
        ReplayOutcome::Verified => Some(DlqEntryStatus::Verified),
        ReplayOutcome::VerifyFailed => Some(DlqEntryStatus::Replayed),
        _ => None,
    };
    if let Some(s) = status {
        sqlx::query(
            "UPDATE dlq_messages
             SET status = $3, verified_at = CASE WHEN $3 = 'VERIFIED' THEN now() ELSE verified_at END
             WHERE consumer_group = $1 AND message_id = $2",
        )
        .bind(&p.report.consumer_group)
        .bind(&p.report.message_id)
        .bind(s)
        .execute(pool)
        .await?;
    }
    audit_close(pool, &p.report).await
}

/// A bulk replay of one ticket (docs/architecture.md §9.3, `--ticket`).
#[derive(Debug, Clone)]
pub struct BulkRequest {
    pub ticket: String,
    pub reason: String,
    pub operator: String,
    pub dry_run: bool,
    pub force: Vec<Check>,
    /// Sends per second at most.
    pub rate_per_s: f64,
    /// Entries replayed and verified one by one before the rest go.
    pub canary: usize,
    pub verify_within: Duration,
}

/// Every entry of the snapshot with its outcome: nothing is dropped silently.
#[derive(Debug, Clone, Serialize)]
pub struct BulkReport {
    pub ticket_id: String,
    /// DEAD entries of the ticket when the command started.
    pub snapshot: usize,
    /// Entries a previous run already sent (resumed, not re-sent).
    pub skipped: Vec<String>,
    /// Why the run stopped early, if it did.
    pub halted: Option<String>,
    pub entries: Vec<ReplayReport>,
}

/// When the `i`-th paced send (0-based) may go, measured from the first,
/// so at most `rate` go out per second (pure).
pub fn pace(i: usize, rate_per_s: f64) -> Duration {
    if rate_per_s <= 0.0 || !rate_per_s.is_finite() {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(i as f64 / rate_per_s)
}

/// Holds each broker send to its slot: the rate limits the sends
/// themselves, so the schedule is anchored on the first one and the wait
/// sits right before the producer call, after all database work.
struct Pacer {
    rate_per_s: f64,
    first: Option<Instant>,
    sent: usize,
}

impl Pacer {
    fn new(rate_per_s: f64) -> Self {
        Self {
            rate_per_s,
            first: None,
            sent: 0,
        }
    }

    async fn wait(&mut self) {
        let first = *self.first.get_or_insert_with(Instant::now);
        tokio::time::sleep_until((first + pace(self.sent, self.rate_per_s)).into()).await;
        self.sent += 1;
    }
}

/// Replays the DEAD entries of a ticket: the canaries first, each verified
/// before the next; then the rest at the rate, verified after sending.
/// Resumable: entries a previous run sent are no longer DEAD and are
/// reported as skipped, never sent twice.
pub async fn replay_ticket<P: Producer>(
    pool: &PgPool,
    names: &Names,
    producer: &P,
    req: &BulkRequest,
) -> Result<BulkReport, ReplayError> {
    validate(&req.reason, &req.force)?;
    if !(req.rate_per_s > 0.0 && req.rate_per_s.is_finite()) {
        return Err(ReplayError::BadRate(req.rate_per_s));
    }
    let status: Option<crate::domain::status::TicketStatus> =
        sqlx::query_scalar("SELECT status FROM dlq_tickets WHERE ticket_id = $1")
            .bind(&req.ticket)
            .fetch_optional(pool)
            .await?;
    match status {
        None => return Err(ReplayError::UnknownTicket(req.ticket.clone())),
        Some(crate::domain::status::TicketStatus::Closed) => {
            return Err(ReplayError::ClosedTicket(req.ticket.clone()));
        }
        Some(_) => {}
    }
    let all: Vec<(String, String, DlqEntryStatus)> = sqlx::query_as(
        "SELECT consumer_group, message_id, status FROM dlq_messages
         WHERE ticket_id = $1 ORDER BY dead_at, message_id",
    )
    .bind(&req.ticket)
    .fetch_all(pool)
    .await?;
    let (snapshot, done): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|(_, _, s)| *s == DlqEntryStatus::Dead);
    let mut report = BulkReport {
        ticket_id: req.ticket.clone(),
        snapshot: snapshot.len(),
        skipped: done.into_iter().map(|(_, id, _)| id).collect(),
        halted: None,
        entries: Vec::new(),
    };
    if !req.dry_run && !snapshot.is_empty() {
        set_ticket(pool, &req.ticket, "REPLAYING").await?;
    }
    let one = |group: &str, id: &str| ReplayRequest {
        message_id: id.to_owned(),
        group: Some(group.to_owned()),
        reason: req.reason.clone(),
        operator: req.operator.clone(),
        dry_run: req.dry_run,
        force: req.force.clone(),
        verify_within: req.verify_within,
    };
    let canaries = req.canary.min(snapshot.len());
    for (group, id, _) in &snapshot[..canaries] {
        let r = replay(pool, names, producer, &one(group, id)).await?;
        let ok = r.outcome == ReplayOutcome::Verified || r.decision == ReplayDecision::DryRun;
        report.entries.push(r);
        if !ok {
            report.halted = Some(format!(
                "canary {id} did not verify; the other {} entries were not sent",
                snapshot.len() - report.entries.len()
            ));
            break;
        }
    }
    let mut in_flight = Vec::new();
    if report.halted.is_none() {
        let mut pacer = Pacer::new(req.rate_per_s);
        for (group, id, _) in &snapshot[canaries..] {
            let mut p = prepare(pool, names, &one(group, id)).await?;
            if p.report.decision == ReplayDecision::Sent {
                send(pool, producer, &mut p, Some(&mut pacer)).await?;
            }
            in_flight.push(p);
        }
    }
    let deadline = Instant::now() + req.verify_within;
    for mut p in in_flight {
        if p.confirmed {
            let left = deadline.saturating_duration_since(Instant::now());
            p.report.outcome = verify(
                pool,
                &p.report.consumer_group,
                &p.report.message_id,
                &p.facts,
                left,
            )
            .await?;
        }
        finish(pool, &mut p).await?;
        report.entries.push(p.report);
    }
    // The halted rest: listed, never silently dropped.
    for (group, id, _) in snapshot.iter().skip(report.entries.len()) {
        report.entries.push(ReplayReport {
            replay_id: String::new(),
            consumer_group: group.clone(),
            message_id: id.clone(),
            ticket_id: Some(req.ticket.clone()),
            checks: Vec::new(),
            decision: ReplayDecision::Blocked,
            outcome: ReplayOutcome::NotSent,
            replay_count: 0,
            detail: "not attempted: the canary failed".into(),
        });
    }
    if !req.dry_run && report.halted.is_none() {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM dlq_messages WHERE ticket_id = $1 AND status <> 'VERIFIED'",
        )
        .bind(&req.ticket)
        .fetch_one(pool)
        .await?;
        if open == 0 {
            set_ticket(pool, &req.ticket, "VERIFIED").await?;
        }
    }
    Ok(report)
}

async fn set_ticket(pool: &PgPool, ticket: &str, status: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE dlq_tickets SET status = $2::ticket_status, updated_at = now()
         WHERE ticket_id = $1 AND status <> 'CLOSED'",
    )
    .bind(ticket)
    .bind(status)
    .execute(pool)
    .await?;
    Ok(())
}

/// Waits for the consumer's verdict (an inbox row past PROCESSING), then
/// checks the per-reservation invariants (docs/architecture.md §12).
async fn verify(
    pool: &PgPool,
    group: &str,
    message_id: &str,
    facts: &Facts,
    within: Duration,
) -> Result<ReplayOutcome, sqlx::Error> {
    let deadline = Instant::now() + within;
    loop {
        let done: Option<bool> = sqlx::query_scalar(
            "SELECT status <> 'PROCESSING' FROM consumer_inbox WHERE consumer_group = $1 AND message_id = $2",
        )
        .bind(group)
        .bind(message_id)
        .fetch_optional(pool)
        .await?;
        if done == Some(true) || (facts.kind == Some(TopicKind::OrderEvent) && done.is_none()) {
            break;
        }
        if Instant::now() >= deadline {
            return Ok(ReplayOutcome::VerifyFailed);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if facts.kind != Some(TopicKind::OrderCreate) {
        return Ok(ReplayOutcome::Verified);
    }
    // Uniqueness per reservation is the schema's (orders, ledger and
    // compensation keys); what the replay must have produced is a decided
    // reservation with its effect: an order, or a rejection compensated once.
    let broken: i64 = sqlx::query_scalar(
        "WITH body AS (SELECT convert_from(body, 'UTF8')::jsonb ->> 'reservation_id' AS rsv
                       FROM dlq_messages WHERE consumer_group = $1 AND message_id = $2)
         SELECT count(*) FROM body
         WHERE NOT EXISTS (
             SELECT 1 FROM reservations r
             WHERE r.reservation_id = body.rsv
               AND (r.outcome = 'ORDER_CREATED'
                        AND EXISTS (SELECT 1 FROM orders o WHERE o.reservation_id = r.reservation_id)
                    OR r.outcome <> 'ORDER_CREATED'
                        AND EXISTS (SELECT 1 FROM compensation_tasks c WHERE c.reservation_id = r.reservation_id)))",
    )
    .bind(group)
    .bind(message_id)
    .fetch_one(pool)
    .await?;
    Ok(if broken == 0 {
        ReplayOutcome::Verified
    } else {
        ReplayOutcome::VerifyFailed
    })
}

async fn audit_open(
    pool: &PgPool,
    r: &ReplayReport,
    req: &ReplayRequest,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO replay_audit (replay_id, consumer_group, message_id, ticket_id, operator, reason,
                                   checks, decision, forced, outcome, replay_count)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'PENDING', $10)",
    )
    .bind(&r.replay_id)
    .bind(&r.consumer_group)
    .bind(&r.message_id)
    .bind(&r.ticket_id)
    .bind(&req.operator)
    .bind(req.reason.trim())
    .bind(serde_json::to_value(&r.checks).unwrap_or_default())
    .bind(r.decision)
    .bind(req.force.iter().map(|c| c.as_str()).collect::<Vec<_>>())
    .bind(r.replay_count)
    .execute(pool)
    .await?;
    Ok(())
}

async fn audit_close(pool: &PgPool, r: &ReplayReport) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE replay_audit SET outcome = $2, finished_at = now() WHERE replay_id = $1")
        .bind(&r.replay_id)
        .bind(r.outcome)
        .execute(pool)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Facts {
        let now = Utc::now();
        Facts {
            mirrored: true,
            kind: Some(TopicKind::OrderCreate),
            inbox: None,
            order_status: None,
            compensation: None,
            ledger_rows: 0,
            schema: Ok(()),
            valid_until: Some(now + chrono::Duration::minutes(1)),
            now,
        }
    }

    fn level(v: &[Verdict], c: Check) -> Level {
        v.iter().find(|v| v.check == c).map(|v| v.level).unwrap()
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
            inbox: Some(("SUCCEEDED".into(), Some("ORDER_CREATED".into()))),
            order_status: Some("CREATED".into()),
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
            schema: Err("schema_version 2 is not supported".into()),
            ..fresh()
        };
        let v = verdicts(&f, &[Check::Mirrored, Check::Schema]);
        assert_eq!(level(&v, Check::Mirrored), Level::Block);
        assert_eq!(level(&v, Check::Schema), Level::Block);
        assert!(!Check::Mirrored.forceable() && !Check::Schema.forceable());
        assert_eq!("inbox".parse::<Check>(), Ok(Check::Inbox));
        assert!("nope".parse::<Check>().unwrap_err().contains("one of"));
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
            order_status: Some("CANCELED".into()),
            ledger_rows: 2,
            ..fresh()
        };
        let v = verdicts(&f, &[]);
        assert_eq!(decide(&v, false), ReplayDecision::Sent, "{v:#?}");
    }
}
