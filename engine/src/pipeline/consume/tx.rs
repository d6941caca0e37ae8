//! The order transaction of docs/architecture.md §7.1, one step per round
//! trip: [`process`] reads as the table there, each step runs one [`sql`]
//! statement, and the pure [`plan`] decides between round trips. A batch of
//! N messages is `BEGIN`, four statements and `COMMIT`, whatever N is, with
//! the stock taken last so the hot inventory row is locked only for that
//! statement and the commit (§7.2, [`sql::TAKE_STOCK`]). Two more
//! statements run only in the batch that gets fewer units than it placed
//! orders (step 4′).

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

/// Runs the transaction of docs/architecture.md §7.1 for one listener batch
/// and commits it; one outcome per message, in input order. Each step below
/// is one row of that table, in its order. The order is the design, not a
/// detail: the stock must stay last (§7.2), and the pgbench scripts in
/// `tests/bench/` run these statements in this order to measure it (§7), so
/// no step is moved, merged or added here without them. On error the
/// transaction is dropped uncommitted (rolled back) and the handler retries
/// the batch (§7.3).
pub(super) async fn process(
    pool: &PgPool,
    group: &str,
    names: &Names,
    msgs: &[Parsed],
    stats: &ConsumeStats,
) -> Result<Vec<MessageOutcome>, ProcessError> {
    // Before BEGIN: a repeated message_id counts once, oldest reservation
    // first (it wins the stock and the user's single order).
    let competing = plan::batch_order(
        msgs,
        |p| &p.msg.message_id,
        |p| p.msg.reservation_created_at,
    );
    if competing.is_empty() {
        return Ok(Vec::new());
    }
    // Step 0: BEGIN ISOLATION LEVEL READ COMMITTED.
    let mut tx = begin(pool, stats).await?;
    let outcomes = steps(&mut tx, group, names, msgs, &competing).await?;
    // Step 5: COMMIT; the handler ACKs only after this returns (§7.3).
    tx.commit().await?;
    Ok(outcomes)
}

/// Steps 1 to 4′ of [`process`] in `tx`, uncommitted: the same statements
/// for a DLQ rehearsal, which rolls them back (docs/architecture.md §9.3).
pub async fn rehearse_in(
    tx: &mut Transaction<'static, Postgres>,
    group: &str,
    names: &Names,
    msgs: &[Parsed],
) -> Result<Vec<MessageOutcome>, ProcessError> {
    let competing = plan::batch_order(
        msgs,
        |p| &p.msg.message_id,
        |p| p.msg.reservation_created_at,
    );
    if competing.is_empty() {
        return Ok(Vec::new());
    }
    steps(tx, group, names, msgs, &competing).await
}

async fn steps(
    tx: &mut Transaction<'static, Postgres>,
    group: &str,
    names: &Names,
    msgs: &[Parsed],
    competing: &[usize],
) -> Result<Vec<MessageOutcome>, ProcessError> {
    let ordered: Vec<&Parsed> = competing.iter().map(|&i| &msgs[i]).collect();
    // Step 1: the inbox rows and the reservation claims.
    let rows = inbox_and_claim(tx, group, &ordered).await?;
    let Some(tx_now) = rows.first().map(|r| r.tx_now) else {
        // Every message was consumed before: nothing was written.
        return Ok(vec![MessageOutcome::AlreadyProcessed; msgs.len()]);
    };
    let batch = Batch::claimed(group, names, &ordered, &rows, tx_now);
    // Pure, before any order exists: duplicates, rejections, candidates.
    let (screened, candidates) = screen(&batch)?;
    // Step 2: an order per candidate.
    let (placed, mut decided) = place_orders(tx, &batch, &candidates, screened).await?;
    // Step 3: ledger, rejections, compensations, outbox, inbox.
    write_side_rows(tx, &batch, &placed, &decided).await?;
    // Step 4: the stock, last, so the hot row is locked only from here to
    // the end of the commit (§7.2).
    let unserved = take_stock_last(tx, &batch, &placed).await?;
    // Step 4′: only when fewer units were granted than orders placed.
    if !unserved.is_empty() {
        settle_shortfall(tx, &batch, &placed, &unserved, &mut decided).await?;
    }
    Ok(plan::in_input_order(
        msgs.len(),
        competing,
        &batch.fresh_pos,
        decided,
    ))
}

