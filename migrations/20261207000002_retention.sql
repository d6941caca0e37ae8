-- Retention of the pipeline's finished history (docs/architecture.md §16.2):
-- `seckillctl db prune` and the sweeps' holder delete old SUCCEEDED and
-- REJECTED inbox rows, SENT outbox rows and old consumer failures, in
-- short batches, oldest first. Audit tables and business facts are never
-- pruned, so the marks below name only the three pruned tables.

-- One row per pruned table. `horizon`: every row of the table older than it
-- may be gone; it is written and committed before a prune deletes anything,
-- and never moves back (GREATEST), so the replay pre-check `inbox_kept`
-- (§9.3) can trust it. `updated_at`: when a prune of the table last ran to
-- its end; NULL until one has. The daemon reads it to decide whether a run
-- is due, so a restart or a lease hand-over neither skips nor repeats one,
-- and a run cut short is not done.
CREATE TABLE retention_marks (
    table_name TEXT        PRIMARY KEY
        CHECK (table_name IN ('consumer_inbox', 'event_outbox', 'consumer_failures')),
    horizon    TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ
);

-- The prune walks each table's finished rows oldest first. The predicates
-- are the prune's own literals (engine/src/ops/retention.rs), so the
-- planner can prove them: PROCESSING inbox rows, PENDING and DEAD outbox
-- rows are never in these indexes, and live work never pays for them
-- beyond one index update when a row finishes.
CREATE INDEX consumer_inbox_finished ON consumer_inbox (created_at)
    WHERE status IN ('SUCCEEDED', 'REJECTED');

CREATE INDEX event_outbox_sent ON event_outbox (sent_at)
    WHERE status = 'SENT';

CREATE INDEX consumer_failures_failed_at ON consumer_failures (failed_at);
