-- Drain reports the drain intake refused (oversized, too deep, out of bounds, naming a
-- node other than the one NATS authenticated) are parked too (source 'drain', where it was
-- read from), with the reason: `sco outbox dead-letters` lists them beside the others.
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_source_check;
ALTER TABLE dead_letters
    ADD CONSTRAINT dead_letters_source_check CHECK (source IN ('outbox', 'ledger', 'drain'));
