//! The prune of the pipeline's finished history (docs/architecture.md
//! §16.2): `seckillctl db prune` and the daemon's automatic run.
//!
//! Inputs: a [`PruneRequest`] (how much to keep, which tables, the batch,
//! the floor), who runs it, a cancellation token and a progress callback.
//! Outputs: a [`PruneReport`] per table (rows deleted or that would be,
//! batches, the horizon), the `retention_marks` rows, and for an operator
//! run one `operator_audit` row.
//!
//! How a run goes, per table: the horizon is `now() - keep` on
//! PostgreSQL's clock, never the client's; it is written to
//! `retention_marks` (never moving back) and committed before any row is
//! deleted, so the replay pre-check `inbox_kept` (§9.3) sees it first.
//! Then batches: each one statement, its own short transaction, taking the
//! oldest rows through the table's partial index with `SKIP LOCKED` (a
//! consumer or the outbox holding a row is never waited on) and re-checking
//! the whole filter on each row it deletes. A cancellation stops between
//! batches; only a run that reaches the end stamps `updated_at`, so one cut
//! short is not done.

use crate::decide::retention::{self, Refusal};
pub use crate::decide::retention::{DEFAULT_BATCH, MAX_BATCH, PruneTable};
use crate::domain::auth::Actor;
use crate::store::audit::{self, AuditId};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What to prune.
#[derive(Debug, Clone)]
pub struct PruneRequest {
    /// Rows older than this go (`--older-than`, `[retention] keep_hours`).
    pub keep: Duration,
    /// `[dlq] broker_retention_hours`: `keep` may not be below it.
    pub floor: Duration,
    /// In this order; each once.
    pub tables: Vec<PruneTable>,
    /// Rows per transaction.
    pub batch: i64,
    /// Count what would go; write and delete nothing.
    pub dry_run: bool,
}

/// Who runs a prune, and so what records it.
#[derive(Debug, Clone)]
pub enum RunBy {
    /// `seckillctl db prune`: an `operator_audit` intent before the first
    /// mark, completed with the report (docs/security.md).
    Operator { actor: Actor, reason: String },
    /// The sweeps' holder, on `[retention]`'s schedule: its log lines and
    /// the marks' `updated_at` record it.
    Daemon,
}

/// One batch done, for a progress line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub table: PruneTable,
    /// 1-based.
    pub batch: u64,
    pub deleted: u64,
    /// Deleted from this table so far in this run.
    pub total: u64,
}

/// What a run did to one table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableReport {
    pub table: PruneTable,
    pub relation: String,
    /// This run's horizon: rows older than it were deleted (or would be).
    pub horizon: DateTime<Utc>,
    /// The table's mark after the run: never behind an earlier run's.
    pub mark: Option<DateTime<Utc>>,
    /// Deleted, or on a dry run that would be.
    pub rows: u64,
    /// Batches run, or on a dry run that would be.
    pub batches: u64,
    /// Reached the end: no row older than the horizon is left.
    pub finished: bool,
}

/// The answer of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneReport {
    pub dry_run: bool,
    pub keep_hours: u64,
    pub batch: i64,
    /// Cancelled between batches: the tables not finished are not done.
    pub stopped: bool,
    pub tables: Vec<TableReport>,
}

impl PruneReport {
    pub fn deleted(&self) -> u64 {
        self.tables.iter().map(|t| t.rows).sum()
    }
}

/// The last prune of one table, as `retention_marks` holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Mark {
    pub table_name: String,
    pub horizon: DateTime<Utc>,
    pub updated_at: Option<DateTime<Utc>>,
}

