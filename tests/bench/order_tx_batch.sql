-- order_tx_batch.sql: the batched order transaction, 50 messages per transaction.
--
-- A pgbench custom script that runs the order-create consumer's transaction
-- (engine/src/pipeline/consume/sql.rs, docs/architecture.md §7) for 50 new messages per
-- transaction, on the hot path: every message is new, valid and gets stock.
-- The statements between BEGIN and COMMIT are the consumer's own, verbatim,
-- with each $n spelled as a pgbench variable; the `consume` integration test
-- (bench_scripts_run_the_consumers_statements) fails if they drift.
--
-- The first SELECT (outside the transaction) invents the batch: random
-- message, reservation, request and order ids, random users (one order per
-- user holds, so users must not repeat), and the bind arrays the consumer
-- would compute (expires_at, outbox payloads). Its cost is in the figures.
--
-- Prepare a database once (as user postgres on the loopback stack):
--   createdb -h 127.0.0.1 -U postgres seckill_bench
--   for f in migrations/*.sql; do psql -h 127.0.0.1 -U postgres -d seckill_bench -q -f "$f"; done
--   psql -h 127.0.0.1 -U postgres -d seckill_bench -c "
--     INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES (1, 300000, 900000);
--     INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock)
--     VALUES (1, 1, 1000000000000, 1000000000000);"
-- (or point SECKILL_DATABASE_URL at it and run `seckillctl db migrate`).
--
-- Run (from the repository root). The variables are arrays bound as
-- parameters, so the extended or prepared protocol is required; simple
-- mode would paste them into the SQL text:
--   pgbench -h 127.0.0.1 -U postgres -n -M prepared -c 4 -j 2 -T 20 \
--           -f tests/bench/order_tx_batch.sql seckill_bench
-- tps counts transactions; orders per second are tps x 50. Every
-- transaction takes its units from one hot inventory row, which is the
-- point: that row's lock is held from TAKE_STOCK, the last statement, to
-- COMMIT. Every unit is granted, so the undo path (UNDO_ORDERS and a
-- second FINISH, run only when a batch gets fewer units than orders) is
-- not part of the figures.
--
-- Check afterwards (conservation, docs/architecture.md §12):
--   SELECT i.total_stock - i.available_stock = (SELECT count(*) FROM orders)
--   FROM inventory i WHERE activity_id = 1 AND sku_id = 1;

\set n 50
\set aid 1
\set sku 1
SELECT 'CG_SECKILL_ORDER_CREATE_PG_V1' AS grp,
       array_agg(mid ORDER BY g) AS mids,
       array_agg(0 ORDER BY g) AS attempts,
       array_agg(NULL::text ORDER BY g) AS replays,
       array_agg(rsv ORDER BY g) AS rsvs,
       array_agg(req ORDER BY g) AS reqs,
       array_agg(ord ORDER BY g) AS oids,
       array_agg(aid ORDER BY g) AS aids,
       array_agg(sku ORDER BY g) AS skus,
       array_agg(uid ORDER BY g) AS uids,
       array_agg(now() + interval '5 minutes' ORDER BY g) AS valid_untils,
       array_agg(now() ORDER BY g) AS reserved_ats,
       array_agg(md5(rsv) ORDER BY g) AS traces,
       ARRAY[min(aid)] AS want_aids,
       ARRAY[min(sku)] AS want_skus,
       ARRAY[count(*)] AS want_units,
       array_agg(expires ORDER BY g) AS expires,
       '{}'::text[] AS rej_rsvs,
       '{}'::reservation_outcome[] AS rej_outcomes,
       '{}'::bigint[] AS rej_aids,
       '{}'::bigint[] AS rej_skus,
       '{}'::bigint[] AS rej_uids,
       '{}'::text[] AS rej_reasons,
       '{}'::text[] AS rel_mids,
       '{}'::jsonb[] AS rel_payloads,
       'PROD_SECKILL_INVENTORY_COMPENSATE_V1' AS rel_topic,
       'RELEASE_RESERVATION' AS rel_tag,
       array_agg(cancel_mid ORDER BY g) || array_agg(event_mid ORDER BY g) AS out_mids,
       array_agg('PROD_SECKILL_ORDER_TIMEOUT_V1'::text ORDER BY g)
         || array_agg('PROD_SECKILL_ORDER_EVENT_V1'::text ORDER BY g) AS out_topics,
       array_agg('CANCEL_IF_UNPAID'::text ORDER BY g)
         || array_agg('ORDER_CREATED'::text ORDER BY g) AS out_tags,
       array_agg(ord ORDER BY g) || array_agg(ord ORDER BY g) AS out_keys,
       array_agg(jsonb_build_object(
           'schema_version', 1, 'event_type', 'CANCEL_ORDER_IF_UNPAID',
           'message_id', cancel_mid, 'message_key', ord, 'order_id', ord,
           'reservation_id', rsv, 'activity_id', aid, 'sku_id', sku, 'user_id', uid,
           'deliver_at', expires, 'created_at', now(), 'retry_count', 0, 'replay_count', 0)
         ORDER BY g)
         || array_agg(jsonb_build_object(
           'schema_version', 1, 'event_type', 'ORDER_CREATED', 'message_id', event_mid,
           'order_id', ord, 'reservation_id', rsv, 'activity_id', aid, 'sku_id', sku,
           'user_id', uid, 'status', 'CREATED', 'aggregate_version', 1, 'occurred_at', now())
         ORDER BY g) AS out_payloads,
       array_agg(expires ORDER BY g) || array_agg(NULL::timestamptz ORDER BY g) AS out_deliver_ats,
       '{}'::text[] AS inbox_mids,
       '{}'::inbox_status[] AS inbox_statuses,
       '{}'::text[] AS inbox_codes
FROM (
    SELECT g,
           'evt_' || md5(random()::text) AS mid,
           'rsv_' || md5(random()::text) AS rsv,
           'req_' || md5(random()::text) AS req,
           'ord_' || md5(random()::text) AS ord,
           'evt_' || md5(random()::text) AS cancel_mid,
           'evt_' || md5(random()::text) AS event_mid,
           :aid::bigint AS aid,
           :sku::bigint AS sku,
           1 + (random() * 9e15)::bigint AS uid,
           now() + interval '900000 milliseconds' AS expires
    FROM generate_series(1, :n::int) AS g
) AS batch \gset
BEGIN ISOLATION LEVEL READ COMMITTED;
WITH input AS (
    SELECT *
    FROM unnest(:mids::text[], :attempts::int[], :replays::text[], :rsvs::text[], :reqs::text[], :oids::text[],
                :aids::bigint[], :skus::bigint[], :uids::bigint[], :valid_untils::timestamptz[], :reserved_ats::timestamptz[],
                :traces::text[])
         WITH ORDINALITY
         AS t (message_id, delivery_attempt, replay_id, reservation_id, request_id, order_id,
               activity_id, sku_id, user_id, valid_until, reserved_at, trace_id, ord)
), inbox AS (
    INSERT INTO consumer_inbox (consumer_group, message_id, status, result_code, delivery_attempt, replay_id)
    SELECT :grp::text, message_id, 'SUCCEEDED', 'ORDER_CREATED', delivery_attempt, replay_id
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
LEFT JOIN claim c USING (message_id);
INSERT INTO orders (order_id, reservation_id, request_id, activity_id, sku_id, user_id,
                    quantity, status, expires_at, aggregate_version)
SELECT order_id, reservation_id, request_id, activity_id, sku_id, user_id,
       1, 'CREATED', expires_at, 1
FROM unnest(:oids::text[], :rsvs::text[], :reqs::text[], :aids::bigint[], :skus::bigint[], :uids::bigint[],
            :expires::timestamptz[])
     AS t (order_id, reservation_id, request_id, activity_id, sku_id, user_id, expires_at)
ORDER BY activity_id, user_id
ON CONFLICT (activity_id, user_id) WHERE status <> 'CANCELED' DO NOTHING
RETURNING order_id;
WITH ledger AS (
    INSERT INTO inventory_ledger (reservation_id, order_id, activity_id, sku_id, reason, delta, message_id)
    SELECT reservation_id, order_id, activity_id, sku_id, 'ORDER_CREATED', -1, message_id
    FROM unnest(:rsvs::text[], :oids::text[], :aids::bigint[], :skus::bigint[], :mids::text[])
         AS t (reservation_id, order_id, activity_id, sku_id, message_id)
), rejected AS (
    SELECT *
    FROM unnest(:rej_rsvs::text[], :rej_outcomes::reservation_outcome[], :rej_aids::bigint[], :rej_skus::bigint[], :rej_uids::bigint[],
                :rej_reasons::text[], :rel_mids::text[], :rel_payloads::jsonb[])
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
    SELECT x.message_id, :rel_topic::text, :rel_tag::text, x.reservation_id, x.payload
    FROM rejected x
    JOIN comp USING (reservation_id)
), order_outbox AS (
    -- A delayed cancel is claimed by the outbox a minute before it is due,
    -- not during the burst that created it: the broker's timer store is
    -- slow (about 64 deliveries/s) and every send competes with the orders.
    -- If the timer then arrives late, the cancel sweep covers it.
    INSERT INTO event_outbox (message_id, topic, tag, message_key, payload, deliver_at, next_attempt_at)
    SELECT o.*, GREATEST(now(), o.deliver_at - interval '60 seconds')
    FROM unnest(:out_mids::text[], :out_topics::text[], :out_tags::text[], :out_keys::text[], :out_payloads::jsonb[], :out_deliver_ats::timestamptz[]) AS o (message_id, topic, tag, message_key, payload, deliver_at)
), finished AS (
    UPDATE consumer_inbox b
    SET status = f.status, result_code = f.result_code, updated_at = now()
    FROM unnest(:inbox_mids::text[], :inbox_statuses::inbox_status[], :inbox_codes::text[]) AS f (message_id, status, result_code)
    WHERE b.consumer_group = :grp::text AND b.message_id = f.message_id
)
SELECT count(*) AS compensations FROM comp;
WITH want AS (
    SELECT * FROM unnest(:want_aids::bigint[], :want_skus::bigint[], :want_units::bigint[]) AS w (activity_id, sku_id, wanted)
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
SELECT activity_id, sku_id, granted FROM locked;
COMMIT;
