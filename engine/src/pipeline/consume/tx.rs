//! The order transaction (docs/architecture.md §7): runs the [`sql`] statements in
//! order, with the pure [`plan`] deciding between round trips. A batch of N
//! messages is `BEGIN`, four statements and `COMMIT`, whatever N is, with
//! the stock taken last so the hot inventory row is locked only for that
//! statement and the commit (see [`sql::TAKE_STOCK`]). Two more statements
//! run only in the batch that gets fewer units than it placed orders.

use super::plan::{self, Allocation, Fresh, Screened};
use super::{MessageOutcome, Parsed, ProcessError, RejectReason, sql};
use crate::domain::ids::{ActivityId, MessageId, OrderId, ReservationId, SkuId, UserId};
use crate::domain::message::{
    CANCEL_EVENT, CancelOrderIfUnpaid, OrderCreateRequested, SCHEMA_VERSION,
};
use crate::domain::message::{
    ORDER_CREATED_EVENT, OrderEvent, RELEASE_RESERVATION_EVENT, ReleaseReservation,
    TAG_CANCEL_IF_UNPAID, TAG_ORDER_CREATED, TAG_RELEASE_RESERVATION, json,
};
use crate::domain::stats::ConsumeStats;
use crate::domain::status::{CompensationSource, InboxStatus, OrderStatus, ReservationOutcome};
use crate::mq::{Names, TopicKind};
use chrono::{DateTime, Utc};
use sqlx::{PgPool, Postgres, Transaction};
use std::collections::{HashMap, HashSet};

/// Result code of a message whose reservation was decided by another message.
const DUPLICATE_RESERVATION: &str = "DUPLICATE_RESERVATION";

