-- Tokens and the operator audit log (docs/security.md).
--
-- api_tokens keeps only a SHA-256 of each bearer token: the secret is
-- printed once by `seckillctl auth token create` and never stored, so a
-- read of this table (or a backup of it) grants nothing.
CREATE TABLE api_tokens (
    name         TEXT        PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    role         TEXT        NOT NULL CHECK (role IN ('ingress', 'payments', 'reader', 'operator', 'admin')),
    token_sha256 TEXT        NOT NULL UNIQUE CHECK (token_sha256 ~ '^[0-9a-f]{64}$'),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_by   TEXT        NOT NULL,
    revoked_at   TIMESTAMPTZ,
    revoked_by   TEXT
);

-- One row per operator mutation, whichever path made it (the daemon's
-- operator API, the CLI's --direct break-glass, the database-URL bootstrap).
-- A change in PostgreSQL writes its row in the same transaction; a change
-- elsewhere (Redis, the broker) writes the row as PENDING first and completes
-- it once done, so a crash in between leaves an intent, never silence.
-- Never pruned automatically.
CREATE TABLE operator_audit (
    audit_id    BIGSERIAL   PRIMARY KEY,
    at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor       TEXT        NOT NULL,
    role        TEXT        NOT NULL,
    via         TEXT        NOT NULL CHECK (via IN ('token', 'direct', 'bootstrap', 'open')),
    command     TEXT        NOT NULL,
    targets     TEXT[]      NOT NULL DEFAULT '{}',
    reason      TEXT,
    before      JSONB,
    after       JSONB,
    outcome     TEXT        NOT NULL,
    finished_at TIMESTAMPTZ
);

CREATE INDEX operator_audit_at ON operator_audit (at);
CREATE INDEX operator_audit_actor ON operator_audit (actor, at);
CREATE INDEX operator_audit_targets ON operator_audit USING GIN (targets);
