-- Quarantine is governable (docs/architecture.md §7.3): a quarantined
-- message can be discarded on purpose, by whom and why, and is written once
-- per stored message even when its ACK was lost and it came again.

-- Redeliveries of one stored message carry its broker offset id; keep the
-- first copy of any that an older build wrote twice, then make it unique.
DELETE FROM message_quarantine q
USING message_quarantine older
WHERE q.consumer_group = older.consumer_group
  AND q.broker_msg_id = older.broker_msg_id
  AND q.quarantine_id > older.quarantine_id;

CREATE UNIQUE INDEX message_quarantine_once
    ON message_quarantine (consumer_group, broker_msg_id);

ALTER TABLE message_quarantine
    ADD COLUMN discarded_at   TIMESTAMPTZ,
    ADD COLUMN discarded_by   TEXT,
    ADD COLUMN discard_reason TEXT;

CREATE INDEX message_quarantine_open
    ON message_quarantine (created_at)
    WHERE discarded_at IS NULL;
