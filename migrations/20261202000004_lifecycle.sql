-- Order lifecycle after creation: DESIGN.md §8.

-- A compensation whose Redis reservation no longer exists (its physical TTL
-- ran out first): there is nothing left in Redis to give back exactly once,
-- so the task is closed as ORPHANED for an operator rather than retried.
ALTER TYPE compensation_status ADD VALUE 'ORPHANED';

-- The compensation sweep's query: the oldest PENDING tasks.
CREATE INDEX compensation_tasks_pending ON compensation_tasks (created_at) WHERE status = 'PENDING';
