//! Retention of the finished history (docs/architecture.md §16.2) against a
//! real PostgreSQL: the prune deletes only finished, old rows of the inbox,
//! the outbox and the failures, in batches that can be stopped between;
//! its mark is written first and never moves back; below the broker's
//! retention it is refused; and a replay of a message that died within a
//! day of the inbox's mark is blocked (`inbox_kept`, §9.3), never forced.

use anyhow::{Result, ensure};
use chrono::{DateTime, Utc};
use seckill_engine::replay::Check;
use seckill_engine::{
    ActivityId, CancellationToken, CheckLevel, DlqEntryStatus, MessageId, PruneProgress,
    PruneReport, PruneRequest, PruneTable, ReplayDecision, ReplayError, ReplayRequest,
    RetentionError, RetentionRefusal, RocketProducer, RunBy, SkuId, TableReport, TopicKind,
    retention,
};
use seckill_tests::{Setup, TestEnv, run, test_actor};
use sqlx::PgPool;
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);
/// `[dlq] broker_retention_hours`' default: the floor.
const FLOOR: Duration = Duration::from_secs(72 * 3600);
const TWO_WEEKS: Duration = Duration::from_secs(14 * 24 * 3600);

fn request(keep: Duration, tables: &[PruneTable], batch: i64) -> PruneRequest {
    PruneRequest {
        keep,
        floor: FLOOR,
        tables: tables.to_vec(),
        batch,
        dry_run: false,
    }
}

async fn prune(pool: &PgPool, req: &PruneRequest) -> Result<PruneReport, RetentionError> {
    retention::prune(pool, req, &RunBy::Daemon, &CancellationToken::new(), |_| {}).await
}

fn table(r: &PruneReport, t: PruneTable) -> &TableReport {
    r.tables
        .iter()
        .find(|x| x.table == t)
        .expect("the table is reported")
}

/// An inbox row of `status`, first delivered and decided `days` ago.
async fn inbox(pool: &PgPool, id: &str, status: &str, days: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO consumer_inbox (consumer_group, message_id, status, result_code, delivery_attempt,
                                     created_at, updated_at)
         VALUES ('G_ORDER', $1, $2::inbox_status, 'ORDER_CREATED', 1,
                 now() - make_interval(days => $3::int), now() - make_interval(days => $3::int))",
    )
    .bind(id)
    .bind(status)
    .bind(days as i32)
    .execute(pool)
    .await?;
    Ok(())
}

/// An outbox row of `status`, created and (when SENT) sent `days` ago.
async fn outbox(pool: &PgPool, id: &str, status: &str, days: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO event_outbox (message_id, topic, tag, message_key, payload, status, created_at, sent_at)
         VALUES ($1, 'T', 'CANCEL', 'k', '{}', $2::outbox_status, now() - make_interval(days => $3::int),
                 CASE WHEN $2 = 'SENT' THEN now() - make_interval(days => $3::int) END)",
    )
    .bind(id)
    .bind(status)
    .bind(days as i32)
    .execute(pool)
    .await?;
    Ok(())
}

async fn failure(pool: &PgPool, id: &str, days: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO consumer_failures (consumer_group, message_id, error_class, detail, delivery_attempt, failed_at)
         VALUES ('G_ORDER', $1, 'DB_TIMEOUT', 'lock timeout', 1, now() - make_interval(days => $2::int))",
    )
    .bind(id)
    .bind(days as i32)
    .execute(pool)
    .await?;
    Ok(())
}

async fn ids(pool: &PgPool, sql: &str) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(sql).fetch_all(pool).await?)
}

async fn count(pool: &PgPool, table: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await?)
}

/// PostgreSQL's `now() - keep`, to compare a horizon with.
async fn pg_ago(pool: &PgPool, keep: Duration) -> Result<DateTime<Utc>> {
    Ok(
        sqlx::query_scalar("SELECT now() - $1::bigint * interval '1 second'")
            .bind(keep.as_secs() as i64)
            .fetch_one(pool)
            .await?,
    )
}

