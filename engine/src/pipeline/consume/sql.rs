//! The consumer's SQL, one constant per round trip of the order transaction
//! (docs/architecture.md §7), plus the two statements written outside it.
//!
//! Every statement is set-based over `unnest` arrays, so a batch of N
//! messages costs the same number of round trips as one message:
//! `BEGIN`, [`INBOX_AND_CLAIM`], [`INSERT_ORDERS`], [`FINISH`],
//! [`TAKE_STOCK`], `COMMIT`. The stock is taken last on purpose: the hot
//! inventory row stays locked from [`TAKE_STOCK`] to the end of `COMMIT`,
//! and that window bounds the throughput of a SKU (docs/architecture.md §7,
//! "Batching"). Everything else is written first, optimistically, as if
//! every order got its unit; in the rare batch that gets fewer units than
//! orders, [`UNDO_ORDERS`] and a second [`FINISH`] turn the newest orders
//! into `NO_STOCK` rejections before the same commit. The constants are
//! public so the pgbench scripts in `tests/bench/` can be checked against
//! them: they must run these exact statements (the hot path: no undo), with
//! each `$n` spelled as a pgbench variable.
//!
//! The statements carry no `--` comments (pgbench would have to match
//! them too); the reasons are here.

/// Starts the transaction. READ COMMITTED is the server default, but the
/// stock arithmetic in [`TAKE_STOCK`] relies on its row-lock re-check
/// semantics, so it is stated rather than assumed.
pub const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// Round trip 1: the inbox, then the claim on each reservation.
///
/// - The inbox insert is the at-most-once gate per `message_id` (docs/architecture.md
///   §12, "the business effect per message_id happens at most once"): a
///   concurrent delivery of the same message blocks on the primary key until
///   this transaction ends, then inserts nothing. Rows go in `message_id`
///   order so two batches never wait on each other in a cycle. The row goes
///   in as `SUCCEEDED`/`ORDER_CREATED`, the outcome of nearly every message
///   in a sale; [`FINISH`] rewrites only the others. No other transaction
///   can see the row before the commit settles it, so a `PROCESSING` step
///   would cost one more row version per message and show nothing.
/// - The `reservations` row is inserted *now*, as a claim, not at the end:
///   its primary key makes a second message for the same reservation (docs/architecture.md
///   §12.1 item 2) wait for the first and then find it decided, whatever the
///   first decided. Without the claim, two concurrent messages for one
///   reservation could both take stock, or one create an order while the
///   other compensates. The outcome written here is final for expired
///   reservations; for the others it is provisional and [`FINISH`] settles
///   it before commit, so no other transaction ever sees it.
/// - `DISTINCT ON` keeps the first message per reservation in batch order;
///   a later one in the same batch is a duplicate just like a committed one.
/// - `user_has_order` reads committed orders. An order committed after this
///   statement's snapshot is caught later by the insert's arbiter.
/// - `pay_within_ms` is read here, without a lock, because the orders go in
///   before the stock is taken and need their `expires_at`. It is NULL when
///   the (activity, sku) has no inventory row: the caller must refuse the
///   batch then, before [`INSERT_ORDERS`] would fail on the foreign key.
///
/// Returns one row per message new to the inbox: `outcome` NULL means the
/// reservation was already claimed.
///
/// `$1` group, `$2` message ids, `$3` delivery attempts, `$4` replay ids,
/// `$5` reservation ids, `$6` request ids, `$7` order ids, `$8` activity ids,
/// `$9` sku ids, `$10` user ids, `$11` valid until, `$12` reserved at,
/// `$13` trace ids (docs/architecture.md §11.5).
pub const INBOX_AND_CLAIM: &str = r#"WITH input AS (
    SELECT *
    FROM unnest($2::text[], $3::int[], $4::text[], $5::text[], $6::text[], $7::text[],
                $8::bigint[], $9::bigint[], $10::bigint[], $11::timestamptz[], $12::timestamptz[],
                $13::text[])
         WITH ORDINALITY
         AS t (message_id, delivery_attempt, replay_id, reservation_id, request_id, order_id,
               activity_id, sku_id, user_id, valid_until, reserved_at, trace_id, ord)
), inbox AS (
    INSERT INTO consumer_inbox (consumer_group, message_id, status, result_code, delivery_attempt, replay_id)
    SELECT $1::text, message_id, 'SUCCEEDED', 'ORDER_CREATED', delivery_attempt, replay_id
    FROM input
    ORDER BY message_id
    ON CONFLICT (consumer_group, message_id) DO NOTHING
    RETURNING message_id
), claim AS (
    INSERT INTO reservations (reservation_id, message_id, request_id, order_id, activity_id,
                              sku_id, user_id, outcome, valid_until, reserved_at, trace_id)
    SELECT DISTINCT ON (i.reservation_id)
           i.reservation_id, i.message_id, i.request_id, i.order_id, i.activity_id,
           i.sku_id, i.user_id,
           CASE WHEN now() > i.valid_until THEN 'REJECTED_EXPIRED'::reservation_outcome
                ELSE 'ORDER_CREATED'::reservation_outcome END,
           i.valid_until, i.reserved_at, i.trace_id
    FROM input i
    JOIN inbox USING (message_id)
    ORDER BY i.reservation_id, i.ord
    ON CONFLICT (reservation_id) DO NOTHING
    RETURNING message_id, outcome
)
SELECT i.message_id,
       c.outcome,
       EXISTS (SELECT 1 FROM orders o
               WHERE o.activity_id = i.activity_id AND o.user_id = i.user_id
                 AND o.status <> 'CANCELED') AS user_has_order,
       (SELECT a.pay_within_ms
        FROM inventory v
        JOIN activities a ON a.activity_id = v.activity_id
        WHERE v.activity_id = i.activity_id AND v.sku_id = i.sku_id) AS pay_within_ms,
       now() AS tx_now
