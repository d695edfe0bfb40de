-- Reclaims planned ahead (`sco reclaim --at`, a Blazar host lease that starts later): the
-- hall's notice relay sends a signed early warning when the row is written and the hard
-- notice at reclaim_at - the region's notice lead. The relay sweeps these rows, so the
-- plan survives a relay restart and never waits on the control plane (Temporal).
CREATE TABLE planned_reclaims (
    instance_id  text PRIMARY KEY REFERENCES instances (instance_id) ON DELETE CASCADE,
    region       text NOT NULL,
    hall         text NOT NULL,
    reclaim_at   timestamptz NOT NULL,
    reason       text NOT NULL DEFAULT '',
    planned_at   timestamptz NOT NULL DEFAULT now(),
    noticed_at   timestamptz
);
CREATE INDEX planned_reclaims_open ON planned_reclaims (region, hall, reclaim_at)
    WHERE noticed_at IS NULL;
