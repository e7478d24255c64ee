-- jobguard PostgreSQL schema, version 2: what the dashboard and the metrics exporter read.

-- The operators' audit trail (replays and purges from the dashboard).
CREATE TABLE audit (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      double precision NOT NULL,
    actor   text NOT NULL,
    action  text NOT NULL,
    target  text NOT NULL,
    detail  text NOT NULL DEFAULT ''
);

-- The dead letter queue per queue, read at every scrape without touching the rows; written only
-- when a job is buried, replayed or purged.
CREATE INDEX jobs_dead ON jobs (queue) WHERE status = 'dead';