FROM input i
JOIN inbox USING (message_id)
LEFT JOIN claim c USING (message_id)"#;

/// Round trip 2: the orders of every candidate, before any stock is taken
/// (see [`TAKE_STOCK`] for why).
///
/// The partial unique index `orders_one_per_user` is the named arbiter
/// (docs/architecture.md §5, §12 "valid orders per user ≤ 1"): a concurrent order for
/// the same user makes this row wait, then be skipped, instead of failing
/// the whole batch. Any other unique violation (order id, reservation id)
/// is not absorbed: it is a bug upstream and fails the transaction. Rows go
/// in (activity, user) order so two batches never wait on each other in a
/// cycle. `quantity` is 1: [`crate::domain::message::parse_order_create`] refuses
/// anything else, and the stock arithmetic counts orders.
///
/// Returns the order ids actually inserted: a candidate whose user lost to
/// a concurrent order is a duplicate, and wants no unit.
///
/// `$1` order ids, `$2` reservation ids, `$3` request ids, `$4` activity ids,
/// `$5` sku ids, `$6` user ids, `$7` expires at.
pub const INSERT_ORDERS: &str = r#"INSERT INTO orders (order_id, reservation_id, request_id, activity_id, sku_id, user_id,
                    quantity, status, expires_at, aggregate_version)
SELECT order_id, reservation_id, request_id, activity_id, sku_id, user_id,
       1, 'CREATED', expires_at, 1
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[],
            $7::timestamptz[])
     AS t (order_id, reservation_id, request_id, activity_id, sku_id, user_id, expires_at)
ORDER BY activity_id, user_id
ON CONFLICT (activity_id, user_id) WHERE status <> 'CANCELED' DO NOTHING
RETURNING order_id"#;