pub(super) async fn process(
    pool: &PgPool,
    group: &str,
    names: &Names,
    msgs: &[Parsed],
    stats: &ConsumeStats,
) -> Result<Vec<MessageOutcome>, ProcessError> {
    let mut outcomes: Vec<Option<MessageOutcome>> = vec![None; msgs.len()];

    // The same message_id twice in one batch counts once: the first copy
    // competes, the others are already processed by it.
    let mut seen: HashSet<&MessageId> = HashSet::with_capacity(msgs.len());
    let mut batch: Vec<usize> = Vec::with_capacity(msgs.len());
    for (i, p) in msgs.iter().enumerate() {
        if seen.insert(&p.msg.message_id) {
            batch.push(i);
        } else {
            outcomes[i] = Some(MessageOutcome::AlreadyProcessed);
        }
    }
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    // Oldest reservation first: it wins stock and the user's one order.
    batch.sort_by_key(|&i| (msgs[i].msg.reservation_created_at, i));
    let ordered: Vec<&Parsed> = batch.iter().map(|&i| &msgs[i]).collect();

    // The wait for a pooled connection is what docs/architecture.md §10.7 warns about when
    // consumers outnumber the PostgreSQL budget; it includes BEGIN's round trip.
    let asked = std::time::Instant::now();
    let mut tx = pool.begin_with(sql::BEGIN).await?;
    stats.pool_wait.record(asked.elapsed());

    // Round trip 1: inbox and reservation claims.
    let rows = inbox_and_claim(&mut tx, group, &ordered).await?;
    let (fresh_pos, fresh, pay_within) = fresh_in_batch_order(&ordered, &rows);
    let Some(tx_now) = rows.first().map(|r| r.tx_now) else {
        // Every message was consumed before: nothing was written.
        tx.commit().await?;
        return Ok(vec![MessageOutcome::AlreadyProcessed; msgs.len()]);
    };

    // Per fresh message (index into `fresh`), its outcome so far.
    let screened = plan::screen(&fresh);
    let mut decided: Vec<Option<MessageOutcome>> = screened
        .iter()
        .map(|s| match s {
            Screened::DuplicateReservation => Some(MessageOutcome::DuplicateReservation),
            Screened::Rejected(r) => Some(MessageOutcome::Rejected(*r)),
            Screened::Candidate => None,
        })
        .collect();
    let candidates: Vec<usize> = (0..fresh.len())
        .filter(|&f| screened[f] == Screened::Candidate)
        .collect();

    // A candidate's SKU without an inventory row fails the batch here, before
    // the order insert would fail on its foreign key with a plain database
    // error: the handler sets that SKU's messages aside (docs/architecture.md §9). The
    // first such SKU in key order, as the lock order would meet it.
    if let Some(f) = candidates
        .iter()
        .filter(|&&f| pay_within[f].is_none())
        .min_by_key(|&&f| (fresh[f].activity_id, fresh[f].sku_id))
    {
        return Err(ProcessError::MissingInventory {
            activity_id: fresh[*f].activity_id,
            sku_id: fresh[*f].sku_id,
        });
    }

    // Round trip 2: an order for every candidate, before any stock is taken.
    // A candidate whose user a concurrent order took is a duplicate.
    let mut placed: Vec<Placed> = Vec::new();
    if !candidates.is_empty() {
        let expires: Vec<DateTime<Utc>> = candidates
            .iter()
            .map(|&f| {
                let ms = pay_within[f].expect("checked above");
                tx_now + chrono::Duration::milliseconds(ms)
            })
            .collect();
        let inserted = insert_orders(&mut tx, &ordered, &fresh_pos, &candidates, &expires).await?;
        for (&f, &expires_at) in candidates.iter().zip(&expires) {
            let m = &ordered[fresh_pos[f]].msg;
            if inserted.contains(&m.order_id) {
                placed.push(Placed::new(f, expires_at));
                decided[f] = Some(MessageOutcome::Created {
                    order_id: m.order_id.clone(),
                });
            } else {
                decided[f] = Some(MessageOutcome::Rejected(RejectReason::DuplicateUser));
            }
        }
    }
    let mut decided: Vec<MessageOutcome> = decided
        .into_iter()
        .map(|d| d.expect("every fresh message is decided by now"))
        .collect();

    // Round trip 3: ledger, outcomes, compensations, outbox, inbox, written
    // as if every placed order gets its unit.
    Finish::build(
        group,
        names,
        tx_now,
        &ordered,
        &fresh_pos,
        decided.iter().enumerate(),
        &placed,
    )
    .run(&mut tx)
    .await?;

    // Round trip 4: the stock, last, so the hot row is locked only from here
    // to the end of the commit.
    let alloc = Allocation::new(placed.iter().map(|p| {
        let m = &ordered[fresh_pos[p.fresh]].msg;
        (p.fresh, m.activity_id, m.sku_id)
    }));
    if !alloc.is_empty() {
        let granted = take_stock(&mut tx, &alloc.wanted()).await?;
        let unserved = alloc.unserved(|a, s| {
            granted
                .iter()
                .find(|g| g.activity_id == a && g.sku_id == s)
                .map_or(0, |g| g.granted)
        });
        if !unserved.is_empty() {
            // Fewer units than orders: the newest orders become NO_STOCK
            // rejections, each compensated once, in this same transaction,
            // so nothing of the optimistic rows is ever seen.
            for &f in &unserved {
                decided[f] = MessageOutcome::Rejected(RejectReason::NoStock);
            }
            let undone: Vec<&Placed> = placed
                .iter()
                .filter(|p| unserved.binary_search(&p.fresh).is_ok())
                .collect();
            let deleted = undo_orders(&mut tx, &ordered, &fresh_pos, &undone).await?;
            debug_assert_eq!(deleted, undone.len() as i64, "rows of this transaction");
            Finish::build(
                group,
                names,
                tx_now,
                &ordered,
                &fresh_pos,
                unserved.iter().map(|&f| (f, &decided[f])),
                &[],
            )
            .run(&mut tx)
            .await?;
        }
    }
    tx.commit().await?;

    // Back to input order.
    let mut by_pos: Vec<Option<MessageOutcome>> = vec![None; ordered.len()];
    for (f, d) in decided.into_iter().enumerate() {
        by_pos[fresh_pos[f]] = Some(d);
    }
    for (k, d) in by_pos.into_iter().enumerate() {
        outcomes[batch[k]] = Some(d.unwrap_or(MessageOutcome::AlreadyProcessed));
    }
    Ok(outcomes
        .into_iter()
        .map(|o| o.unwrap_or(MessageOutcome::AlreadyProcessed))
        .collect())
}

