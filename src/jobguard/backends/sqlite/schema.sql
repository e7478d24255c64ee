-- jobguard SQLite schema as the migrations leave it (the newest version), in one piece.
-- A test replays migrations/ on an empty file and compares the result with this file.
-- Times are seconds since the Unix epoch (REAL), from the store clock passed by the backend.

CREATE TABLE IF NOT EXISTS jobs (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    task                 TEXT    NOT NULL,
    queue                TEXT    NOT NULL,
    payload              TEXT    NOT NULL,
    status               TEXT    NOT NULL CHECK (status IN ('queued', 'running', 'completed', 'dead')),
    priority             INTEGER NOT NULL DEFAULT 0,
    -- queued: when it may run; running: when its lease expires. NULL once final.
    available_at         REAL,
    run_at               REAL    NOT NULL,
    attempts             INTEGER NOT NULL DEFAULT 0,
    max_attempts         INTEGER NOT NULL,
    deferrals            INTEGER NOT NULL DEFAULT 0,
    visibility_timeout_s REAL    NOT NULL,
    lease_token          TEXT UNIQUE,
    worker_id            TEXT,
    operation_key        TEXT,
    resource_key         TEXT,
    lock_ttl_s           REAL,
    dedup_key            TEXT,
    dedup_window_s       REAL    NOT NULL DEFAULT 0,
    dedup_hits           INTEGER NOT NULL DEFAULT 0,
    error_signature      TEXT,
    same_error_count     INTEGER NOT NULL DEFAULT 0,
    last_error           TEXT,
    dead_reason          TEXT,
    created_at           REAL    NOT NULL,
    finished_at          REAL,
    -- Why a job is dead, as a code; the words are made above the store (NULL text: from the code).
    dead_code            TEXT,
    -- Context carried with a job (a JSON object as text), e.g. the enqueuer's trace.
    headers              TEXT,
    -- Soft and hard run-time limits in seconds (NULL: none), stored at enqueue.
    soft_time_limit_s    REAL,
    time_limit_s         REAL,
    -- A cancel asked of a running job: when and by whom (read with each renewal).
    cancel_requested_at  REAL,
    cancel_requested_by  TEXT,
    -- A concurrency limit: the job runs only while holding one of the key's N slots.
    concurrency_key      TEXT,
    concurrency_limit    INTEGER
);

-- The fetch scan: only live jobs are indexed, so finished rows cost the scan nothing.
CREATE INDEX IF NOT EXISTS jobs_ready
    ON jobs (queue, priority DESC, available_at, id)
    WHERE status IN ('queued', 'running');
CREATE INDEX IF NOT EXISTS jobs_dedup ON jobs (dedup_key, id) WHERE dedup_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, id);
CREATE INDEX IF NOT EXISTS jobs_operation ON jobs (operation_key) WHERE operation_key IS NOT NULL;
-- The dead letter queue per queue (the dashboard and the metrics exporter).
CREATE INDEX IF NOT EXISTS jobs_dead ON jobs (queue) WHERE status = 'dead';

CREATE TABLE IF NOT EXISTS attempts (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id          INTEGER NOT NULL,
    attempt         INTEGER NOT NULL,
    task            TEXT    NOT NULL,
    queue           TEXT    NOT NULL,
    operation_key   TEXT,
    worker_id       TEXT    NOT NULL,
    lease_token     TEXT    NOT NULL UNIQUE,
    lock_owner      TEXT,
    fence           INTEGER,
    started_at      REAL    NOT NULL,
    ended_at        REAL,
    duration_s      REAL,
    outcome         TEXT    NOT NULL DEFAULT 'running',
    error_type      TEXT,
    error_message   TEXT,
    traceback       TEXT,
    steps_run       INTEGER NOT NULL DEFAULT 0,
    steps_skipped   INTEGER NOT NULL DEFAULT 0,
    -- The host queue's own id of the delivery (a guarded Celery, RQ or Dramatiq task).
    host_delivery   TEXT
);
CREATE INDEX IF NOT EXISTS attempts_job ON attempts (job_id, id);
CREATE INDEX IF NOT EXISTS attempts_operation ON attempts (operation_key, id)
    WHERE operation_key IS NOT NULL;

-- One row per resource ever locked: the fence counter must survive release so it never repeats.
CREATE TABLE IF NOT EXISTS locks (
    resource    TEXT PRIMARY KEY,
    owner       TEXT,
    fence       INTEGER NOT NULL,
    expires_at  REAL
);

-- One row per concurrency slot ever held (key, slot 0..N-1): a lock of its own, whose fence
-- counter survives release so it never repeats.
CREATE TABLE IF NOT EXISTS slots (
    key         TEXT    NOT NULL,
    slot        INTEGER NOT NULL,
    owner       TEXT,
    fence       INTEGER NOT NULL,
    expires_at  REAL,
    PRIMARY KEY (key, slot)
);

CREATE TABLE IF NOT EXISTS operations (
    key           TEXT PRIMARY KEY,
    status        TEXT    NOT NULL CHECK (status IN ('processing', 'completed', 'failed')),
    resource_key  TEXT,
    owner_lease   TEXT,
    result        TEXT,
    external_ref  TEXT,
    attempts      INTEGER NOT NULL DEFAULT 0,
    fence         INTEGER,
    last_error    TEXT,
    created_at    REAL    NOT NULL,
    updated_at    REAL    NOT NULL,
    completed_at  REAL
);

CREATE TABLE IF NOT EXISTS steps (
    operation_key TEXT NOT NULL,
    name          TEXT NOT NULL,
    result        TEXT NOT NULL,
    fence         INTEGER,
    created_at    REAL NOT NULL,
    PRIMARY KEY (operation_key, name)
);

-- The store clock of one host: seconds since boot plus the wall-clock offset recorded by the
-- first process of each boot.
CREATE TABLE IF NOT EXISTS jobguard_clock (
    boot_id  TEXT PRIMARY KEY,
    offset_s REAL NOT NULL
);

-- The operators' audit trail (replays and purges from the dashboard).
CREATE TABLE IF NOT EXISTS audit (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      REAL NOT NULL,
    actor   TEXT NOT NULL,
    action  TEXT NOT NULL,
    target  TEXT NOT NULL,
    detail  TEXT NOT NULL DEFAULT ''
);

-- Periodic schedules: one row per schedule, the cursor every scheduler moves with compare-and-set.
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

-- Paused queues: one row per paused queue; a fetch skips a queue that has one.
CREATE TABLE IF NOT EXISTS paused_queues (
    queue      TEXT PRIMARY KEY,
    -- When the pause took effect (stamped after it was committed) and who paused it.
    paused_at  REAL NOT NULL,
    paused_by  TEXT NOT NULL
);