/// Round trip 3: everything that follows from the decisions, in one
/// statement of independent data-modifying CTEs, written before the stock
/// is taken as if every order placed got its unit. Run a second time, with
/// only the rejections and inbox rows, for the orders [`UNDO_ORDERS`]
/// removed.
///
/// - `ledger`: one `ORDER_CREATED` movement per order; `UNIQUE
///   (reservation_id, reason)` makes a second one impossible.
/// - `decided`: the final outcome of rejected reservations.
/// - `comp` and `release`: at most one compensation per reservation
///   (docs/architecture.md §12): the `RELEASE_RESERVATION` outbox row is written only
///   when this statement inserted the `compensation_tasks` row.
/// - `order_outbox`: the delayed cancel and `ORDER_CREATED`, committed with
///   the order (the transactional outbox, docs/architecture.md §7 step 6).
/// - `finished`: the inbox rows of the messages that did not create an
///   order get their real status and result code (see [`INBOX_AND_CLAIM`]);
///   on the second run, those [`UNDO_ORDERS`] turned into rejections.
///
/// Returns the number of compensations inserted.
///
/// Orders: `$1` reservation ids, `$2` order ids, `$3` activity ids, `$4` sku
/// ids, `$5` message ids. Rejections: `$6` reservation ids, `$7` outcomes,
/// `$8` activity ids, `$9` sku ids, `$10` user ids, `$11` reasons, `$12`
/// release message ids, `$13` release payloads, `$14` release topic, `$15`
/// release tag. Order outbox rows: `$16` message ids, `$17` topics, `$18`
/// tags, `$19` keys, `$20` payloads, `$21` deliver at. Inbox: `$22` group,
/// `$23` message ids, `$24` statuses, `$25` result codes.
pub const FINISH: &str = r#"WITH ledger AS (
    INSERT INTO inventory_ledger (reservation_id, order_id, activity_id, sku_id, reason, delta, message_id)
    SELECT reservation_id, order_id, activity_id, sku_id, 'ORDER_CREATED', -1, message_id
    FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[])
         AS t (reservation_id, order_id, activity_id, sku_id, message_id)
), rejected AS (
    SELECT *
    FROM unnest($6::text[], $7::reservation_outcome[], $8::bigint[], $9::bigint[], $10::bigint[],
                $11::text[], $12::text[], $13::jsonb[])
         AS t (reservation_id, outcome, activity_id, sku_id, user_id, reason, message_id, payload)
), decided AS (
    UPDATE reservations r
    SET outcome = x.outcome, decided_at = now(), updated_at = now()
    FROM rejected x
    WHERE r.reservation_id = x.reservation_id
), comp AS (
    INSERT INTO compensation_tasks (reservation_id, activity_id, sku_id, user_id, source, reason)
    SELECT reservation_id, activity_id, sku_id, user_id, 'BUSINESS_REJECTION', reason
    FROM rejected
    ORDER BY reservation_id
    ON CONFLICT (reservation_id) DO NOTHING
    RETURNING reservation_id
), release AS (
    INSERT INTO event_outbox (message_id, topic, tag, message_key, payload)
    SELECT x.message_id, $14::text, $15::text, x.reservation_id, x.payload
    FROM rejected x
    JOIN comp USING (reservation_id)
), order_outbox AS (
    -- A delayed cancel is claimed by the outbox a minute before it is due,
    -- not during the burst that created it: the broker's timer store is
    -- slow (about 64 deliveries/s) and every send competes with the orders.
    -- If the timer then arrives late, the cancel sweep covers it.
    INSERT INTO event_outbox (message_id, topic, tag, message_key, payload, deliver_at, next_attempt_at)
    SELECT o.*, GREATEST(now(), o.deliver_at - interval '60 seconds')
    FROM unnest($16::text[], $17::text[], $18::text[], $19::text[], $20::jsonb[], $21::timestamptz[]) AS o (message_id, topic, tag, message_key, payload, deliver_at)
), finished AS (
    UPDATE consumer_inbox b
    SET status = f.status, result_code = f.result_code, updated_at = now()
    FROM unnest($23::text[], $24::inbox_status[], $25::text[]) AS f (message_id, status, result_code)
    WHERE b.consumer_group = $22::text AND b.message_id = f.message_id
)
SELECT count(*) AS compensations FROM comp"#;

/// Round trip 4, the last before `COMMIT`: one conditional decrement per
/// (activity, sku) for the orders [`INSERT_ORDERS`] placed, with partial
/// allocation.
///
/// Why last: this row is the one every batch of the SKU queues on, and its
/// lock is held until commit. Taken before the orders, as docs/architecture.md §7
/// lists the steps, the lock would also cover [`INSERT_ORDERS`] and
/// [`FINISH`] (most of a batch's time); taken last, it covers this
/// statement and the commit. The orders already hold `KEY SHARE` on this
/// row through their foreign key, which conflicts with neither this lock
/// nor other batches' orders.
///
/// `locked` takes the row lock first (in key order, so batches over several
/// SKUs cannot deadlock) and computes `granted` from the locked, latest
/// committed stock: READ COMMITTED re-reads a row it had to wait for. The
/// lock is `FOR NO KEY UPDATE`, the one the update itself takes: `FOR
/// UPDATE` would conflict with the `KEY SHARE` locks of the orders above
/// and deadlock with other batches. The update subtracts exactly that
/// `granted`, and the caller keeps exactly `granted` orders (undoing the
/// newest others with [`UNDO_ORDERS`]), so orders and units taken are one
/// number. Should they ever disagree, `CHECK (available_stock >= 0)` fails
/// the transaction rather than oversell (docs/architecture.md §12, "valid orders ≤ the
/// initial stock").
///
/// A row sold out in this statement's snapshot (`available_stock = 0`) is
/// skipped without being locked or waited for, so batches arriving after
/// the sell-out do not queue behind each other holding the lock; their
/// candidates are refused as of that snapshot, when the SKU had nothing
/// left. A row missing from the result therefore means no units. The row
/// itself exists: the caller checked it in [`INBOX_AND_CLAIM`], and its
/// orders' `KEY SHARE` keeps it from being deleted.
///
/// `$1` activity ids, `$2` sku ids, `$3` units wanted.
pub const TAKE_STOCK: &str = r#"WITH want AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS w (activity_id, sku_id, wanted)
), locked AS (
    SELECT i.activity_id, i.sku_id, LEAST(i.available_stock, w.wanted) AS granted
    FROM inventory i
    JOIN want w ON w.activity_id = i.activity_id AND w.sku_id = i.sku_id
    WHERE i.available_stock > 0
    ORDER BY i.activity_id, i.sku_id
    FOR NO KEY UPDATE OF i
), taken AS (
    UPDATE inventory i
    SET available_stock = i.available_stock - l.granted, updated_at = now()
    FROM locked l
    WHERE i.activity_id = l.activity_id AND i.sku_id = l.sku_id
    RETURNING i.activity_id
)
SELECT activity_id, sku_id, granted FROM locked"#;