/// The messages new to the inbox, in batch order: each one's position in
/// `ordered`, what the claim said about it, and its activity's payment
/// window (`None`: no inventory row for its SKU).
fn fresh_in_batch_order(
    ordered: &[&Parsed],
    rows: &[ClaimRow],
) -> (Vec<usize>, Vec<Fresh>, Vec<Option<i64>>) {
    let pos: HashMap<&MessageId, usize> = ordered
        .iter()
        .enumerate()
        .map(|(k, p)| (&p.msg.message_id, k))
        .collect();
    let mut by_pos: Vec<(usize, &ClaimRow)> = rows
        .iter()
        .filter_map(|r| pos.get(&r.message_id).map(|&k| (k, r)))
        .collect();
    by_pos.sort_by_key(|(k, _)| *k);
    let mut out = (
        Vec::with_capacity(by_pos.len()),
        Vec::with_capacity(by_pos.len()),
        Vec::with_capacity(by_pos.len()),
    );
    for (k, r) in by_pos {
        let m = &ordered[k].msg;
        out.0.push(k);
        out.1.push(Fresh {
            activity_id: m.activity_id,
            sku_id: m.sku_id,
            user_id: m.user_id,
            claimed: r.outcome,
            user_has_order: r.user_has_order,
        });
        out.2.push(r.pay_within_ms);
    }
    out
}

/// An order this transaction inserted, with the ids of its two outbox rows
/// (chosen here so [`sql::UNDO_ORDERS`] can find them again).
struct Placed {
    /// Index into the fresh messages.
    fresh: usize,
    expires_at: DateTime<Utc>,
    cancel_id: MessageId,
    event_id: MessageId,
}

impl Placed {
    fn new(fresh: usize, expires_at: DateTime<Utc>) -> Self {
        Self {
            fresh,
            expires_at,
            cancel_id: MessageId::generate(),
            event_id: MessageId::generate(),
        }
    }
}

#[derive(sqlx::FromRow)]
struct ClaimRow {
    message_id: MessageId,
    outcome: Option<ReservationOutcome>,
    user_has_order: bool,
    pay_within_ms: Option<i64>,
    tx_now: DateTime<Utc>,
}

async fn inbox_and_claim(
    tx: &mut Transaction<'static, Postgres>,
    group: &str,
    ordered: &[&Parsed],
) -> Result<Vec<ClaimRow>, sqlx::Error> {
    sqlx::query_as(sql::INBOX_AND_CLAIM)
        .bind(group)
        .bind(column(ordered, |p| p.msg.message_id.clone()))
        .bind(column(ordered, |p| p.delivery_attempt))
        .bind(column(ordered, |p| p.replay_id.clone()))
        .bind(column(ordered, |p| p.msg.reservation_id.clone()))
        .bind(column(ordered, |p| p.msg.request_id.clone()))
        .bind(column(ordered, |p| p.msg.order_id.clone()))
        .bind(column(ordered, |p| p.msg.activity_id))
        .bind(column(ordered, |p| p.msg.sku_id))
        .bind(column(ordered, |p| p.msg.user_id))
        .bind(column(ordered, |p| p.msg.reservation_valid_until))
        .bind(column(ordered, |p| p.msg.reservation_created_at))
        .fetch_all(&mut **tx)
        .await
}

#[derive(sqlx::FromRow)]
struct Granted {
    activity_id: ActivityId,
    sku_id: SkuId,
    granted: i64,
}

async fn take_stock(
    tx: &mut Transaction<'static, Postgres>,
    wanted: &[(ActivityId, SkuId, i64)],
) -> Result<Vec<Granted>, sqlx::Error> {
    sqlx::query_as(sql::TAKE_STOCK)
        .bind(wanted.iter().map(|w| w.0).collect::<Vec<_>>())
        .bind(wanted.iter().map(|w| w.1).collect::<Vec<_>>())
        .bind(wanted.iter().map(|w| w.2).collect::<Vec<_>>())
        .fetch_all(&mut **tx)
        .await
}

async fn insert_orders(
    tx: &mut Transaction<'static, Postgres>,
    ordered: &[&Parsed],
    fresh_pos: &[usize],
    round: &[usize],
    expires: &[DateTime<Utc>],
) -> Result<HashSet<OrderId>, sqlx::Error> {
    let msgs: Vec<&OrderCreateRequested> =
        round.iter().map(|&f| &ordered[fresh_pos[f]].msg).collect();
    let ids: Vec<OrderId> = sqlx::query_scalar(sql::INSERT_ORDERS)
        .bind(column(&msgs, |m| m.order_id.clone()))
        .bind(column(&msgs, |m| m.reservation_id.clone()))
        .bind(column(&msgs, |m| m.request_id.clone()))
        .bind(column(&msgs, |m| m.activity_id))
        .bind(column(&msgs, |m| m.sku_id))
        .bind(column(&msgs, |m| m.user_id))
        .bind(expires)
        .fetch_all(&mut **tx)
        .await?;
    Ok(ids.into_iter().collect())
}