/// Step 0 (docs/architecture.md §7.1). The wait for a pooled connection is
/// what §10.7 warns about when consumers outnumber the PostgreSQL budget;
/// it includes BEGIN's round trip, and is recorded only when it succeeds.
async fn begin(
    pool: &PgPool,
    stats: &ConsumeStats,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    let asked = std::time::Instant::now();
    let tx = pool.begin_with(sql::BEGIN).await?;
    stats.pool_wait.record(asked.elapsed());
    Ok(tx)
}

/// The batch as every step after the claim sees it (docs/architecture.md
/// §7.1). Each step borrows it, so nothing per message is copied between
/// round trips. A *fresh* message (one new to the inbox) is named by its
/// index into `fresh`, in batch order.
struct Batch<'a> {
    group: &'a str,
    names: &'a Names,
    /// The competing messages, oldest reservation first.
    ordered: &'a [&'a Parsed],
    /// Per fresh message, its position in `ordered`.
    fresh_pos: Vec<usize>,
    /// Per fresh message, what the claim said about it.
    fresh: Vec<Fresh>,
    /// The transaction's `now()`, as [`sql::INBOX_AND_CLAIM`] read it.
    tx_now: DateTime<Utc>,
}

impl<'a> Batch<'a> {
    /// The messages new to the inbox, in batch order, from the claim's rows
    /// (which come back in no particular order).
    fn claimed(
        group: &'a str,
        names: &'a Names,
        ordered: &'a [&'a Parsed],
        rows: &[ClaimRow],
        tx_now: DateTime<Utc>,
    ) -> Self {
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
        let mut fresh_pos = Vec::with_capacity(by_pos.len());
        let mut fresh = Vec::with_capacity(by_pos.len());
        for (k, r) in by_pos {
            let m = &ordered[k].msg;
            fresh_pos.push(k);
            fresh.push(Fresh {
                activity_id: m.activity_id,
                sku_id: m.sku_id,
                user_id: m.user_id,
                claimed: r.outcome,
                user_has_order: r.user_has_order,
                pay_within_ms: r.pay_within_ms,
            });
        }
        Batch {
            group,
            names,
            ordered,
            fresh_pos,
            fresh,
            tx_now,
        }
    }

    /// The message of fresh message `f`.
    fn msg(&self, f: usize) -> &'a OrderCreateRequested {
        &self.ordered[self.fresh_pos[f]].msg
    }
}

/// Between round trips 1 and 2, pure (docs/architecture.md §7.1,
/// `plan::screen`): per fresh message, its outcome as far as it is known
/// before any order exists (`None`: a candidate), and the candidates in
/// batch order. A candidate's SKU without an inventory row fails the batch
/// here, before the order insert would fail on its foreign key with a plain
/// database error: the handler sets that SKU's messages aside and runs the
/// rest again (§7.3), and the broker dead-letters them if nobody adds the
/// row (§9).
fn screen(b: &Batch<'_>) -> Result<(Vec<Option<MessageOutcome>>, Vec<usize>), ProcessError> {
    let screened = plan::screen(&b.fresh);
    let decided: Vec<Option<MessageOutcome>> = screened
        .iter()
        .map(|s| match s {
            Screened::DuplicateReservation => Some(MessageOutcome::DuplicateReservation),
            Screened::Rejected(r) => Some(MessageOutcome::Rejected(*r)),
            Screened::Candidate => None,
        })
        .collect();
    let candidates: Vec<usize> = (0..b.fresh.len())
        .filter(|&f| screened[f] == Screened::Candidate)
        .collect();
    if let Some((activity_id, sku_id)) = plan::missing_inventory(&b.fresh, &candidates) {
        return Err(ProcessError::MissingInventory {
            activity_id,
            sku_id,
        });
    }
    Ok((decided, candidates))
}