/// Old history of every kind, finished or not, plus fresh finished rows and
/// old rows of the tables that are never pruned.
async fn history(env: &TestEnv) -> Result<()> {
    let pool = &env.pool;
    for (id, status, days) in [
        ("in-old-ok-1", "SUCCEEDED", 30),
        ("in-old-ok-2", "SUCCEEDED", 20),
        ("in-old-ok-3", "SUCCEEDED", 15),
        ("in-old-rej-1", "REJECTED", 25),
        ("in-old-rej-2", "REJECTED", 16),
        ("in-old-proc-1", "PROCESSING", 40),
        ("in-old-proc-2", "PROCESSING", 20),
        ("in-new-ok-1", "SUCCEEDED", 1),
        ("in-new-rej-1", "REJECTED", 13),
    ] {
        inbox(pool, id, status, days).await?;
    }
    for (id, status, days) in [
        ("out-old-sent-1", "SENT", 30),
        ("out-old-sent-2", "SENT", 20),
        ("out-old-sent-3", "SENT", 15),
        ("out-old-pending", "PENDING", 30),
        ("out-old-dead", "DEAD", 30),
        ("out-new-sent", "SENT", 2),
    ] {
        outbox(pool, id, status, days).await?;
    }
    for (id, days) in [
        ("f-old-1", 30),
        ("f-old-2", 20),
        ("f-old-3", 16),
        ("f-old-4", 15),
        ("f-new", 3),
    ] {
        failure(pool, id, days).await?;
    }
    // Audit and quarantine rows a month old: never pruned.
    sqlx::query(
        "INSERT INTO replay_audit (replay_id, consumer_group, message_id, operator, reason, checks,
                                   decision, outcome, replay_count, created_at)
         VALUES ('rpl_old', 'G_ORDER', 'in-old-ok-1', 'op', 'old', '[]', 'BLOCKED', 'NOT_SENT', 0,
                 now() - interval '30 days')",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO message_quarantine (consumer_group, topic, reason, detail, body, created_at)
         VALUES ('G_ORDER', 'T', 'BAD_JSON', 'old', '\\x00', now() - interval '30 days')",
    )
    .execute(pool)
    .await?;
    Ok(())
}

