-- The engine registry (docs/architecture.md §14.3): each daemon writes its
-- row on start, beats every [registry] heartbeat_ms and marks it stopped on
-- a clean shutdown. Live or dead is judged on the database's clock (the
-- heartbeat's age), so daemons on hosts with skewed clocks agree.

CREATE TABLE engine_instances (
    engine_id     TEXT PRIMARY KEY,
    address       TEXT NOT NULL,
    version       TEXT NOT NULL,
    hostname      TEXT NOT NULL,
    pid           INTEGER NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    stopped_at    TIMESTAMPTZ
);

CREATE INDEX engine_instances_heartbeat ON engine_instances (heartbeat_at DESC);
