//! Bulk replay of one ticket (docs/architecture.md §9.3, `--ticket`): a
//! snapshot of its DEAD entries, canaries replayed and verified one by one,
//! the rest sent at the rate and verified after, and the ticket's outcome.
//! Each step is its own function; [`replay_ticket`] only strings them.

use super::checks::{Check, RATE_RANGE, pace};
use super::single::{
    Prepared, ReplayError, ReplayReport, ReplayRequest, finish, prepare, replay, send, validate,
    verify,
};
use crate::dlq::entry::{EntryMove, MoveFacts, next};
use crate::dlq::key::DlqEntryKey;
use crate::domain::auth::Actor;
use crate::domain::ids::{MessageId, TicketId};
use crate::domain::status::{DlqEntryStatus, ReplayDecision, ReplayOutcome, TicketStatus};
use crate::mq::{Names, Producer};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::time::{Duration, Instant};

/// A bulk replay of one ticket (docs/architecture.md §9.3, `--ticket`).
#[derive(Debug, Clone)]
pub struct BulkRequest {
    pub ticket: TicketId,
    pub reason: String,
    /// Who asks; every entry's replay is audited under this actor.
    pub actor: Actor,
    pub dry_run: bool,
    pub force: Vec<Check>,
    /// Sends per second at most.
    pub rate_per_s: f64,
    /// Send again the entries whose earlier replay went out unverified
    /// (REPLAYED, or REPLAYING after an unknown send).
    pub include_replayed: bool,
    /// Entries replayed and verified one by one before the rest go.
    pub canary: usize,
    pub verify_within: Duration,
    /// The broker's retention of dead messages (`[dlq] broker_retention_hours`).
    pub retention: Duration,
}

/// Every entry of the snapshot with its outcome: nothing is dropped silently.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BulkReport {
    pub ticket_id: TicketId,
    /// DEAD entries of the ticket when the command started.
    pub snapshot: usize,
    /// Entries of the ticket this run did not send, each with why.
    pub skipped: Vec<Skipped>,
    /// Why the run stopped early, if it did.
    pub halted: Option<String>,
    pub entries: Vec<ReplayReport>,
    /// DEAD entries mirrored without a `message_id` (§9.1): in the
    /// snapshot, never sent, since a replay must keep the original id
    /// (§9.4). Absent from the JSON when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreplayable: Vec<DlqEntryKey>,
}

/// An entry a bulk run left alone, and why: nothing is skipped silently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub consumer_group: String,
    pub message_id: DlqEntryKey,
    pub status: DlqEntryStatus,
    pub reason: String,
    /// Its work is done (verified, or discarded on purpose); when false
    /// the entry is left undone and the run does not end clean.
    pub done: bool,
}

/// Holds each broker send to its slot: the rate limits the sends
/// themselves, so the schedule is anchored on the first one and the wait
/// sits right before the producer call, after all database work (§9.3).
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
        // Checked: a slot past what an Instant holds waits a day, and the
        // rate check keeps real runs far from it.
        let slot = first
            .checked_add(pace(self.sent, self.rate_per_s))
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        tokio::time::sleep_until(slot.into()).await;
        self.sent += 1;
    }
}

/// The ticket's entries as the command found them.
struct Snapshot {
    /// Entries to send, with a `message_id`, oldest first: (group, id).
    dead: Vec<(String, MessageId)>,
    /// DEAD entries without one: reported, never sent.
    foreign: Vec<DlqEntryKey>,
    /// The others, with why they are not sent.
    skipped: Vec<Skipped>,
}

