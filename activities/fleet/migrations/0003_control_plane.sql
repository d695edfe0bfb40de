-- The control plane: what each acquisition is for and how far it got, so the region
-- controller counts in-flight work after a restart without asking Temporal's visibility.
ALTER TABLE acquisitions
    ADD COLUMN workload            text NOT NULL DEFAULT '',
    ADD COLUMN partition           smallint NOT NULL DEFAULT 0,
    ADD COLUMN requested_instances integer NOT NULL DEFAULT 0,
    ADD COLUMN shortfall_units     integer NOT NULL DEFAULT 0,
    ADD COLUMN pool_ids            text[] NOT NULL DEFAULT '{}',
    ADD COLUMN detail              text NOT NULL DEFAULT '';
CREATE INDEX acquisitions_open ON acquisitions (region, partition)
    WHERE state NOT IN ('completed', 'cancelled', 'declined', 'failed');

-- Instances a controller found surplus, and since when: released once idle long enough.
ALTER TABLE instances ADD COLUMN surplus_since timestamptz;