/// Only when [`TAKE_STOCK`] granted fewer units than orders were placed:
/// removes what [`INSERT_ORDERS`] and [`FINISH`] wrote for the orders left
/// without a unit (the newest ones), so that a second [`FINISH`] can record
/// them as `NO_STOCK` rejections, each with its compensation, in the same
/// commit. Every row deleted here was inserted by this transaction and has
/// never been visible to another, so nothing outside it can have acted on
/// one; deleting the order also frees its user's place for a concurrent
/// order waiting on the one-per-user index.
///
/// This runs with the hot row locked, which is why it is not the common
/// path: it costs a round trip only in the batch that meets the sell-out
/// (or a drift between Redis and PostgreSQL stock).
///
/// Returns the number of orders deleted.
///
/// `$1` order ids, `$2` reservation ids (their `ORDER_CREATED` ledger rows),
/// `$3` outbox message ids (the delayed cancels and `ORDER_CREATED` events).
pub const UNDO_ORDERS: &str = r#"WITH orders_gone AS (
    DELETE FROM orders o
    USING unnest($1::text[]) AS t (order_id)
    WHERE o.order_id = t.order_id
    RETURNING o.order_id
), ledger_gone AS (
    DELETE FROM inventory_ledger l
    USING unnest($2::text[]) AS t (reservation_id)
    WHERE l.reservation_id = t.reservation_id AND l.reason = 'ORDER_CREATED'
), outbox_gone AS (
    DELETE FROM event_outbox e
    USING unnest($3::text[]) AS t (message_id)
    WHERE e.message_id = t.message_id
)
SELECT count(*) AS orders FROM orders_gone"#;

/// Deterministically bad messages, all of one listener batch in one
/// statement: either every one is recorded or none is, so a retry after a
/// failure never records one twice; a redelivery whose ACK was lost finds
/// its row by the broker offset id and adds none.
///
/// `$1` group, `$2` topics, `$3` message ids (nullable), `$4` broker ids,
/// `$5` reasons, `$6` details, `$7` bodies, `$8` properties.
pub const QUARANTINE: &str = r#"INSERT INTO message_quarantine (consumer_group, topic, message_id, broker_msg_id, reason,
                                detail, body, properties)
SELECT $1::text, topic, message_id, broker_msg_id, reason, detail, body, properties
FROM unnest($2::text[], $3::text[], $4::text[], $5::quarantine_reason[], $6::text[], $7::bytea[],
            $8::jsonb[])
     AS t (topic, message_id, broker_msg_id, reason, detail, body, properties)
ON CONFLICT (consumer_group, broker_msg_id) DO NOTHING"#;

/// The failure behind a retry, one row per message, written outside the
/// failed transaction; the DLQ governor reads the newest (docs/architecture.md §9.1).
///
/// `$1` group, `$2` message ids, `$3` delivery attempts, `$4` class, `$5`
/// detail.
pub const RECORD_FAILURES: &str = r#"INSERT INTO consumer_failures (consumer_group, message_id, error_class, detail, delivery_attempt)
SELECT $1::text, message_id, $4::failure_class, $5::text, delivery_attempt
FROM unnest($2::text[], $3::int[]) AS t (message_id, delivery_attempt)"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::status::{InboxStatus, ReservationOutcome};

    /// The inbox row's optimistic outcome is spelled in SQL; it must be the
    /// one `FINISH` would have written for a created order.
    #[test]
    fn inbox_goes_in_as_a_created_order() {
        let spelled = format!(
            "'{}', '{}'",
            InboxStatus::Succeeded.as_str(),
            ReservationOutcome::OrderCreated.as_str()
        );
        assert!(INBOX_AND_CLAIM.contains(&spelled), "{spelled}");
    }
}