/// Replays the DEAD entries of a ticket: the canaries first, each verified
/// before the next; then the rest at the rate, verified after sending.
/// Resumable: entries a previous run sent are no longer DEAD and are
/// reported as skipped, never sent twice (§9.3).
pub async fn replay_ticket<P: Producer>(
    pool: &PgPool,
    names: &Names,
    producer: &P,
    req: &BulkRequest,
) -> Result<BulkReport, ReplayError> {
    validate(&req.reason, &req.force)?;
    if !RATE_RANGE.contains(&req.rate_per_s) {
        return Err(ReplayError::BadRate(req.rate_per_s));
    }
    check_ticket(pool, &req.ticket).await?;
    let snap = snapshot(pool, &req.ticket, req.include_replayed).await?;
    let dead_count = snap.dead.len() + snap.foreign.len();
    let mut report = BulkReport {
        ticket_id: req.ticket.clone(),
        snapshot: dead_count,
        skipped: snap.skipped,
        halted: None,
        entries: Vec::new(),
        unreplayable: snap.foreign,
    };
    if !req.dry_run && dead_count > 0 {
        set_ticket(pool, &req.ticket, TicketStatus::Replaying).await?;
    }
    let canaries = req.canary.min(snap.dead.len());
    report.halted = canary_run(
        pool,
        names,
        producer,
        req,
        &snap.dead[..canaries],
        &mut report.entries,
        snap.dead.len(),
    )
    .await?;
    if report.halted.is_none() {
        let in_flight = paced_sends(pool, names, producer, req, &snap.dead[canaries..]).await?;
        verify_sent(pool, in_flight, req.verify_within, &mut report.entries).await?;
    }
    list_not_attempted(&mut report, &snap.dead);
    outcome(pool, req, &report).await?;
    Ok(report)
}

/// A missing or CLOSED ticket refuses the run before anything is read.
async fn check_ticket(pool: &PgPool, ticket: &TicketId) -> Result<(), ReplayError> {
    let status: Option<TicketStatus> =
        sqlx::query_scalar("SELECT status FROM dlq_tickets WHERE ticket_id = $1")
            .bind(ticket)
            .fetch_optional(pool)
            .await?;
    match status {
        None => Err(ReplayError::UnknownTicket(ticket.clone())),
        Some(TicketStatus::Closed) => Err(ReplayError::ClosedTicket(ticket.clone())),
        Some(_) => Ok(()),
    }
}

/// The snapshot: DEAD entries are replayed (and, with
/// `include_replayed`, those an earlier replay left unverified), so a rerun
/// resumes without re-sending what an earlier run sent (§9.3); every other
/// entry is listed with why (dlq::entry).
async fn snapshot(
    pool: &PgPool,
    ticket: &TicketId,
    include_replayed: bool,
) -> Result<Snapshot, sqlx::Error> {
    let all: Vec<(String, DlqEntryKey, DlqEntryStatus)> = sqlx::query_as(
        "SELECT consumer_group, message_id, status FROM dlq_messages
         WHERE ticket_id = $1 ORDER BY dead_at, message_id",
    )
    .bind(ticket)
    .fetch_all(pool)
    .await?;
    let mut snap = Snapshot {
        dead: Vec::new(),
        foreign: Vec::new(),
        skipped: Vec::new(),
    };
    let facts = MoveFacts {
        include_replayed,
        in_flight: false,
    };
    for (group, key, status) in all {
        match (next(status, EntryMove::ReplaySent, facts), key) {
            (Ok(_), DlqEntryKey::Message(id)) => snap.dead.push((group, id)),
            (Ok(_), key) => snap.foreign.push(key),
            (Err(why), key) => snap.skipped.push(Skipped {
                consumer_group: group,
                message_id: key,
                status,
                reason: why.to_string(),
                done: matches!(status, DlqEntryStatus::Verified | DlqEntryStatus::Discarded),
            }),
        }
    }
    Ok(snap)
}

/// The single-message request for one entry of the ticket.
fn one(req: &BulkRequest, group: &str, id: &MessageId) -> ReplayRequest {
    ReplayRequest {
        message_id: id.clone(),
        group: Some(group.to_owned()),
        reason: req.reason.clone(),
        actor: req.actor.clone(),
        dry_run: req.dry_run,
        force: req.force.clone(),
        verify_within: req.verify_within,
        include_replayed: req.include_replayed,
        retention: req.retention,
    }
}

