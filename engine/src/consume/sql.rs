//! The consumer's SQL, one constant per round trip of the order transaction
//! (DESIGN.md §7), plus the two statements written outside it.
//!
//! Every statement is set-based over `unnest` arrays, so a batch of N
//! messages costs the same number of round trips as one message:
//! `BEGIN`, [`INBOX_AND_CLAIM`], [`TAKE_STOCK`], [`INSERT_ORDERS`],
//! [`FINISH`], `COMMIT`. The constants are public so the pgbench scripts in
//! `tests/bench/` can be checked against them: they must run these exact
//! statements, with each `$n` spelled as a pgbench variable.
//!
//! The statements carry no `--` comments (pgbench would have to match
//! them too); the reasons are here.

/// Starts the transaction. READ COMMITTED is the server default, but the
/// stock arithmetic in [`TAKE_STOCK`] relies on its row-lock re-check
/// semantics, so it is stated rather than assumed.
pub const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// Round trip 1: the inbox, then the claim on each reservation.
///
/// - The inbox insert is the at-most-once gate per `message_id` (DESIGN.md
///   §12, "the business effect per message_id happens at most once"): a
///   concurrent delivery of the same message blocks on the primary key until
///   this transaction ends, then inserts nothing. Rows go in `message_id`
///   order so two batches never wait on each other in a cycle.
/// - The `reservations` row is inserted *now*, as a claim, not at the end:
///   its primary key makes a second message for the same reservation (seed
///   §29.2 item 2) wait for the first and then find it decided, whatever the
///   first decided. Without the claim, two concurrent messages for one
///   reservation could both take stock, or one create an order while the
///   other compensates. The outcome written here is final for expired
///   reservations; for the others it is provisional and [`FINISH`] settles
///   it before commit, so no other transaction ever sees it.
/// - `DISTINCT ON` keeps the first message per reservation in batch order;
///   a later one in the same batch is a duplicate just like a committed one.
/// - `user_has_order` reads committed orders. An order committed after this
///   statement's snapshot is caught later by the insert's arbiter.
///
/// Returns one row per message new to the inbox: `outcome` NULL means the
/// reservation was already claimed.
///
/// `$1` group, `$2` message ids, `$3` delivery attempts, `$4` replay ids,
/// `$5` reservation ids, `$6` request ids, `$7` order ids, `$8` activity ids,
/// `$9` sku ids, `$10` user ids, `$11` valid until, `$12` reserved at.
pub const INBOX_AND_CLAIM: &str = r#"WITH input AS (
    SELECT *
    FROM unnest($2::text[], $3::int[], $4::text[], $5::text[], $6::text[], $7::text[],
                $8::bigint[], $9::bigint[], $10::bigint[], $11::timestamptz[], $12::timestamptz[])
         WITH ORDINALITY
         AS t (message_id, delivery_attempt, replay_id, reservation_id, request_id, order_id,
               activity_id, sku_id, user_id, valid_until, reserved_at, ord)
), inbox AS (
    INSERT INTO consumer_inbox (consumer_group, message_id, status, delivery_attempt, replay_id)
    SELECT $1::text, message_id, 'PROCESSING', delivery_attempt, replay_id
    FROM input
    ORDER BY message_id
    ON CONFLICT (consumer_group, message_id) DO NOTHING
    RETURNING message_id
), claim AS (
    INSERT INTO reservations (reservation_id, message_id, request_id, order_id, activity_id,
                              sku_id, user_id, outcome, valid_until, reserved_at)
    SELECT DISTINCT ON (i.reservation_id)
           i.reservation_id, i.message_id, i.request_id, i.order_id, i.activity_id,
           i.sku_id, i.user_id,
           CASE WHEN now() > i.valid_until THEN 'REJECTED_EXPIRED'::reservation_outcome
                ELSE 'ORDER_CREATED'::reservation_outcome END,
           i.valid_until, i.reserved_at
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
       now() AS tx_now
FROM input i
JOIN inbox USING (message_id)
LEFT JOIN claim c USING (message_id)"#;

/// Round trip 2: one conditional decrement per (activity, sku) for all the
/// batch's candidates at once, with partial allocation.
///
/// `locked` takes the row lock first (in key order, so batches over several
/// SKUs cannot deadlock) and computes `granted` from the locked, latest
/// committed stock: READ COMMITTED re-reads a row it had to wait for. The
/// lock is `FOR NO KEY UPDATE`, the one the update itself takes: `FOR
/// UPDATE` would also conflict with the `KEY SHARE` locks that order
/// inserts hold on this row through the orders → inventory foreign key,
/// and deadlocks between transactions that insert orders first. The
/// update subtracts exactly that `granted`, so the number of orders the
/// caller creates and the units taken are one number. Should they ever
/// disagree, `CHECK (available_stock >= 0)` fails the transaction rather
/// than oversell (DESIGN.md §12, "valid orders ≤ the initial stock").
///
/// A row missing from the result is a missing inventory row: the caller
/// treats it as a configuration error, not as "no stock".
///
/// `$1` activity ids, `$2` sku ids, `$3` units wanted.
pub const TAKE_STOCK: &str = r#"WITH want AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) AS w (activity_id, sku_id, wanted)
), locked AS (
    SELECT i.activity_id, i.sku_id, LEAST(i.available_stock, w.wanted) AS granted
    FROM inventory i
    JOIN want w ON w.activity_id = i.activity_id AND w.sku_id = i.sku_id
    ORDER BY i.activity_id, i.sku_id
    FOR NO KEY UPDATE OF i
), taken AS (
    UPDATE inventory i
    SET available_stock = i.available_stock - l.granted, updated_at = now()
    FROM locked l
    WHERE i.activity_id = l.activity_id AND i.sku_id = l.sku_id AND l.granted > 0
    RETURNING i.activity_id
)
SELECT l.activity_id, l.sku_id, l.granted, a.pay_within_ms
FROM locked l
JOIN activities a ON a.activity_id = l.activity_id"#;

