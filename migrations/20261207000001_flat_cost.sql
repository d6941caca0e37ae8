-- Flat cost over time (docs/architecture.md §16.1, §16.3): every periodic
-- query reads only what is live, however many sales came before.
--
-- Built inside the migration's transaction, so on a large history each
-- CREATE INDEX holds writes to its table while it builds: migrate between
-- sales (§16.1).

-- The end of a sale (`seckillctl activity end`) and its retirement, once
-- nothing of it is left in flight (§16.3). NULL: still selling / not
-- retired.
ALTER TABLE activities
    ADD COLUMN ends_at    TIMESTAMPTZ,
    ADD COLUMN retired_at TIMESTAMPTZ;

-- The sweeps' holder looks for ended activities that are not retired yet.
CREATE INDEX activities_unretired ON activities (ends_at) WHERE retired_at IS NULL;

-- Per-activity counts by status: the Redis-state watch's live activities
-- (twice a second per daemon), the retirement's "no unpaid order", the
-- bench's and drills' lifecycle counts and reconcile. Without it each of
-- them scans every order of every past sale.
CREATE INDEX orders_by_activity_status ON orders (activity_id, status);

-- Pending compensations of one activity: the retirement's other condition.
CREATE INDEX compensation_tasks_by_activity ON compensation_tasks (activity_id, status);

-- The governor's DLQ sample (count of DEAD, every second) and the
-- verifier's unsettled entries (every 2 s) read only the unsettled ones.
CREATE INDEX dlq_messages_unsettled ON dlq_messages (dead_at)
    WHERE status IN ('DEAD', 'REPLAYING', 'REPLAYED');

-- Replay counts by outcome (the governor's sample): an index-only scan.
CREATE INDEX replay_audit_outcome ON replay_audit (outcome);
