-- Events that could not go on: an outbox row the broker refused max_attempts times
-- (source 'outbox', outbox_id set) and a Kafka message the ledger consumer could not parse
-- (source 'ledger', where it was read from). Nothing is dropped silently: an operator
-- lists them (`sco outbox dead-letters`) and resends one (`sco outbox retry ID`).
CREATE TABLE dead_letters (
    id          bigserial PRIMARY KEY,
    source      text NOT NULL CHECK (source IN ('outbox', 'ledger')),
    outbox_id   bigint REFERENCES outbox (id) ON DELETE SET NULL,
    topic       text NOT NULL,
    key         text NOT NULL DEFAULT '',
    value       bytea NOT NULL,
    reason      text NOT NULL,
    attempts    integer NOT NULL DEFAULT 1,
    location    text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    retried_at  timestamptz
);
CREATE INDEX dead_letters_open ON dead_letters (id) WHERE retried_at IS NULL;

-- A dead-lettered outbox row is neither sent nor pending: the relay skips it until retried.
ALTER TABLE outbox ADD COLUMN dead_lettered_at timestamptz;
DROP INDEX outbox_unsent;
CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL AND dead_lettered_at IS NULL;