#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("--reason must say why (it is kept in operator_audit)")]
    NoReason,
    #[error("no table to prune; name one with --table, or none for all")]
    NoTable,
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The rows of a table a prune may delete, `$1` the horizon: written once,
/// and both the dry run's count and every batch's DELETE are built from it.
/// The status literals are the partial indexes' predicates
/// (migrations/20261207000002_retention.sql), so the planner can use them.
/// An inbox row goes only once its first delivery *and* its verdict are
/// older than the horizon: the first delivery is what the broker's
/// redelivery is measured from (§16.2).
fn filter(t: PruneTable) -> &'static str {
    match t {
        PruneTable::Inbox => {
            "status IN ('SUCCEEDED', 'REJECTED') AND created_at < $1 AND updated_at < $1"
        }
        PruneTable::Outbox => "status = 'SENT' AND sent_at < $1",
        PruneTable::Failures => "failed_at < $1",
    }
}

/// The column a table's index walks, oldest first.
fn age_column(t: PruneTable) -> &'static str {
    match t {
        PruneTable::Inbox => "created_at",
        PruneTable::Outbox => "sent_at",
        PruneTable::Failures => "failed_at",
    }
}

/// The row's key columns: what the DELETE matches the chosen rows by.
fn key(t: PruneTable) -> &'static str {
    match t {
        PruneTable::Inbox => "consumer_group, message_id",
        PruneTable::Outbox => "outbox_id",
        PruneTable::Failures => "failure_id",
    }
}

fn count_sql(t: PruneTable) -> String {
    format!("SELECT count(*) FROM {} WHERE {}", t.relation(), filter(t))
}

/// One batch, `$1` the horizon and `$2` the batch size. The chosen rows
/// are a CTE, evaluated once: as an `IN (subquery)` the planner may rescan
/// the subquery per outer row, and each rescan skips the rows this very
/// statement just deleted and locks the next ones, so one batch deleted
/// far more than `$2` (the batching test caught it). The outer `AND
/// filter` re-checks each row as it is deleted: what is deleted is what
/// the filter says, whatever the subquery read.
fn batch_sql(t: PruneTable) -> String {
    let (rel, f, k) = (t.relation(), filter(t), key(t));
    format!(
        "WITH chosen AS MATERIALIZED (
             SELECT {k} FROM {rel} WHERE {f}
             ORDER BY {age} LIMIT $2 FOR UPDATE SKIP LOCKED)
         DELETE FROM {rel} WHERE ({k}) IN (SELECT {k} FROM chosen)
         AND {f}",
        age = age_column(t)
    )
}

/// Validates a request before anything is read or written.
pub fn check(req: &PruneRequest) -> Result<(), RetentionError> {
    retention::check_keep(req.keep, req.floor)?;
    retention::check_batch(req.batch)?;
    if req.tables.is_empty() {
        return Err(RetentionError::NoTable);
    }
    Ok(())
}

/// Runs one prune (see the module doc). An operator run is refused without
/// a reason; every run is refused below the floor. `progress` is called
/// after each batch.
pub async fn prune(
    pool: &PgPool,
    req: &PruneRequest,
    by: &RunBy,
    cancel: &CancellationToken,
    mut progress: impl FnMut(&Progress),
) -> Result<PruneReport, RetentionError> {
    check(req)?;
    if let RunBy::Operator { reason, .. } = by
        && reason.trim().is_empty()
    {
        return Err(RetentionError::NoReason);
    }
    let mut tables: Vec<PruneTable> = Vec::with_capacity(req.tables.len());
    for t in &req.tables {
        if !tables.contains(t) {
            tables.push(*t);
        }
    }
    let keep_s = i64::try_from(req.keep.as_secs()).map_err(|_| Refusal::TooLong)?;
    // One instant for every table, from PostgreSQL's clock.
    let horizon: DateTime<Utc> =
        sqlx::query_scalar("SELECT now() - $1::bigint * interval '1 second'")
            .bind(keep_s)
            .fetch_one(pool)
            .await?;
    let mut report = PruneReport {
        dry_run: req.dry_run,
        keep_hours: req.keep.as_secs() / 3600,
        batch: req.batch,
        stopped: false,
        tables: tables
            .iter()
            .map(|t| TableReport {
                table: *t,
                relation: t.relation().to_owned(),
                horizon,
                mark: None,
                rows: 0,
                batches: 0,
                finished: false,
            })
            .collect(),
    };
    if req.dry_run {
        for t in &mut report.tables {
            let n: i64 = sqlx::query_scalar(&count_sql(t.table))
                .bind(horizon)
                .fetch_one(pool)
                .await?;
            t.rows = n.max(0) as u64;
            t.batches = t.rows.div_ceil(req.batch as u64);
            t.mark = mark_of(pool, t.table).await?;
            t.finished = true;
        }
        return Ok(report);
    }
    let intent = match by {
        RunBy::Operator { actor, reason } => {
            Some(audit::open(pool, actor, &entry(req, reason, &tables)).await?)
        }
        RunBy::Daemon => None,
    };
    let done = run(pool, req, horizon, cancel, &mut progress, &mut report).await;
    if let Some(id) = intent {
        close(pool, id, &report, &done).await?;
    }
    done.map(|()| report)
}

