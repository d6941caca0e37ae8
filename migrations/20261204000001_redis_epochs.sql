-- Redis state epochs: docs/architecture.md §4.5.
--
-- Redis is not the source of truth: its keys can be lost (a restart without
-- persistence, a failover to a replica that missed writes). Every seed and
-- every restore of an activity's Redis state starts a new epoch, written
-- here and beside the stock in Redis (`<p>:{a}:epoch`). An activity whose
-- Redis epoch is missing or older than its last row here has lost its Redis
-- state: the engine refuses its reservations until `activity restore`
-- rebuilds them from PostgreSQL. The rows are also the audit of who
-- restored what, and why.
CREATE TYPE redis_epoch_kind AS ENUM ('SEED', 'RESTORE');

CREATE TABLE redis_epochs (
    activity_id BIGINT           NOT NULL REFERENCES activities (activity_id),
    epoch       BIGINT           NOT NULL CHECK (epoch > 0),
    kind        redis_epoch_kind NOT NULL,
    operator    TEXT             NOT NULL,
    reason      TEXT             NOT NULL CHECK (length(btrim(reason)) > 0),
    -- What the restore found and wrote: stock per SKU, buyers, the tasks it
    -- settled, the unsent reservations it could see were lost.
    detail      JSONB            NOT NULL DEFAULT '{}',
    started_at  TIMESTAMPTZ      NOT NULL DEFAULT now(),
    PRIMARY KEY (activity_id, epoch)
);

-- A compensation whose Redis reservation was lost with the rest of the
-- activity's Redis state: the restore rebuilt the stock from PostgreSQL,
-- which already counts the unit, so there is nothing left to release.
ALTER TYPE compensation_status ADD VALUE 'SETTLED_BY_RESTORE';

-- Reservations each engine process accepted, per activity, flushed about
-- once a second: against PostgreSQL's decided reservations they show how
-- many accepted reservations were lost unsent (docs/architecture.md §4.5).
CREATE TABLE ingress_tallies (
    instance_id TEXT        NOT NULL,
    activity_id BIGINT      NOT NULL,
    accepted    BIGINT      NOT NULL CHECK (accepted >= 0),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_id, activity_id)
);
