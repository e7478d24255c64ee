-- jobguard PostgreSQL schema as the migrations leave it (the newest version), in one piece.
-- A test replays migrations/ on an empty schema and compares the result with this file.
-- Times are seconds since the Unix epoch (double precision), from the database's clock
-- (clock_timestamp()), so workers on hosts whose clocks disagree see the same expiries.

CREATE TABLE jobs (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task                 text    NOT NULL,
    queue                text    NOT NULL,
    payload              text    NOT NULL,
    status               text    NOT NULL CHECK (status IN ('queued', 'running', 'completed', 'dead')),
    priority             integer NOT NULL DEFAULT 0,
    -- queued: when it may run; running: when its lease expires. NULL once final.
    available_at         double precision,
    run_at               double precision NOT NULL,
    attempts             integer NOT NULL DEFAULT 0,
    max_attempts         integer NOT NULL,
    deferrals            integer NOT NULL DEFAULT 0,
    visibility_timeout_s double precision NOT NULL,
    lease_token          text,
    worker_id            text,
    operation_key        text,
    resource_key         text,
    lock_ttl_s           double precision,
    dedup_key            text,
    dedup_window_s       double precision NOT NULL DEFAULT 0,
    dedup_hits           integer NOT NULL DEFAULT 0,
    error_signature      text,
    same_error_count     integer NOT NULL DEFAULT 0,
    last_error           text,
    dead_code            text,
    dead_reason          text,
    headers              text,
    created_at           double precision NOT NULL,
    finished_at          double precision,
    -- Soft and hard run-time limits in seconds (NULL: none), stored at enqueue.
    soft_time_limit_s    double precision,
    time_limit_s         double precision,
    -- A cancel asked of a running job: when and by whom (read with each renewal).
    cancel_requested_at  double precision,
    cancel_requested_by  text,
    -- A concurrency limit: the job runs only while holding one of the key's N slots.
    concurrency_key      text,
    concurrency_limit    integer
);
-- A job's keys are no longer than an enqueue allows (keys.MAX_KEY_LENGTH): a longer one, written
-- by hand, would make the fetch's lock, operation or attempt row too large for its index, and
-- every fetch of the queue fail. NOT VALID as migration 8 adds it (rows from before unchecked).
ALTER TABLE jobs ADD CONSTRAINT jobs_keys_fit CHECK (
    char_length(operation_key) <= 512 AND char_length(resource_key) <= 512
    AND char_length(concurrency_key) <= 512 AND char_length(dedup_key) <= 512) NOT VALID;

-- The fetch scan: only live jobs are indexed, so finished rows cost the scan nothing however
-- many there are.
CREATE INDEX jobs_ready ON jobs (queue, priority DESC, available_at, id)
    WHERE status IN ('queued', 'running');
CREATE INDEX jobs_dedup ON jobs (dedup_key, id) WHERE dedup_key IS NOT NULL;
-- Only what a job's three writes must index: every index entry is written again by each of them
-- (none can be a heap-only update), so finished jobs and jobs without a lease are left out
-- where no statement looks them up.
CREATE INDEX jobs_status ON jobs (status, id) WHERE status <> 'completed';
CREATE UNIQUE INDEX jobs_lease_token ON jobs (lease_token) WHERE lease_token IS NOT NULL;
-- Retention deletes completed jobs oldest first.
CREATE INDEX jobs_finished ON jobs (finished_at, id) WHERE status = 'completed';
-- The dead letter queue per queue (the dashboard and the metrics exporter).
CREATE INDEX jobs_dead ON jobs (queue) WHERE status = 'dead';

CREATE TABLE attempts (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id          bigint  NOT NULL,
    attempt         integer NOT NULL,
    task            text    NOT NULL,
    queue           text    NOT NULL,
    operation_key   text,
    worker_id       text    NOT NULL,
    lease_token     text    NOT NULL UNIQUE,
    lock_owner      text,
    fence           bigint,
    started_at      double precision NOT NULL,
    ended_at        double precision,
    duration_s      double precision,
    outcome         text    NOT NULL DEFAULT 'running',
    error_type      text,
    error_message   text,
    traceback       text,
    steps_run       integer NOT NULL DEFAULT 0,
    steps_skipped   integer NOT NULL DEFAULT 0,
    -- The host queue's own id of the delivery (a guarded Celery, RQ or Dramatiq task).
    host_delivery   text
);
CREATE INDEX attempts_job ON attempts (job_id, id);
CREATE INDEX attempts_operation ON attempts (operation_key, id) WHERE operation_key IS NOT NULL;

-- One row per resource ever locked: the fence counter must survive release so it never repeats.
CREATE TABLE locks (
    resource    text PRIMARY KEY,
    owner       text,
    fence       bigint NOT NULL,
    expires_at  double precision
);

-- One row per concurrency slot ever held (key, slot 0..N-1): a lock of its own, whose fence
-- counter survives release so it never repeats.
CREATE TABLE slots (
    key         text    NOT NULL,
    slot        integer NOT NULL,
    owner       text,
    fence       bigint  NOT NULL,
    expires_at  double precision,
    PRIMARY KEY (key, slot)
);

CREATE TABLE operations (
    key           text PRIMARY KEY,
    status        text    NOT NULL CHECK (status IN ('processing', 'completed', 'failed')),
    resource_key  text,
    owner_lease   text,
    result        text,
    external_ref  text,
    attempts      integer NOT NULL DEFAULT 0,
    fence         bigint,
    last_error    text,
    created_at    double precision NOT NULL,
    updated_at    double precision NOT NULL,
    completed_at  double precision
);

CREATE TABLE steps (
    operation_key text NOT NULL,
    name          text NOT NULL,
    result        text NOT NULL,
    fence         bigint,
    created_at    double precision NOT NULL,
    PRIMARY KEY (operation_key, name)
);

-- The operators' audit trail (replays and purges from the dashboard).
CREATE TABLE audit (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      double precision NOT NULL,
    actor   text NOT NULL,
    action  text NOT NULL,
    target  text NOT NULL,
    detail  text NOT NULL DEFAULT ''
);

-- Periodic schedules: one row per schedule, the cursor every scheduler moves with compare-and-set.
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

-- Paused queues: one row per paused queue; a fetch skips a queue that has one.
CREATE TABLE paused_queues (
    queue      text PRIMARY KEY,
    -- When the pause took effect (stamped after it was committed) and who paused it.
    paused_at  double precision NOT NULL,
    paused_by  text NOT NULL
);
