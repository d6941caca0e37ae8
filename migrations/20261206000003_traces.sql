-- One W3C trace per reservation (docs/architecture.md §11.5): the trace id
-- its order-create message carried, written by the consumer's claim, so the
-- outbox can carry it on to the cancel, the order events and the release.
-- Nullable: rows from before trace by their reservation id.
ALTER TABLE reservations ADD COLUMN trace_id TEXT;
