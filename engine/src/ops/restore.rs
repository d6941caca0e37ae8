//! `activity restore` end to end (docs/architecture.md §4.5): check there
//! is something to restore, wait for the order consumer's backlog to
//! drain, rebuild Redis from PostgreSQL, and audit it as an intent
//! completed with the report (docs/security.md, "What is audited").
//!
//! The CLI's `--direct` path and the daemon's operator API both call
//! [`restore_audited`], so the wait and the audit hold on either.

use crate::domain::auth::Actor;
use crate::mq::rocket::{MqError, RocketAdmin};
use crate::mq::topics::retry_topic;
use crate::mq::{Names, TopicKind};
use crate::ops::activity;
use crate::ops::redis_state::{self, RedisStateError, RestoreReport, RestoreRequest};
use crate::reservation::ReservationStore;
use crate::store::audit;
use sqlx::PgPool;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    State(#[from] RedisStateError),
    #[error(
        "the order consumer still has {left} message(s) to decide after {wait:?}; is an engine running (`seckillctl backlog`)? Restoring now could count their reservations twice; try again with a longer --wait"
    )]
    NotDrained { left: i64, wait: Duration },
    #[error("reading the order consumer's lag: {0}")]
    Mq(#[from] MqError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// What a restore works on: both stores, and the broker's admin to read
/// the order consumer's backlog.
#[derive(Clone, Copy)]
pub struct RestoreOn<'a> {
    pub pool: &'a PgPool,
    pub store: &'a ReservationStore,
    pub admin: &'a RocketAdmin,
    pub names: &'a Names,
}

/// Checks first that there is something to restore, then waits until the
/// order consumer has no message left (its topic and its retry topic,
/// twice in a row: offsets are committed every few seconds), so every
/// message already in flight is decided before PostgreSQL is read.
/// `waiting` hears how many are left, once a second.
pub async fn restore_audited(
    on: &RestoreOn<'_>,
    req: &RestoreRequest,
    actor: &Actor,
    wait: Duration,
    waiting: &(dyn Fn(i64) + Send + Sync),
) -> Result<RestoreReport, RestoreError> {
    let RestoreOn { pool, store, .. } = *on;
    if req.reason.trim().is_empty() {
        return Err(RedisStateError::BlankReason.into());
    }
    let before = activity::show(pool, store, req.activity).await.ok();
    let entry = audit::Entry::new("activity restore", vec![req.activity.to_string()])
        .reason(Some(req.reason.as_str()))
        .before(&before);
    let id = audit::open(pool, actor, &entry).await?;
    let done = restore(on, req, wait, waiting).await;
    audit::finish(pool, id, &done).await?;
    done
}

async fn restore(
    on: &RestoreOn<'_>,
    req: &RestoreRequest,
    wait: Duration,
    waiting: &(dyn Fn(i64) + Send + Sync),
) -> Result<RestoreReport, RestoreError> {
    let RestoreOn {
        pool,
        store,
        admin,
        names,
    } = *on;
    if redis_state::retired(pool, req.activity).await? {
        return Err(RedisStateError::Retired(req.activity).into());
    }
    match redis_state::survey_one(pool, store, req.activity).await? {
        None => return Err(RedisStateError::NotSeeded(req.activity).into()),
        Some(s) if !s.state.refuses() => {
            return Err(RedisStateError::Intact {
                activity: req.activity,
                pg: s.pg_epoch,
                redis: s.redis_epoch.unwrap_or_default(),
            }
            .into());
        }
        Some(_) => {}
    }
    wait_for_drain(admin, names, wait, waiting).await?;
    Ok(redis_state::restore(pool, store, req).await?)
}

async fn wait_for_drain(
    admin: &RocketAdmin,
    names: &Names,
    wait: Duration,
    waiting: &(dyn Fn(i64) + Send + Sync),
) -> Result<(), RestoreError> {
    let group = names.group(TopicKind::OrderCreate);
    let topics = [names.topic(TopicKind::OrderCreate), retry_topic(&group)];
    let deadline = Instant::now() + wait;
    let mut empty_in_a_row = 0;
    loop {
        let mut left = 0;
        for topic in &topics {
            // A retry topic appears only with the first retry.
            match admin.lag(topic, &group).await {
                Ok(lag) => left += lag.messages.max(0),
                Err(_) if topic != &topics[0] => {}
                Err(e) => return Err(e.into()),
            }
        }
        empty_in_a_row = if left == 0 { empty_in_a_row + 1 } else { 0 };
        if empty_in_a_row >= 2 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(RestoreError::NotDrained { left, wait });
        }
        waiting(left);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
