-- Idempotent consumption, the transactional outbox, compensation and
-- quarantine: DESIGN.md §5, §7, §8.

CREATE TYPE inbox_status AS ENUM ('PROCESSING', 'SUCCEEDED', 'REJECTED');

CREATE TYPE outbox_status AS ENUM ('PENDING', 'SENT', 'DEAD');

CREATE TYPE compensation_source AS ENUM ('BUSINESS_REJECTION', 'SEND_FAILURE', 'CANCELLATION');

CREATE TYPE compensation_status AS ENUM ('PENDING', 'RELEASED');

CREATE TYPE quarantine_reason AS ENUM ('BAD_JSON', 'UNSUPPORTED_SCHEMA', 'MISSING_FIELD', 'INVALID_FIELD');

CREATE TYPE failure_class AS ENUM (
    'DB_CONNECTION',
    'DB_TIMEOUT',
    'DB_DEADLOCK',
    'DB_SERIALIZATION',
    'DB_POOL_EXHAUSTED',
    'REDIS_UNAVAILABLE',
    'UNKNOWN'
);

-- The idempotency key is the business message_id, never the broker's id (DESIGN.md §3).
-- Not declared PARTITION BY: a partitioned table's primary key must include the
-- partition column, which would let the same message_id land twice in two
-- partitions. Archiving is by created_at (indexed) into a detached table, keeping
-- the retention window longer than the broker's redelivery horizon.
CREATE TABLE consumer_inbox (
    consumer_group   TEXT         NOT NULL,
    message_id       TEXT         NOT NULL,
    status           inbox_status NOT NULL DEFAULT 'PROCESSING',
    result_code      TEXT,
    delivery_attempt INTEGER      NOT NULL DEFAULT 0 CHECK (delivery_attempt >= 0),
    replay_id        TEXT,
    created_at       TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, message_id)
);

CREATE INDEX consumer_inbox_created_at ON consumer_inbox (created_at);

CREATE TABLE event_outbox (
    outbox_id       BIGSERIAL     PRIMARY KEY,
    message_id      TEXT          NOT NULL UNIQUE,
    topic           TEXT          NOT NULL,
    tag             TEXT          NOT NULL,
    message_key     TEXT          NOT NULL,
    payload         JSONB         NOT NULL,
    deliver_at      TIMESTAMPTZ,
    status          outbox_status NOT NULL DEFAULT 'PENDING',
    attempts        INTEGER       NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at TIMESTAMPTZ   NOT NULL DEFAULT now(),
    last_error      TEXT,
    created_at      TIMESTAMPTZ   NOT NULL DEFAULT now(),
    sent_at         TIMESTAMPTZ
);

-- The publisher's claim query: FOR UPDATE SKIP LOCKED over due pending rows.
CREATE INDEX event_outbox_due ON event_outbox (next_attempt_at) WHERE status = 'PENDING';

-- Primary key on reservation_id: at most one compensation per reservation (DESIGN.md §12).
CREATE TABLE compensation_tasks (
    reservation_id TEXT                PRIMARY KEY,
    activity_id    BIGINT              NOT NULL,
    sku_id         BIGINT              NOT NULL,
    user_id        BIGINT              NOT NULL,
    source         compensation_source NOT NULL,
    reason         TEXT                NOT NULL,
    status         compensation_status NOT NULL DEFAULT 'PENDING',
    created_at     TIMESTAMPTZ         NOT NULL DEFAULT now(),
    released_at    TIMESTAMPTZ
);

-- Deterministically bad messages: kept for inspection, never retried.
CREATE TABLE message_quarantine (
    quarantine_id  BIGSERIAL         PRIMARY KEY,
    consumer_group TEXT              NOT NULL,
    topic          TEXT              NOT NULL,
    message_id     TEXT,
    broker_msg_id  TEXT,
    reason         quarantine_reason NOT NULL,
    detail         TEXT              NOT NULL,
    body           BYTEA             NOT NULL,
    properties     JSONB             NOT NULL DEFAULT '{}',
    created_at     TIMESTAMPTZ       NOT NULL DEFAULT now()
);

-- The last failures a consumer recorded before asking for a retry. The DLQ
-- governor reads the newest one to classify a dead message (DESIGN.md §9.1).
CREATE TABLE consumer_failures (
    failure_id       BIGSERIAL     PRIMARY KEY,
    consumer_group   TEXT          NOT NULL,
    message_id       TEXT          NOT NULL,
    error_class      failure_class NOT NULL,
    detail           TEXT          NOT NULL,
    delivery_attempt INTEGER       NOT NULL,
    failed_at        TIMESTAMPTZ   NOT NULL DEFAULT now()
);

CREATE INDEX consumer_failures_by_message ON consumer_failures (consumer_group, message_id, failed_at DESC);
