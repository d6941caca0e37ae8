-- Elected singletons (docs/architecture.md §14.4): the DLQ mirror, the
-- sweeps and the webhook delivery run on the one daemon holding their row's
-- lease. A holder renews every [registry] heartbeat_ms; a lease past
-- expires_at (on the database's clock) goes to the next daemon that asks,
-- and a clean stop expires its leases at once.

CREATE TABLE singleton_leases (
    role         TEXT PRIMARY KEY,
    holder       TEXT NOT NULL,
    acquired_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    renewed_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ NOT NULL,
    -- Times the role changed hands: a takeover is visible after the fact.
    handovers    BIGINT NOT NULL DEFAULT 0
);
