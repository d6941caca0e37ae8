-- The DLQ closed loop: mirror, tickets, audited replay. DESIGN.md §9.

CREATE TYPE dlq_entry_status AS ENUM ('DEAD', 'REPLAYING', 'REPLAYED', 'VERIFIED', 'DISCARDED');

CREATE TYPE ticket_status AS ENUM ('OPEN', 'ACKED', 'FIXED', 'REPLAYING', 'VERIFIED', 'CLOSED');

CREATE TYPE replay_decision AS ENUM ('SENT', 'BLOCKED', 'DRY_RUN');

CREATE TYPE replay_outcome AS ENUM ('PENDING', 'VERIFIED', 'SEND_FAILED', 'SEND_UNKNOWN', 'VERIFY_FAILED', 'NOT_SENT');

CREATE TABLE dlq_tickets (
    ticket_id      TEXT          PRIMARY KEY,
    consumer_group TEXT          NOT NULL,
    error_class    failure_class NOT NULL,
    status         ticket_status NOT NULL DEFAULT 'OPEN',
    owner          TEXT,
    resolution     TEXT,
    webhook_status TEXT,
    opened_at      TIMESTAMPTZ   NOT NULL DEFAULT now(),
    updated_at     TIMESTAMPTZ   NOT NULL DEFAULT now(),
    closed_at      TIMESTAMPTZ
);

-- At most one ticket that is not closed per (group, error class).
CREATE UNIQUE INDEX dlq_tickets_one_live ON dlq_tickets (consumer_group, error_class) WHERE status <> 'CLOSED';

CREATE TABLE dlq_messages (
    consumer_group   TEXT             NOT NULL,
    message_id       TEXT             NOT NULL,
    ticket_id        TEXT             REFERENCES dlq_tickets (ticket_id),
    original_topic   TEXT             NOT NULL,
    broker_msg_id    TEXT             NOT NULL,
    dlq_queue_id     INTEGER          NOT NULL,
    dlq_queue_offset BIGINT           NOT NULL,
    body             BYTEA            NOT NULL,
    properties       JSONB            NOT NULL,
    error_class      failure_class    NOT NULL,
    delivery_attempts INTEGER         NOT NULL,
    status           dlq_entry_status NOT NULL DEFAULT 'DEAD',
    replay_count     INTEGER          NOT NULL DEFAULT 0,
    dead_at          TIMESTAMPTZ      NOT NULL,
    mirrored_at      TIMESTAMPTZ      NOT NULL DEFAULT now(),
    verified_at      TIMESTAMPTZ,
    PRIMARY KEY (consumer_group, message_id)
);

CREATE INDEX dlq_messages_by_ticket ON dlq_messages (ticket_id);

-- Where the mirror left off in each %DLQ% queue, so a restart neither skips nor re-reads.
CREATE TABLE dlq_mirror_offsets (
    consumer_group TEXT        NOT NULL,
    queue_id       INTEGER     NOT NULL,
    next_offset    BIGINT      NOT NULL,
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, queue_id)
);

CREATE TABLE replay_audit (
    replay_id      TEXT            PRIMARY KEY,
    consumer_group TEXT            NOT NULL,
    message_id     TEXT            NOT NULL,
    ticket_id      TEXT,
    operator       TEXT            NOT NULL,
    reason         TEXT            NOT NULL CHECK (length(btrim(reason)) > 0),
    checks         JSONB           NOT NULL,
    decision       replay_decision NOT NULL,
    forced         TEXT[]          NOT NULL DEFAULT '{}',
    outcome        replay_outcome  NOT NULL,
    replay_count   INTEGER         NOT NULL,
    created_at     TIMESTAMPTZ     NOT NULL DEFAULT now(),
    finished_at    TIMESTAMPTZ
);

CREATE INDEX replay_audit_by_message ON replay_audit (consumer_group, message_id, created_at);