/// The batches of every table, into `report`.
async fn run(
    pool: &PgPool,
    req: &PruneRequest,
    horizon: DateTime<Utc>,
    cancel: &CancellationToken,
    progress: &mut impl FnMut(&Progress),
    report: &mut PruneReport,
) -> Result<(), RetentionError> {
    for t in &mut report.tables {
        if cancel.is_cancelled() {
            report.stopped = true;
            return Ok(());
        }
        // Committed before the first DELETE: a replay pre-check that finds
        // a row gone finds the mark that explains it (§9.3 `inbox_kept`).
        t.mark = Some(advance_mark(pool, t.table, horizon).await?);
        let sql = batch_sql(t.table);
        loop {
            let n = sqlx::query(&sql)
                .bind(horizon)
                .bind(req.batch)
                .execute(pool)
                .await?
                .rows_affected();
            if n > 0 {
                t.batches += 1;
                t.rows += n;
                progress(&Progress {
                    table: t.table,
                    batch: t.batches,
                    deleted: n,
                    total: t.rows,
                });
            }
            // A short batch is the end; rows another transaction held
            // (SKIP LOCKED) wait for the next run.
            if n < req.batch as u64 {
                break;
            }
            if cancel.is_cancelled() {
                report.stopped = true;
                return Ok(());
            }
        }
        finished(pool, t.table).await?;
        t.finished = true;
    }
    Ok(())
}

/// Writes `horizon` as the table's mark unless an earlier run's is later,
/// and returns the mark (committed on return).
async fn advance_mark(
    pool: &PgPool,
    t: PruneTable,
    horizon: DateTime<Utc>,
) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO retention_marks (table_name, horizon) VALUES ($1, $2)
         ON CONFLICT (table_name) DO UPDATE
             SET horizon = GREATEST(retention_marks.horizon, EXCLUDED.horizon)
         RETURNING horizon",
    )
    .bind(t.relation())
    .bind(horizon)
    .fetch_one(pool)
    .await
}

/// Stamps a run over the table as done, on PostgreSQL's clock.
async fn finished(pool: &PgPool, t: PruneTable) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE retention_marks SET updated_at = now() WHERE table_name = $1")
        .bind(t.relation())
        .execute(pool)
        .await?;
    Ok(())
}

async fn mark_of(pool: &PgPool, t: PruneTable) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar("SELECT horizon FROM retention_marks WHERE table_name = $1")
        .bind(t.relation())
        .fetch_optional(pool)
        .await
}

/// Every table's mark.
pub async fn marks(pool: &PgPool) -> Result<Vec<Mark>, sqlx::Error> {
    sqlx::query_as(
        "SELECT table_name, horizon, updated_at FROM retention_marks ORDER BY table_name",
    )
    .fetch_all(pool)
    .await
}

