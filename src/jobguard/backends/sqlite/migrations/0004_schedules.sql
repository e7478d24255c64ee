-- jobguard SQLite schema, version 4: periodic schedules.
-- One row per schedule: the cursor every scheduler process reads and moves with compare-and-set.
-- Ticks are whole seconds since the Unix epoch (UTC).
CREATE TABLE IF NOT EXISTS schedules (
    name         TEXT    PRIMARY KEY,
    -- The newest tick decided: enqueued, or passed over by the missed-tick policy.
    cursor       INTEGER NOT NULL,
    -- The newest tick enqueued, and its job.
    last_tick    INTEGER,
    last_job_id  INTEGER,
    updated_at   REAL    NOT NULL
);
