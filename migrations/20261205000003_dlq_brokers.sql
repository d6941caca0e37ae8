-- Two brokers are first-class (docs/architecture.md §9.1): each broker has
-- its own queue 0, so the mirror's offsets are kept per (group, broker,
-- queue), and a mirrored copy remembers which broker's DLQ it came from.
-- Rows written before brokers were named keep broker_name '' (the one
-- broker there was); the mirror reads them only for a topic that still
-- lives on one broker.

ALTER TABLE dlq_mirror_offsets ADD COLUMN broker_name TEXT NOT NULL DEFAULT '';
ALTER TABLE dlq_mirror_offsets DROP CONSTRAINT dlq_mirror_offsets_pkey;
ALTER TABLE dlq_mirror_offsets ADD PRIMARY KEY (consumer_group, broker_name, queue_id);

ALTER TABLE dlq_messages ADD COLUMN dlq_broker TEXT NOT NULL DEFAULT '';
