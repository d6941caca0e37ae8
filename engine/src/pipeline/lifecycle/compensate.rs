//! The compensation (docs/architecture.md §8): gives a reservation's Redis stock and
//! buyer slot back exactly once, whichever of the three sources asked
//! (business rejection, definite send failure, cancellation).
//!
//! Exactly once rests on the Redis `release` script, which checks and sets
//! `mq_status=RELEASED` atomically; the inbox and the `compensation_tasks`
//! row record it in PostgreSQL. The release runs before the PostgreSQL
//! transaction: a crash between the two leaves the task PENDING, and the
//! redelivery (or the sweep) calls `release` again, which answers
//! ALREADY_RELEASED and lets the task be settled.

use super::{SettleEach, SettleError, handle_each, inbox};
use crate::domain::ids::{ActivityId, ReservationId};
use crate::domain::message::ReleaseReservation;
use crate::domain::message::{Malformed, parse_release};
use crate::domain::stats::LifecycleStats;
use crate::domain::status::{CompensationStatus, InboxStatus};
use crate::mq::{ConsumeVerdict, Handler, IncomingMessage, Names, PROP_REPLAY_ID, TopicKind};
use crate::pipeline::trail;
use crate::reservation::{ReleaseOutcome, ReservationStore};
use sqlx::{PgPool, Postgres, Transaction};
use std::sync::Arc;
use std::time::Duration;

/// What became of one release message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Consumed before: nothing was called, nothing written.
    AlreadyProcessed,
    Released(ReleaseOutcome),
}

fn code(outcome: ReleaseOutcome) -> &'static str {
    match outcome {
        ReleaseOutcome::Released => "RELEASED",
        ReleaseOutcome::AlreadyReleased => "ALREADY_RELEASED",
        ReleaseOutcome::Unknown => "RESERVATION_GONE",
    }
}

/// The task's final status for a release outcome.
pub fn task_status(outcome: ReleaseOutcome) -> CompensationStatus {
    match outcome {
        ReleaseOutcome::Released | ReleaseOutcome::AlreadyReleased => CompensationStatus::Released,
        // The hash outlived its physical TTL: nothing in Redis can be given
        // back exactly once any more. Closed for an operator, not retried.
        ReleaseOutcome::Unknown => CompensationStatus::Orphaned,
    }
}

async fn settle_task(
    tx: &mut Transaction<'static, Postgres>,
    reservation_id: &ReservationId,
    outcome: ReleaseOutcome,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE compensation_tasks SET status = $2, released_at = now()
         WHERE reservation_id = $1 AND status = 'PENDING'",
    )
    .bind(reservation_id)
    .bind(task_status(outcome))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn count(stats: &LifecycleStats, outcome: ReleaseOutcome) {
    match outcome {
        ReleaseOutcome::Released => stats.released.add(1),
        ReleaseOutcome::AlreadyReleased => stats.already_released.add(1),
        ReleaseOutcome::Unknown => stats.orphaned.add(1),
    }
}

#[derive(Clone)]
pub struct CompensationConsumer {
    pool: PgPool,
    store: ReservationStore,
    group: String,
    stats: Arc<LifecycleStats>,
}

impl CompensationConsumer {
    pub fn new(
        pool: PgPool,
        store: ReservationStore,
        names: &Names,
        stats: Arc<LifecycleStats>,
    ) -> Self {
        Self {
            group: names.group(TopicKind::InventoryCompensate),
            pool,
            store,
            stats,
        }
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// Settles one release message.
    pub async fn process(
        &self,
        msg: &ReleaseReservation,
        delivery_attempt: i32,
        replay_id: Option<&str>,
    ) -> Result<Settled, SettleError> {
        let id = msg.message_id.as_str();
        if inbox::seen(&self.pool, &self.group, id).await? {
            return Ok(Settled::AlreadyProcessed);
        }
        let outcome = self
            .store
            .release(msg.activity_id, &msg.reservation_id)
            .await?;
        let mut tx = self.pool.begin().await?;
        if !inbox::claim(&mut tx, &self.group, id, delivery_attempt, replay_id).await? {
            // A concurrent delivery settled it; the script kept the release single.
            tx.rollback().await?;
            return Ok(Settled::AlreadyProcessed);
        }
        settle_task(&mut tx, &msg.reservation_id, outcome).await?;
        inbox::finish(
            &mut tx,
            &self.group,
            id,
            InboxStatus::Succeeded,
            code(outcome),
        )
        .await?;
        tx.commit().await?;
        count(&self.stats, outcome);
        if outcome == ReleaseOutcome::Unknown {
            tracing::error!(
                reservation_id = %msg.reservation_id, source = %msg.source,
                "release found no Redis reservation (past its TTL?); compensation task ORPHANED"
            );
        }
        Ok(Settled::Released(outcome))
    }
}

impl SettleEach for CompensationConsumer {
    type Msg = ReleaseReservation;

    fn group(&self) -> &str {
        &self.group
    }

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn parse(m: &IncomingMessage) -> Result<ReleaseReservation, Malformed> {
        parse_release(&m.body)
    }

    async fn settle(
        &self,
        msg: ReleaseReservation,
        m: &IncomingMessage,
    ) -> Result<(), SettleError> {
        let settled = self
            .process(&msg, m.reconsume_times.max(0), m.property(PROP_REPLAY_ID))
            .await?;
        let outcome = match settled {
            Settled::AlreadyProcessed => {
                self.stats.release_duplicates.add(1);
                "ALREADY_PROCESSED"
            }
            Settled::Released(o) => code(o),
        };
        trail::settled(&self.group, m, &msg.reservation_id, None, outcome);
        Ok(())
    }
}

impl Handler for CompensationConsumer {
    async fn handle(&self, batch: Vec<IncomingMessage>) -> ConsumeVerdict {
        handle_each(self, batch).await
    }
}

/// One sweep pass: releases up to `limit` compensation tasks still PENDING
/// after `grace` (a crash between a send failure's task and its release, a
/// release message stuck or dead-lettered). Returns how many it settled.
pub async fn sweep_once(
    pool: &PgPool,
    store: &ReservationStore,
    grace: Duration,
    limit: i64,
    stats: &LifecycleStats,
) -> Result<usize, SettleError> {
    let due: Vec<(ReservationId, ActivityId)> = sqlx::query_as(
        "SELECT reservation_id, activity_id FROM compensation_tasks
         WHERE status = 'PENDING' AND created_at <= now() - make_interval(secs => $1)
         ORDER BY created_at
         LIMIT $2",
    )
    .bind(grace.as_secs_f64())
    .bind(limit)
    .fetch_all(pool)
    .await?;
    for (rsv, activity) in &due {
        let outcome = store.release(*activity, rsv).await?;
        let mut tx = pool.begin().await?;
        settle_task(&mut tx, rsv, outcome).await?;
        tx.commit().await?;
        count(stats, outcome);
        tracing::warn!(
            reservation_id = %rsv, outcome = code(outcome),
            "sweep settled a compensation task its release message had not"
        );
    }
    stats.sweep_released.add(due.len() as u64);
    Ok(due.len())
}