#[test]
fn a_prune_deletes_only_finished_old_history() {
    run(Setup::Full, |env| async move {
        history(&env).await?;
        let pool = &env.pool;
        let audits = count(pool, "operator_audit").await?;

        // A dry run counts exactly what the run deletes, and touches nothing.
        let dry = PruneRequest {
            dry_run: true,
            ..request(TWO_WEEKS, &PruneTable::ALL, 2)
        };
        let counted = prune(pool, &dry).await?;
        ensure!(counted.dry_run && !counted.stopped, "{counted:?}");
        let rows = |r: &PruneReport| PruneTable::ALL.map(|t| table(r, t).rows);
        ensure!(rows(&counted) == [5, 3, 4], "{counted:#?}");
        ensure!(
            table(&counted, PruneTable::Inbox).batches == 3,
            "{counted:#?}"
        );
        ensure!(count(pool, "consumer_inbox").await? == 9);
        ensure!(
            count(pool, "retention_marks").await? == 0,
            "a dry run writes no mark"
        );

        let before = pg_ago(pool, TWO_WEEKS).await?;
        let done = prune(pool, &request(TWO_WEEKS, &PruneTable::ALL, 2)).await?;
        let after = pg_ago(pool, TWO_WEEKS).await?;
        ensure!(!done.stopped, "{done:?}");
        ensure!(rows(&done) == [5, 3, 4], "{done:#?}");
        ensure!(
            PruneTable::ALL.map(|t| table(&done, t).batches) == [3, 2, 2],
            "batches of 2: {done:#?}"
        );
        for t in &done.tables {
            // The horizon is PostgreSQL's `now() - keep`, taken during the run.
            ensure!(t.horizon >= before && t.horizon <= after, "{t:?}");
            ensure!(t.finished && t.mark == Some(t.horizon), "{t:?}");
        }

        let inbox_left = ids(
            pool,
            "SELECT message_id FROM consumer_inbox ORDER BY message_id",
        )
        .await?;
        ensure!(
            inbox_left
                == [
                    "in-new-ok-1",
                    "in-new-rej-1",
                    "in-old-proc-1",
                    "in-old-proc-2"
                ],
            "PROCESSING rows and fresh rows stay: {inbox_left:?}"
        );
        let outbox_left = ids(
            pool,
            "SELECT message_id FROM event_outbox ORDER BY message_id",
        )
        .await?;
        ensure!(
            outbox_left == ["out-new-sent", "out-old-dead", "out-old-pending"],
            "PENDING, DEAD and fresh SENT rows stay: {outbox_left:?}"
        );
        let failures_left = ids(pool, "SELECT message_id FROM consumer_failures").await?;
        ensure!(failures_left == ["f-new"], "{failures_left:?}");
        ensure!(
            count(pool, "replay_audit").await? == 1,
            "audit tables are never pruned"
        );
        ensure!(count(pool, "message_quarantine").await? == 1);
        ensure!(
            count(pool, "operator_audit").await? == audits,
            "a daemon run writes no operator audit row"
        );

        // Every table is marked, and done: nothing is due for a day.
        let marks = retention::marks(pool).await?;
        ensure!(marks.len() == 3, "{marks:?}");
        ensure!(marks.iter().all(|m| m.updated_at.is_some()), "{marks:?}");
        ensure!(retention::due(pool, 24 * HOUR).await?.is_empty());
        ensure!(
            retention::due(pool, Duration::ZERO).await? == PruneTable::ALL,
            "due again once `every` has passed"
        );

        // A second run finds nothing left to delete.
        let again = prune(pool, &request(TWO_WEEKS, &PruneTable::ALL, 2)).await?;
        ensure!(
            again.deleted() == 0 && again.tables.iter().all(|t| t.batches == 0),
            "{again:?}"
        );
        Ok(())
    });
}

#[test]
fn a_prune_is_batched_and_stops_between_batches() {
    run(Setup::Full, |env| async move {
        let pool = &env.pool;
        for i in 0..7 {
            failure(pool, &format!("f-{i}"), 20 + i).await?;
        }
        let req = request(TWO_WEEKS, &[PruneTable::Failures], 2);

        // Stopped after the first batch (as the daemon's token on SIGTERM).
        let cancel = CancellationToken::new();
        let mut seen: Vec<PruneProgress> = Vec::new();
        let stop = cancel.clone();
        let cut = retention::prune(pool, &req, &RunBy::Daemon, &cancel, |p| {
            seen.push(*p);
            stop.cancel();
        })
        .await?;
        ensure!(cut.stopped, "{cut:?}");
        let t = table(&cut, PruneTable::Failures);
        ensure!(t.rows == 2 && t.batches == 1 && !t.finished, "{t:?}");
        ensure!(
            seen.len() == 1 && seen[0].deleted == 2 && seen[0].batch == 1,
            "{seen:?}"
        );
        ensure!(count(pool, "consumer_failures").await? == 5);
        // The oldest went first.
        let left = ids(
            pool,
            "SELECT message_id FROM consumer_failures ORDER BY message_id",
        )
        .await?;
        ensure!(left == ["f-0", "f-1", "f-2", "f-3", "f-4"], "{left:?}");
        // Cut short is not done: the mark is there, its run not stamped,
        // and the daemon's next look runs it again.
        let marks = retention::marks(pool).await?;
        ensure!(
            marks.len() == 1 && marks[0].updated_at.is_none(),
            "{marks:?}"
        );
        ensure!(
            retention::due(pool, 24 * HOUR)
                .await?
                .contains(&PruneTable::Failures)
        );

        // A token cancelled before the start deletes nothing.
        let none = retention::prune(pool, &req, &RunBy::Daemon, &cancel, |_| {}).await?;
        ensure!(none.stopped && none.deleted() == 0, "{none:?}");

        // The rest, to the end, in batches of 2: 2 + 2 + 1.
        let mut batches = Vec::new();
        let rest = retention::prune(pool, &req, &RunBy::Daemon, &CancellationToken::new(), |p| {
            batches.push(p.deleted)
        })
        .await?;
        ensure!(batches == [2, 2, 1], "{batches:?}");
        ensure!(
            !rest.stopped && table(&rest, PruneTable::Failures).finished,
            "{rest:?}"
        );
        ensure!(count(pool, "consumer_failures").await? == 0);
        let due = retention::due(pool, 24 * HOUR).await?;
        ensure!(
            due == [PruneTable::Inbox, PruneTable::Outbox],
            "only the finished table is done: {due:?}"
        );
        Ok(())
    });
}