/// The tables whose run is due (`decide::retention::is_due`), read from
/// the marks' `updated_at` against PostgreSQL's clock: a restart or a
/// lease hand-over reads the same answer.
pub async fn due(pool: &PgPool, every: Duration) -> Result<Vec<PruneTable>, sqlx::Error> {
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let marks = marks(pool).await?;
    Ok(PruneTable::ALL
        .into_iter()
        .filter(|t| {
            let last = marks
                .iter()
                .find(|m| m.table_name == t.relation())
                .and_then(|m| m.updated_at);
            retention::is_due(last, now, every)
        })
        .collect())
}

fn entry(req: &PruneRequest, reason: &str, tables: &[PruneTable]) -> audit::Entry {
    audit::Entry::new(
        "db prune",
        tables.iter().map(|t| t.relation().to_owned()).collect(),
    )
    .reason(Some(reason))
    .before(serde_json::json!({
        "older_than_hours": req.keep.as_secs() / 3600,
        "older_than_s": req.keep.as_secs(),
        "batch": req.batch,
    }))
}

/// Completes the intent with the report: `PRUNED` when every table reached
/// its end, `STOPPED` when cancelled, `FAILED` with the error.
async fn close(
    pool: &PgPool,
    id: AuditId,
    report: &PruneReport,
    done: &Result<(), RetentionError>,
) -> Result<(), sqlx::Error> {
    let (after, outcome) = match done {
        Ok(()) if report.stopped => (serde_json::to_value(report).ok(), "STOPPED"),
        Ok(()) => (serde_json::to_value(report).ok(), "PRUNED"),
        Err(e) => (
            Some(serde_json::json!({ "error": e.to_string(), "so_far": report })),
            "FAILED",
        ),
    };
    audit::complete(pool, id, after, outcome).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::status::{InboxStatus, OutboxStatus};

    #[test]
    fn the_filter_keeps_what_is_unfinished() {
        let inbox = filter(PruneTable::Inbox);
        for s in [InboxStatus::Succeeded, InboxStatus::Rejected] {
            assert!(inbox.contains(&format!("'{}'", s.as_str())), "{inbox}");
        }
        assert!(!inbox.contains(InboxStatus::Processing.as_str()));
        let outbox = filter(PruneTable::Outbox);
        assert!(outbox.contains(&format!("'{}'", OutboxStatus::Sent.as_str())));
        assert!(!outbox.contains(OutboxStatus::Pending.as_str()));
        assert!(!outbox.contains(OutboxStatus::Dead.as_str()));
    }

    #[test]
    fn count_and_batch_share_the_filter_and_the_batch_rechecks_it() {
        for t in PruneTable::ALL {
            let f = filter(t);
            assert!(count_sql(t).ends_with(f));
            let b = batch_sql(t);
            assert_eq!(b.matches(f).count(), 2, "{b}");
            assert!(b.contains("FOR UPDATE SKIP LOCKED"));
            assert!(b.contains(&format!("ORDER BY {}", age_column(t))));
        }
    }

    #[test]
    fn a_request_below_the_floor_or_without_tables_is_refused() {
        let req = PruneRequest {
            keep: Duration::from_secs(48 * 3600),
            floor: Duration::from_secs(72 * 3600),
            tables: PruneTable::ALL.to_vec(),
            batch: 5_000,
            dry_run: true,
        };
        assert!(matches!(
            check(&req),
            Err(RetentionError::Refused(Refusal::BelowFloor { .. }))
        ));
        let none = PruneRequest {
            keep: Duration::from_secs(336 * 3600),
            tables: vec![],
            ..req.clone()
        };
        assert!(matches!(check(&none), Err(RetentionError::NoTable)));
        let zero = PruneRequest {
            keep: Duration::from_secs(336 * 3600),
            batch: 0,
            ..req
        };
        assert!(matches!(
            check(&zero),
            Err(RetentionError::Refused(Refusal::BadBatch(0)))
        ));
    }
}
