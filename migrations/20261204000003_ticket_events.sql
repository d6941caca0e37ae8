-- Every ticket transition, for the webhook (docs/architecture.md §9.2): the
-- tracker hears of each move (opened, acknowledged, fixed, replaying,
-- verified, reopened, closed), whichever code path made it. A trigger
-- writes the row, so no path can move a ticket without it.
CREATE TABLE dlq_ticket_events (
    event_id       BIGSERIAL     PRIMARY KEY,
    ticket_id      TEXT          NOT NULL REFERENCES dlq_tickets (ticket_id),
    from_status    ticket_status,
    to_status      ticket_status NOT NULL,
    owner          TEXT,
    at             TIMESTAMPTZ   NOT NULL DEFAULT now(),
    webhook_status TEXT,
    attempted_at   TIMESTAMPTZ
);

CREATE INDEX dlq_ticket_events_undelivered ON dlq_ticket_events (event_id)
    WHERE webhook_status IS NULL OR webhook_status LIKE 'FAILED%';

CREATE FUNCTION dlq_ticket_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN
        INSERT INTO dlq_ticket_events (ticket_id, from_status, to_status, owner)
        VALUES (NEW.ticket_id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status, NEW.owner);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER dlq_ticket_moved AFTER INSERT OR UPDATE OF status ON dlq_tickets
    FOR EACH ROW EXECUTE FUNCTION dlq_ticket_moved();