#[test]
fn the_mark_never_moves_back_and_below_the_floor_is_refused() {
    run(Setup::Full, |env| async move {
        let pool = &env.pool;
        failure(pool, "f-2d", 2).await?;
        failure(pool, "f-20d", 20).await?;

        // Below the broker's retention: refused, nothing written.
        let below = prune(pool, &request(48 * HOUR, &PruneTable::ALL, 100)).await;
        ensure!(
            matches!(
                below,
                Err(RetentionError::Refused(RetentionRefusal::BelowFloor {
                    keep_h: 48,
                    floor_h: 72
                }))
            ),
            "{below:?}"
        );
        ensure!(count(pool, "retention_marks").await? == 0);
        ensure!(count(pool, "consumer_failures").await? == 2);
        // An operator run needs a reason, and is refused before its audit row.
        let no_reason = retention::prune(
            pool,
            &request(FLOOR, &[PruneTable::Failures], 100),
            &RunBy::Operator {
                actor: test_actor(),
                reason: "  ".into(),
            },
            &CancellationToken::new(),
            |_| {},
        )
        .await;
        ensure!(
            matches!(no_reason, Err(RetentionError::NoReason)),
            "{no_reason:?}"
        );
        ensure!(count(pool, "operator_audit").await? == 0);

        // At the floor: the 20-day-old row goes, the 2-day-old one stays;
        // the mark is now - 72 h.
        let first = prune(pool, &request(FLOOR, &[PruneTable::Failures], 100)).await?;
        ensure!(first.deleted() == 1, "{first:?}");
        let mark = table(&first, PruneTable::Failures).mark.expect("a mark");

        // A longer keep later: its horizon is older, the mark stays.
        let later = prune(pool, &request(TWO_WEEKS, &[PruneTable::Failures], 100)).await?;
        let t = table(&later, PruneTable::Failures);
        ensure!(t.horizon < mark, "{t:?}");
        ensure!(
            t.mark == Some(mark),
            "the mark never moves back: {t:?} {mark}"
        );
        let stored = retention::marks(pool).await?;
        ensure!(stored.len() == 1 && stored[0].horizon == mark, "{stored:?}");
        ensure!(later.deleted() == 0, "{later:?}");
        let left = ids(pool, "SELECT message_id FROM consumer_failures").await?;
        ensure!(left == ["f-2d"], "{left:?}");
        Ok(())
    });
}

/// A dead message of the order group, dead `hours` ago.
async fn dead(env: &TestEnv, user: i64, hours: i64) -> Result<MessageId> {
    let id = env.dead_order(None, ActivityId(5), SkuId(1), user).await?;
    sqlx::query("UPDATE dlq_messages SET dead_at = now() - make_interval(hours => $2::int) WHERE message_id = $1")
        .bind(&id)
        .bind(hours as i32)
        .execute(&env.pool)
        .await?;
    Ok(id)
}

fn replay_request(env: &TestEnv, id: &MessageId, force: Vec<Check>) -> ReplayRequest {
    ReplayRequest {
        message_id: id.clone(),
        group: Some(env.names.group(TopicKind::OrderCreate)),
        reason: "the fault is fixed".into(),
        actor: test_actor(),
        dry_run: false,
        force,
        verify_within: Duration::from_secs(1),
        include_replayed: false,
        retention: FLOOR,
    }
}