/// Round trip 3 (repeated only when a concurrent transaction wins a user):
/// the orders of the candidates that got stock.
///
/// The partial unique index `orders_one_per_user` is the named arbiter
/// (DESIGN.md §5, §12 "valid orders per user ≤ 1"): a concurrent order for
/// the same user makes this row wait, then be skipped, instead of failing
/// the whole batch. Any other unique violation (order id, reservation id)
/// is not absorbed: it is a bug upstream and fails the transaction. Rows go
/// in (activity, user) order so two batches never wait on each other in a
/// cycle. `quantity` is 1: [`crate::message::parse_order_create`] refuses
/// anything else, and the stock arithmetic counts orders.
///
/// Returns the order ids actually inserted.
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

/// Round trip 4: everything that follows from the decisions, in one
/// statement of independent data-modifying CTEs.
///
/// - `ledger`: one `ORDER_CREATED` movement per order; `UNIQUE
///   (reservation_id, reason)` makes a second one impossible.
/// - `giveback`: units taken for candidates that then lost their user to a
///   concurrent order and could not be re-offered; returned in the same
///   transaction, so PostgreSQL conservation (available + valid orders =
///   total, DESIGN.md §12) holds at every commit.
/// - `decided`: the final outcome of rejected reservations.
/// - `comp` and `release`: at most one compensation per reservation
///   (DESIGN.md §12): the `RELEASE_RESERVATION` outbox row is written only
///   when this statement inserted the `compensation_tasks` row.
/// - `order_outbox`: the delayed cancel and `ORDER_CREATED`, committed with
///   the order (the transactional outbox, DESIGN.md §7 step 6).
/// - `finished`: the inbox row leaves PROCESSING in the same commit.
///
/// Returns the number of compensations inserted.
///
/// Orders: `$1` reservation ids, `$2` order ids, `$3` activity ids, `$4` sku
/// ids, `$5` message ids. Give-back: `$6` activity ids, `$7` sku ids, `$8`
/// units. Rejections: `$9` reservation ids, `$10` outcomes, `$11` activity
/// ids, `$12` sku ids, `$13` user ids, `$14` reasons, `$15` release message
/// ids, `$16` release payloads, `$17` release topic, `$18` release tag.
/// Order outbox rows: `$19` message ids, `$20` topics, `$21` tags, `$22`
/// keys, `$23` payloads, `$24` deliver at. Inbox: `$25` group, `$26`
/// message ids, `$27` statuses, `$28` result codes.
pub const FINISH: &str = r#"WITH ledger AS (
    INSERT INTO inventory_ledger (reservation_id, order_id, activity_id, sku_id, reason, delta, message_id)
    SELECT reservation_id, order_id, activity_id, sku_id, 'ORDER_CREATED', -1, message_id
    FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[])
         AS t (reservation_id, order_id, activity_id, sku_id, message_id)
), giveback AS (
    UPDATE inventory i
    SET available_stock = i.available_stock + g.units, updated_at = now()
    FROM unnest($6::bigint[], $7::bigint[], $8::bigint[]) AS g (activity_id, sku_id, units)
    WHERE i.activity_id = g.activity_id AND i.sku_id = g.sku_id
), rejected AS (
    SELECT *
    FROM unnest($9::text[], $10::reservation_outcome[], $11::bigint[], $12::bigint[], $13::bigint[],
                $14::text[], $15::text[], $16::jsonb[])
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
    SELECT x.message_id, $17::text, $18::text, x.reservation_id, x.payload
    FROM rejected x
    JOIN comp USING (reservation_id)
), order_outbox AS (
    INSERT INTO event_outbox (message_id, topic, tag, message_key, payload, deliver_at)
    SELECT *
    FROM unnest($19::text[], $20::text[], $21::text[], $22::text[], $23::jsonb[], $24::timestamptz[])
), finished AS (
    UPDATE consumer_inbox b
    SET status = f.status, result_code = f.result_code, updated_at = now()
    FROM unnest($26::text[], $27::inbox_status[], $28::text[]) AS f (message_id, status, result_code)
    WHERE b.consumer_group = $25::text AND b.message_id = f.message_id
)
SELECT count(*) AS compensations FROM comp"#;