/// Round trip 2 (docs/architecture.md §7.1 step 2): an order for every
/// candidate, before any stock is taken (§7.2). A candidate whose user a
/// concurrent order took is a duplicate instead, and wants no unit. After
/// this every fresh message is decided: returns the orders placed and
/// every fresh message's outcome.
async fn place_orders(
    tx: &mut Transaction<'static, Postgres>,
    b: &Batch<'_>,
    candidates: &[usize],
    mut decided: Vec<Option<MessageOutcome>>,
) -> Result<(Vec<Placed>, Vec<MessageOutcome>), sqlx::Error> {
    let mut placed: Vec<Placed> = Vec::new();
    if !candidates.is_empty() {
        let expires: Vec<DateTime<Utc>> = candidates
            .iter()
            .map(|&f| {
                let ms = b.fresh[f].pay_within_ms.expect("checked by screen");
                b.tx_now + chrono::Duration::milliseconds(ms)
            })
            .collect();
        let inserted = insert_orders(tx, b, candidates, &expires).await?;
        for (&f, &expires_at) in candidates.iter().zip(&expires) {
            let m = b.msg(f);
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
    let decided: Vec<MessageOutcome> = decided
        .into_iter()
        .map(|d| d.expect("every fresh message is decided by now"))
        .collect();
    Ok((placed, decided))
}

/// Round trip 3 (docs/architecture.md §7.1 step 3, [`sql::FINISH`]):
/// ledger, rejections, compensations, outbox and inbox rows, written before
/// the stock is taken as if every placed order gets its unit, so the stock
/// lock covers none of it (§7.2).
async fn write_side_rows(
    tx: &mut Transaction<'static, Postgres>,
    b: &Batch<'_>,
    placed: &[Placed],
    decided: &[MessageOutcome],
) -> Result<(), sqlx::Error> {
    Finish::build(b, decided.iter().enumerate(), placed)
        .run(tx)
        .await?;
    Ok(())
}

/// Round trip 4, the last before `COMMIT` (docs/architecture.md §7.1 step
/// 4, §7.2): one unit per placed order, per (activity, sku) in key order,
/// granted as far as the stock goes. The hot inventory row is locked from
/// this statement to the end of the commit and no longer; nothing may run
/// between here and `COMMIT` but step 4′. No statement at all when no order
/// was placed. Returns the placed orders (fresh indices, ascending) left
/// without a unit.
async fn take_stock_last(
    tx: &mut Transaction<'static, Postgres>,
    b: &Batch<'_>,
    placed: &[Placed],
) -> Result<Vec<usize>, sqlx::Error> {
    let alloc = Allocation::new(placed.iter().map(|p| {
        let m = b.msg(p.fresh);
        (p.fresh, m.activity_id, m.sku_id)
    }));
    if alloc.is_empty() {
        return Ok(Vec::new());
    }
    let granted = take_stock(tx, &alloc.wanted()).await?;
    // A row missing from the result was sold out: no units.
    Ok(alloc.unserved(|a, s| {
        granted
            .iter()
            .find(|g| g.activity_id == a && g.sku_id == s)
            .map_or(0, |g| g.granted)
    }))
}

/// Step 4′ (docs/architecture.md §7.1), only in the batch granted fewer
/// units than orders: the newest orders become `NO_STOCK` rejections, each
/// compensated once, in this same transaction, so nothing of the
/// optimistic rows is ever seen. Two round trips, both under the stock
/// lock, which is why this is not the common path.
async fn settle_shortfall(
    tx: &mut Transaction<'static, Postgres>,
    b: &Batch<'_>,
    placed: &[Placed],
    unserved: &[usize],
    decided: &mut [MessageOutcome],
) -> Result<(), sqlx::Error> {
    for &f in unserved {
        decided[f] = MessageOutcome::Rejected(RejectReason::NoStock);
    }
    let undone: Vec<&Placed> = placed
        .iter()
        .filter(|p| unserved.binary_search(&p.fresh).is_ok())
        .collect();
    let deleted = undo_orders(tx, b, &undone).await?;
    debug_assert_eq!(deleted, undone.len() as i64, "rows of this transaction");
    Finish::build(b, unserved.iter().map(|&f| (f, &decided[f])), &[])
        .run(tx)
        .await?;
    Ok(())
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

/// Round trip 1: [`sql::INBOX_AND_CLAIM`], over the batch in order.
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
        .bind(column(ordered, |p| p.trace_id().to_string()))
        .fetch_all(&mut **tx)
        .await
}

#[derive(sqlx::FromRow)]
struct Granted {
    activity_id: ActivityId,
    sku_id: SkuId,
    granted: i64,
}

/// Round trip 4: [`sql::TAKE_STOCK`]; `wanted` in key order, the lock order.
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

/// Round trip 2: [`sql::INSERT_ORDERS`] for the candidates `round`; returns
/// the order ids actually inserted.
async fn insert_orders(
    tx: &mut Transaction<'static, Postgres>,
    b: &Batch<'_>,
    round: &[usize],
    expires: &[DateTime<Utc>],
) -> Result<HashSet<OrderId>, sqlx::Error> {
    let msgs: Vec<&OrderCreateRequested> = round.iter().map(|&f| b.msg(f)).collect();
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

/// Step 4′: [`sql::UNDO_ORDERS`] for the orders left without a unit;
/// returns the number of orders deleted.
async fn undo_orders(
    tx: &mut Transaction<'static, Postgres>,
    b: &Batch<'_>,
    undone: &[&Placed],
) -> Result<i64, sqlx::Error> {
    let msgs: Vec<&OrderCreateRequested> = undone.iter().map(|p| b.msg(p.fresh)).collect();
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
        b: &Batch<'_>,
        decided: impl IntoIterator<Item = (usize, &'a MessageOutcome)>,
        placed: &[Placed],
    ) -> Self {
        let mut f = Finish {
            group: b.group.to_owned(),
            rel_topic: b.names.topic(TopicKind::InventoryCompensate),
            ..Finish::default()
        };
        for p in placed {
            f.push_order(b.names, b.tx_now, b.msg(p.fresh), p);
        }
        for (i, d) in decided {
            f.push_decided(b.tx_now, b.msg(i), d);
        }
        f
    }

    /// A placed order's ledger row (−1) and its two outbox rows
    /// (docs/architecture.md §7.1 step 3).
    fn push_order(
        &mut self,
        names: &Names,
        tx_now: DateTime<Utc>,
        m: &OrderCreateRequested,
        p: &Placed,
    ) {
        let expires_at = p.expires_at;
        self.ledger_rsv.push(m.reservation_id.clone());
        self.ledger_order.push(m.order_id.clone());
        self.ledger_activity.push(m.activity_id);
        self.ledger_sku.push(m.sku_id);
        self.ledger_msg.push(m.message_id.clone());

        // The delayed cancel: delivered by the broker at expires_at
        // (docs/architecture.md §8.2), so an unpaid order gives its stock back.
        let cancel_id = p.cancel_id.clone();
        self.push_out(
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
        self.push_out(
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

    /// A decided message's inbox rewrite and, for a rejection, its final
    /// outcome and one compensation with its `RELEASE_RESERVATION` payload
    /// (docs/architecture.md §7.1 step 3). A created order's inbox row
    /// already went in as such ([`sql::INBOX_AND_CLAIM`]): nothing to write.
    fn push_decided(
        &mut self,
        tx_now: DateTime<Utc>,
        m: &OrderCreateRequested,
        d: &MessageOutcome,
    ) {
        let (status, code) = match d {
            MessageOutcome::Created { .. } => return,
            MessageOutcome::DuplicateReservation => (InboxStatus::Succeeded, DUPLICATE_RESERVATION),
            MessageOutcome::Rejected(r) => {
                let outcome = r.outcome();
                let release_id = MessageId::generate();
                self.rej_rsv.push(m.reservation_id.clone());
                self.rej_outcome.push(outcome);
                self.rej_activity.push(m.activity_id);
                self.rej_sku.push(m.sku_id);
                self.rej_user.push(m.user_id);
                self.rej_reason.push(outcome.as_str());
                self.rel_msg.push(release_id.clone());
                self.rel_payload.push(json(&ReleaseReservation {
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
        self.inbox_msg.push(m.message_id.clone());
        self.inbox_status.push(status);
        self.inbox_code.push(code);
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
