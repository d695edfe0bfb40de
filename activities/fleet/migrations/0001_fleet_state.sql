-- Fleet state: what SCO believes about pools, instances, floors, exclusions,
-- acquisitions and demand. One region's workers write only their region's rows.

CREATE TABLE pools (
    pool_id            text PRIMARY KEY,           -- region.hall.sku.size
    region             text NOT NULL,
    hall               text NOT NULL,
    sku                text NOT NULL,
    size               text NOT NULL,
    vcpu               integer NOT NULL CHECK (vcpu > 0),
    memory_gib         integer NOT NULL CHECK (memory_gib > 0),
    gpus               integer NOT NULL DEFAULT 0 CHECK (gpus >= 0),
    price_per_hour     double precision NOT NULL CHECK (price_per_hour >= 0),
    reclaimable_units  integer NOT NULL CHECK (reclaimable_units >= 0),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (region, hall, sku, size)
);

CREATE TABLE instances (
    instance_id     text PRIMARY KEY,              -- deterministic name; also the Kafka key
    region          text NOT NULL,
    pool_id         text NOT NULL REFERENCES pools (pool_id),
    hall            text NOT NULL,
    sku             text NOT NULL,
    size            text NOT NULL,
    capacity_type   text NOT NULL CHECK (capacity_type IN ('reclaimable', 'committed')),
    workload        text NOT NULL,
    tier            smallint NOT NULL CHECK (tier BETWEEN 1 AND 3),
    price_per_hour  double precision NOT NULL,     -- price when acquired: the ledger's rate
    state           text NOT NULL CHECK (state IN
                        ('requested', 'active', 'noticed', 'draining', 'deleted', 'failed')),
    provider_id     text,                          -- Nova server / Ironic node uuid
    acquisition_id  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    state_changed_at timestamptz NOT NULL DEFAULT now(),
    version         integer NOT NULL DEFAULT 1
);
CREATE INDEX instances_region_state ON instances (region, state);
CREATE INDEX instances_pool_live ON instances (pool_id) WHERE state NOT IN ('deleted', 'failed');

CREATE TABLE floors (
    workload    text NOT NULL,
    region      text NOT NULL,
    hall        text NOT NULL,
    units       integer NOT NULL CHECK (units >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workload, region, hall)
);

CREATE TABLE exclusions (
    pool_id         text PRIMARY KEY REFERENCES pools (pool_id),
    state           text NOT NULL CHECK (state IN ('admitted', 'excluded', 'probing')),
    reason          text NOT NULL DEFAULT '',
    strikes         integer NOT NULL DEFAULT 0,
    excluded_until  timestamptz,
    set_by          text NOT NULL DEFAULT 'cycle',  -- 'cycle' or an operator's name
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE acquisitions (
    acquisition_id   text PRIMARY KEY,             -- the workflow id
    region           text NOT NULL,
    state            text NOT NULL,
    requested_units  integer NOT NULL CHECK (requested_units >= 0),
    launched         integer NOT NULL DEFAULT 0,
    active           integer NOT NULL DEFAULT 0,
    failed           integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX acquisitions_region_state ON acquisitions (region, state);

CREATE TABLE demand (
    workload    text NOT NULL,
    region      text NOT NULL,
    source      text NOT NULL,                     -- 'cli', 'slurm', 'kubernetes'
    units       integer NOT NULL CHECK (units >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workload, region, source)
);

-- Transactional outbox: a state change and its event commit together; the relay
-- publishes rows in id order and stamps sent_at.
CREATE TABLE outbox (
    id          bigserial PRIMARY KEY,
    event_id    uuid NOT NULL UNIQUE,
    topic       text NOT NULL,
    key         text NOT NULL,
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    sent_at     timestamptz
);
CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL;
