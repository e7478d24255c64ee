-- jobguard PostgreSQL schema, version 3: periodic schedules.
-- One row per schedule: the cursor every scheduler process reads and moves with compare-and-set.
-- Ticks are whole seconds since the Unix epoch (UTC).
CREATE TABLE schedules (
    name         text    PRIMARY KEY,
    -- The newest tick decided: enqueued, or passed over by the missed-tick policy.
    cursor       bigint  NOT NULL,
    -- The newest tick enqueued, and its job.
    last_tick    bigint,
    last_job_id  bigint,
    updated_at   double precision NOT NULL
);
