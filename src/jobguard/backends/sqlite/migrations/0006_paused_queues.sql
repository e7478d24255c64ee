-- jobguard SQLite schema, version 6: paused queues.
-- One row per paused queue; a fetch skips a queue that has one (jobs stay queued, enqueues land).
CREATE TABLE IF NOT EXISTS paused_queues (
    queue      TEXT PRIMARY KEY,
    -- When the pause took effect (stamped after it was committed) and who paused it.
    paused_at  REAL NOT NULL,
    paused_by  TEXT NOT NULL
);
