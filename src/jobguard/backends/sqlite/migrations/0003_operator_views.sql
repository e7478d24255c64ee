-- jobguard SQLite schema, version 3: what the dashboard and the metrics exporter read.

-- The operators' audit trail (replays and purges from the dashboard).
CREATE TABLE IF NOT EXISTS audit (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      REAL NOT NULL,
    actor   TEXT NOT NULL,
    action  TEXT NOT NULL,
    target  TEXT NOT NULL,
    detail  TEXT NOT NULL DEFAULT ''
);

-- The dead letter queue per queue, read at every scrape without touching the rows; written only
-- when a job is buried, replayed or purged.
CREATE INDEX IF NOT EXISTS jobs_dead ON jobs (queue) WHERE status = 'dead';