/// Deterministically bad messages, all of one listener batch in one
/// statement: either every one is recorded or none is, so a retry after a
/// failure never records one twice.
///
/// `$1` group, `$2` topics, `$3` message ids (nullable), `$4` broker ids,
/// `$5` reasons, `$6` details, `$7` bodies, `$8` properties.
pub const QUARANTINE: &str = r#"INSERT INTO message_quarantine (consumer_group, topic, message_id, broker_msg_id, reason,
                                detail, body, properties)
SELECT $1::text, topic, message_id, broker_msg_id, reason, detail, body, properties
FROM unnest($2::text[], $3::text[], $4::text[], $5::quarantine_reason[], $6::text[], $7::bytea[],
            $8::jsonb[])
     AS t (topic, message_id, broker_msg_id, reason, detail, body, properties)"#;

/// The failure behind a retry, one row per message, written outside the
/// failed transaction; the DLQ governor reads the newest (DESIGN.md §9.1).
///
/// `$1` group, `$2` message ids, `$3` delivery attempts, `$4` class, `$5`
/// detail.
pub const RECORD_FAILURES: &str = r#"INSERT INTO consumer_failures (consumer_group, message_id, error_class, detail, delivery_attempt)
SELECT $1::text, message_id, $4::failure_class, $5::text, delivery_attempt
FROM unnest($2::text[], $3::int[]) AS t (message_id, delivery_attempt)"#;