/// The canaries (the first entries), each replayed and verified before the
/// next: a canary that does not verify halts the run, so a fault that is
/// not fixed costs one message, not the ticket (§9.3). Returns why it
/// halted, if it did.
async fn canary_run<P: Producer>(
    pool: &PgPool,
    names: &Names,
    producer: &P,
    req: &BulkRequest,
    canaries: &[(String, MessageId)],
    entries: &mut Vec<ReplayReport>,
    replayable: usize,
) -> Result<Option<String>, ReplayError> {
    for (group, id) in canaries {
        let r = replay(pool, names, producer, &one(req, group, id)).await?;
        let ok = r.outcome == ReplayOutcome::Verified || r.decision == ReplayDecision::DryRun;
        entries.push(r);
        if !ok {
            return Ok(Some(format!(
                "canary {id} did not verify; the other {} entries were not sent",
                replayable - entries.len()
            )));
        }
    }
    Ok(None)
}

/// The rest, pre-checked and sent at the rate; verification waits until
/// all are out, so a slow consumer does not slow the sends.
async fn paced_sends<P: Producer>(
    pool: &PgPool,
    names: &Names,
    producer: &P,
    req: &BulkRequest,
    rest: &[(String, MessageId)],
) -> Result<Vec<Prepared>, ReplayError> {
    let mut pacer = Pacer::new(req.rate_per_s);
    let mut in_flight = Vec::with_capacity(rest.len());
    for (group, id) in rest {
        let mut p = prepare(pool, names, &one(req, group, id)).await?;
        if p.report.decision == ReplayDecision::Sent {
            send(pool, producer, &mut p, pacer.wait()).await?;
        }
        in_flight.push(p);
    }
    Ok(in_flight)
}

/// Verifies the paced sends against one deadline for the whole batch.
async fn verify_sent(
    pool: &PgPool,
    in_flight: Vec<Prepared>,
    within: Duration,
    entries: &mut Vec<ReplayReport>,
) -> Result<(), sqlx::Error> {
    let deadline = Instant::now() + within;
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
        entries.push(p.report);
    }
    Ok(())
}

/// The entries a halted run never reached: listed, never silently dropped.
fn list_not_attempted(report: &mut BulkReport, dead: &[(String, MessageId)]) {
    for (group, id) in dead.iter().skip(report.entries.len()) {
        report.entries.push(ReplayReport {
            replay_id: None,
            consumer_group: group.clone(),
            message_id: id.clone(),
            ticket_id: Some(report.ticket_id.clone()),
            checks: Vec::new(),
            decision: ReplayDecision::Blocked,
            outcome: ReplayOutcome::NotSent,
            replay_count: 0,
            detail: "not attempted: the canary failed".into(),
        });
    }
}

/// The ticket follows its entries (§9.2, dlq::entry): VERIFIED once every
/// one is VERIFIED or DISCARDED. A dry run changes nothing; a run that
/// left entries undone puts a REPLAYING ticket back to FIXED, so it does
/// not look busy.
async fn outcome(
    pool: &PgPool,
    req: &BulkRequest,
    _report: &BulkReport,
) -> Result<(), sqlx::Error> {
    if req.dry_run {
        return Ok(());
    }
    crate::dlq::verifier::tickets_follow(pool).await?;
    sqlx::query(
        "UPDATE dlq_tickets SET status = 'FIXED', updated_at = now()
         WHERE ticket_id = $1 AND status = 'REPLAYING'",
    )
    .bind(&req.ticket)
    .execute(pool)
    .await?;
    Ok(())
}

async fn set_ticket(
    pool: &PgPool,
    ticket: &TicketId,
    status: TicketStatus,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE dlq_tickets SET status = $2, updated_at = now()
         WHERE ticket_id = $1 AND status <> 'CLOSED'",
    )
    .bind(ticket)
    .bind(status)
    .execute(pool)
    .await?;
    Ok(())
}