async fn undo_orders(
    tx: &mut Transaction<'static, Postgres>,
    ordered: &[&Parsed],
    fresh_pos: &[usize],
    undone: &[&Placed],
) -> Result<i64, sqlx::Error> {
    let msgs: Vec<&OrderCreateRequested> = undone
        .iter()
        .map(|p| &ordered[fresh_pos[p.fresh]].msg)
        .collect();
    let outbox: Vec<MessageId> = undone
        .iter()
        .flat_map(|p| [p.cancel_id.clone(), p.event_id.clone()])
        .collect();
    sqlx::query_scalar(sql::UNDO_ORDERS)
        .bind(column(&msgs, |m| m.order_id.clone()))
        .bind(column(&msgs, |m| m.reservation_id.clone()))
        .bind(outbox)
        .fetch_one(&mut **tx)
        .await
}

fn column<T, U>(items: &[T], f: impl Fn(&T) -> U) -> Vec<U> {
    items.iter().map(f).collect()
}

/// The bind arrays of [`sql::FINISH`], one `Vec` per column.
#[derive(Default)]
struct Finish {
    ledger_rsv: Vec<ReservationId>,
    ledger_order: Vec<OrderId>,
    ledger_activity: Vec<ActivityId>,
    ledger_sku: Vec<SkuId>,
    ledger_msg: Vec<MessageId>,
    rej_rsv: Vec<ReservationId>,
    rej_outcome: Vec<ReservationOutcome>,
    rej_activity: Vec<ActivityId>,
    rej_sku: Vec<SkuId>,
    rej_user: Vec<UserId>,
    rej_reason: Vec<&'static str>,
    rel_msg: Vec<MessageId>,
    rel_payload: Vec<serde_json::Value>,
    rel_topic: String,
    out_msg: Vec<MessageId>,
    out_topic: Vec<String>,
    out_tag: Vec<&'static str>,
    out_key: Vec<OrderId>,
    out_payload: Vec<serde_json::Value>,
    out_deliver_at: Vec<Option<DateTime<Utc>>>,
    group: String,
    inbox_msg: Vec<MessageId>,
    inbox_status: Vec<InboxStatus>,
    inbox_code: Vec<&'static str>,
}

