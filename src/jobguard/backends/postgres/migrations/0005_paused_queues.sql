-- jobguard PostgreSQL schema, version 5: paused queues.
-- One row per paused queue; a fetch skips a queue that has one (jobs stay queued, enqueues land).
CREATE TABLE paused_queues (
    queue      text PRIMARY KEY,
    -- When the pause took effect (stamped after it was committed) and who paused it.
    paused_at  double precision NOT NULL,
    paused_by  text NOT NULL
);