#[test]
fn a_replay_of_a_message_dead_within_a_day_of_the_inbox_mark_is_blocked() {
    run(Setup::Full, |env| async move {
        let pool = &env.pool;
        let group = env.names.group(TopicKind::OrderCreate);
        // Applied four days ago, its reply lost; retried and dead-lettered
        // 90 hours ago. Its inbox row is the only thing that says it was
        // applied, and a prune at the floor takes it.
        let applied = dead(&env, 1, 90).await?;
        sqlx::query(
            "INSERT INTO consumer_inbox (consumer_group, message_id, status, result_code, delivery_attempt,
                                         created_at, updated_at)
             VALUES ($1, $2, 'SUCCEEDED', 'ORDER_CREATED', 1, now() - interval '4 days', now() - interval '4 days')",
        )
        .bind(&group)
        .bind(&applied)
        .execute(pool)
        .await?;
        // Dead just now: a day and more after any mark a prune at the floor
        // writes, so its inbox row (if any) is kept.
        let fresh = dead(&env, 2, 0).await?;

        // Before any prune: the check passes; the inbox check blocks.
        let v = seckill_engine::replay::precheck(pool, &env.names, &group, &applied, FLOOR).await?;
        let level = |v: &[seckill_engine::Verdict], c: Check| {
            v.iter().find(|x| x.check == c).map(|x| x.level)
        };
        ensure!(
            level(&v, Check::InboxKept) == Some(CheckLevel::Pass),
            "{v:#?}"
        );
        ensure!(level(&v, Check::Inbox) == Some(CheckLevel::Block), "{v:#?}");

        let done = prune(pool, &request(FLOOR, &[PruneTable::Inbox], 100)).await?;
        ensure!(done.deleted() == 1, "{done:?}");
        let v = seckill_engine::replay::precheck(pool, &env.names, &group, &applied, FLOOR).await?;
        ensure!(
            level(&v, Check::Inbox) == Some(CheckLevel::Pass),
            "the row is gone, so the inbox check alone would let it through: {v:#?}"
        );
        ensure!(
            level(&v, Check::InboxKept) == Some(CheckLevel::Block),
            "{v:#?}"
        );

        let producer = RocketProducer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &env.names.producer_group(),
            Duration::from_secs(3),
            1,
        )
        .await?;
        let blocked = seckill_engine::replay::replay(
            pool,
            &env.names,
            &producer,
            &replay_request(&env, &applied, vec![]),
        )
        .await?;
        ensure!(blocked.decision == ReplayDecision::Blocked, "{blocked:#?}");
        let kept = blocked
            .checks
            .iter()
            .find(|c| c.check == Check::InboxKept)
            .expect("the inbox_kept verdict");
        ensure!(
            kept.level == CheckLevel::Block && kept.evidence.contains("may have been pruned"),
            "{kept:?}"
        );
        let status: DlqEntryStatus =
            sqlx::query_scalar("SELECT status FROM dlq_messages WHERE message_id = $1")
                .bind(&applied)
                .fetch_one(pool)
                .await?;
        ensure!(
            status == DlqEntryStatus::Dead,
            "nothing was sent: {status:?}"
        );
        let forced = seckill_engine::replay::replay(
            pool,
            &env.names,
            &producer,
            &replay_request(&env, &applied, vec![Check::InboxKept]),
        )
        .await;
        ensure!(
            matches!(forced, Err(ReplayError::NotForceable(Check::InboxKept))),
            "{forced:?}"
        );

        // The one that died after mark + 1 day passes the check.
        let v = seckill_engine::replay::precheck(pool, &env.names, &group, &fresh, FLOOR).await?;
        ensure!(
            level(&v, Check::InboxKept) == Some(CheckLevel::Pass),
            "{v:#?}"
        );
        producer.shutdown().await;
        Ok(())
    });
}