impl Finish {
    /// `decided`: (fresh index, outcome) of the messages whose inbox row and
    /// rejection to write; `placed`: the orders whose ledger and outbox rows
    /// to write.
    fn build<'a>(
        group: &str,
        names: &Names,
        tx_now: DateTime<Utc>,
        ordered: &[&Parsed],
        fresh_pos: &[usize],
        decided: impl IntoIterator<Item = (usize, &'a MessageOutcome)>,
        placed: &[Placed],
    ) -> Self {
        let mut f = Finish {
            group: group.to_owned(),
            rel_topic: names.topic(TopicKind::InventoryCompensate),
            ..Finish::default()
        };
        let msg = |i: usize| &ordered[fresh_pos[i]].msg;

        for p in placed {
            let (m, expires_at) = (msg(p.fresh), p.expires_at);
            f.ledger_rsv.push(m.reservation_id.clone());
            f.ledger_order.push(m.order_id.clone());
            f.ledger_activity.push(m.activity_id);
            f.ledger_sku.push(m.sku_id);
            f.ledger_msg.push(m.message_id.clone());

            // The delayed cancel: delivered by the broker at expires_at
            // (docs/architecture.md §8), so an unpaid order gives its stock back.
            let cancel_id = p.cancel_id.clone();
            f.push_out(
                cancel_id.clone(),
                names.topic(TopicKind::OrderTimeout),
                TAG_CANCEL_IF_UNPAID,
                m.order_id.clone(),
                json(&CancelOrderIfUnpaid {
                    schema_version: SCHEMA_VERSION,
                    event_type: CANCEL_EVENT.to_owned(),
                    message_id: cancel_id.clone(),
                    message_key: m.order_id.clone(),
                    order_id: m.order_id.clone(),
                    reservation_id: m.reservation_id.clone(),
                    activity_id: m.activity_id,
                    sku_id: m.sku_id,
                    user_id: m.user_id,
                    deliver_at: expires_at,
                    created_at: tx_now,
                    retry_count: 0,
                    replay_count: 0,
                }),
                Some(expires_at),
            );
            let event_id = p.event_id.clone();
            f.push_out(
                event_id.clone(),
                names.topic(TopicKind::OrderEvent),
                TAG_ORDER_CREATED,
                m.order_id.clone(),
                json(&OrderEvent {
                    schema_version: SCHEMA_VERSION,
                    event_type: ORDER_CREATED_EVENT.to_owned(),
                    message_id: event_id,
                    order_id: m.order_id.clone(),
                    reservation_id: m.reservation_id.clone(),
                    activity_id: m.activity_id,
                    sku_id: m.sku_id,
                    user_id: m.user_id,
                    status: OrderStatus::Created,
                    aggregate_version: 1,
                    occurred_at: tx_now,
                }),
                None,
            );
        }

        for (i, d) in decided {
            let m = msg(i);
            let (status, code) = match d {
                // The inbox row went in as this (sql::INBOX_AND_CLAIM).
                MessageOutcome::Created { .. } => continue,
                MessageOutcome::DuplicateReservation => {
                    (InboxStatus::Succeeded, DUPLICATE_RESERVATION)
                }
                MessageOutcome::Rejected(r) => {
                    let outcome = r.outcome();
                    let release_id = MessageId::generate();
                    f.rej_rsv.push(m.reservation_id.clone());
                    f.rej_outcome.push(outcome);
                    f.rej_activity.push(m.activity_id);
                    f.rej_sku.push(m.sku_id);
                    f.rej_user.push(m.user_id);
                    f.rej_reason.push(outcome.as_str());
                    f.rel_msg.push(release_id.clone());
                    f.rel_payload.push(json(&ReleaseReservation {
                        schema_version: SCHEMA_VERSION,
                        event_type: RELEASE_RESERVATION_EVENT.to_owned(),
                        message_id: release_id,
                        reservation_id: m.reservation_id.clone(),
                        activity_id: m.activity_id,
                        sku_id: m.sku_id,
                        user_id: m.user_id,
                        source: CompensationSource::BusinessRejection,
                        reason: outcome.as_str().to_owned(),
                        created_at: tx_now,
                    }));
                    (InboxStatus::Rejected, outcome.as_str())
                }
                MessageOutcome::AlreadyProcessed => {
                    unreachable!("fresh messages are new to the inbox")
                }
            };
            f.inbox_msg.push(m.message_id.clone());
            f.inbox_status.push(status);
            f.inbox_code.push(code);
        }
        f
    }

    fn push_out(
        &mut self,
        id: MessageId,
        topic: String,
        tag: &'static str,
        key: OrderId,
        payload: serde_json::Value,
        deliver_at: Option<DateTime<Utc>>,
    ) {
        self.out_msg.push(id);
        self.out_topic.push(topic);
        self.out_tag.push(tag);
        self.out_key.push(key);
        self.out_payload.push(payload);
        self.out_deliver_at.push(deliver_at);
    }

    async fn run(self, tx: &mut Transaction<'static, Postgres>) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(sql::FINISH)
            .bind(self.ledger_rsv)
            .bind(self.ledger_order)
            .bind(self.ledger_activity)
            .bind(self.ledger_sku)
            .bind(self.ledger_msg)
            .bind(self.rej_rsv)
            .bind(self.rej_outcome)
            .bind(self.rej_activity)
            .bind(self.rej_sku)
            .bind(self.rej_user)
            .bind(self.rej_reason)
            .bind(self.rel_msg)
            .bind(self.rel_payload)
            .bind(self.rel_topic)
            .bind(TAG_RELEASE_RESERVATION)
            .bind(self.out_msg)
            .bind(self.out_topic)
            .bind(self.out_tag)
            .bind(self.out_key)
            .bind(self.out_payload)
            .bind(self.out_deliver_at)
            .bind(self.group)
            .bind(self.inbox_msg)
            .bind(self.inbox_status)
            .bind(self.inbox_code)
            .fetch_one(&mut **tx)
            .await
    }
}
