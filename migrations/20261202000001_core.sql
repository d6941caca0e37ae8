-- Core fact tables: DESIGN.md §5. PostgreSQL is the final truth of what became
-- of every reservation; Redis only holds the fast-path reservation.

CREATE TYPE order_status AS ENUM ('CREATED', 'PAYING', 'PAID', 'CANCELED');

CREATE TYPE reservation_outcome AS ENUM (
    'ORDER_CREATED',
    'REJECTED_NO_STOCK',
    'REJECTED_DUPLICATE',
    'REJECTED_EXPIRED',
    'RELEASED'
);

CREATE TYPE ledger_reason AS ENUM ('ORDER_CREATED', 'ORDER_CANCELED');

CREATE TABLE activities (
    activity_id   BIGINT      PRIMARY KEY CHECK (activity_id > 0),
    valid_for_ms  BIGINT      NOT NULL CHECK (valid_for_ms > 0),
    pay_within_ms BIGINT      NOT NULL CHECK (pay_within_ms > 0),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE inventory (
    activity_id     BIGINT      NOT NULL REFERENCES activities (activity_id),
    sku_id          BIGINT      NOT NULL CHECK (sku_id > 0),
    total_stock     BIGINT      NOT NULL CHECK (total_stock >= 0),
    -- The guard against oversell: a conditional decrement can never take it below zero.
    available_stock BIGINT      NOT NULL CHECK (available_stock >= 0),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (activity_id, sku_id),
    CHECK (available_stock <= total_stock)
);

CREATE TABLE orders (
    order_id          TEXT         PRIMARY KEY,
    reservation_id    TEXT         NOT NULL UNIQUE,
    request_id        TEXT         NOT NULL,
    activity_id       BIGINT       NOT NULL,
    sku_id            BIGINT       NOT NULL,
    user_id           BIGINT       NOT NULL,
    quantity          INTEGER      NOT NULL CHECK (quantity > 0),
    status            order_status NOT NULL DEFAULT 'CREATED',
    expires_at        TIMESTAMPTZ  NOT NULL,
    payment_id        TEXT,
    paid_at           TIMESTAMPTZ,
    canceled_at       TIMESTAMPTZ,
    cancel_reason     TEXT,
    -- Bumped on every state change; projections drop events older than what they hold (seed §18.3).
    aggregate_version BIGINT       NOT NULL DEFAULT 1,
    created_at        TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_at        TIMESTAMPTZ  NOT NULL DEFAULT now(),
    FOREIGN KEY (activity_id, sku_id) REFERENCES inventory (activity_id, sku_id),
    CHECK ((status = 'PAID') = (paid_at IS NOT NULL)),
    CHECK ((status = 'CANCELED') = (canceled_at IS NOT NULL))
);

-- One valid order per user per activity (DESIGN.md §12).
CREATE UNIQUE INDEX orders_one_per_user ON orders (activity_id, user_id) WHERE status <> 'CANCELED';
CREATE INDEX orders_due_for_cancel ON orders (expires_at) WHERE status IN ('CREATED', 'PAYING');

CREATE TABLE inventory_ledger (
    ledger_id      BIGSERIAL     PRIMARY KEY,
    reservation_id TEXT          NOT NULL,
    order_id       TEXT,
    activity_id    BIGINT        NOT NULL,
    sku_id         BIGINT        NOT NULL,
    reason         ledger_reason NOT NULL,
    delta          BIGINT        NOT NULL CHECK (delta <> 0),
    message_id     TEXT          NOT NULL,
    created_at     TIMESTAMPTZ   NOT NULL DEFAULT now(),
    -- At most one stock movement per reservation and reason: the ledger is idempotent by construction.
    UNIQUE (reservation_id, reason)
);

CREATE TABLE reservations (
    reservation_id TEXT                PRIMARY KEY,
    message_id     TEXT                NOT NULL,
    request_id     TEXT                NOT NULL,
    order_id       TEXT                NOT NULL,
    activity_id    BIGINT              NOT NULL,
    sku_id         BIGINT              NOT NULL,
    user_id        BIGINT              NOT NULL,
    outcome        reservation_outcome NOT NULL,
    valid_until    TIMESTAMPTZ         NOT NULL,
    reserved_at    TIMESTAMPTZ         NOT NULL,
    decided_at     TIMESTAMPTZ         NOT NULL DEFAULT now(),
    updated_at     TIMESTAMPTZ         NOT NULL DEFAULT now()
);

CREATE INDEX reservations_by_activity ON reservations (activity_id, outcome);
