-- Named queries of the SQLite backend. Each "-- name:" starts one statement.
-- Every statement that changes a delivery names its lease token in the WHERE clause.

-- name: job_by_id
SELECT * FROM jobs WHERE id = :id;

-- name: job_by_id_for_update
-- Writes are serialised by the database lock: nothing to lock row by row.
SELECT * FROM jobs WHERE id = :id;

-- name: count_by_status
SELECT status, count(*) AS n FROM jobs GROUP BY status;

-- name: live_dedup_job
-- A job holds its dedup key while queued or running, and for dedup_window_s after completion.
SELECT * FROM jobs
WHERE dedup_key = :dedup_key
  AND (status IN ('queued', 'running')
       OR (status = 'completed' AND finished_at + dedup_window_s > :now))
ORDER BY id DESC LIMIT 1;

-- name: lock_dedup_key
-- Writes are serialised by the database lock, so enqueues of one key already take turns.
SELECT :dedup_key;

-- name: count_dedup_hit
-- Stops at the column's largest value: one more would turn the count into a real number.
UPDATE jobs SET dedup_hits = min(dedup_hits, 9223372036854775806) + 1 WHERE id = :id;

-- name: insert_job
INSERT INTO jobs (task, queue, payload, status, priority, available_at, run_at, max_attempts,
                  visibility_timeout_s, operation_key, resource_key, lock_ttl_s, dedup_key,
                  dedup_window_s, headers, soft_time_limit_s, time_limit_s, concurrency_key,
                  concurrency_limit, created_at)
VALUES (:task, :queue, :payload, 'queued', :priority, :now + :delay_s, :now + :delay_s, :max_attempts,
        :visibility_timeout_s, :operation_key, :resource_key, :lock_ttl_s, :dedup_key,
        :dedup_window_s, :headers, :soft_time_limit_s, :time_limit_s, :concurrency_key,
        :concurrency_limit, :now)
RETURNING *;

-- name: ready_jobs
-- Queued jobs whose time has come, and running jobs whose lease expired (a crashed or stalled
-- worker): both are available_at <= now. Nothing of a paused queue: the one place a pause acts.
-- None comes back leased (0): SQLite leases them with lease_jobs (PostgreSQL's lease_and_begin
-- picks and leases in one statement).
SELECT id, task, status, attempts, max_attempts, lease_token, 0 AS leased FROM jobs
WHERE queue = :queue AND status IN ('queued', 'running') AND available_at <= :now
  AND NOT EXISTS (SELECT 1 FROM paused_queues WHERE queue = :queue)
ORDER BY priority DESC, available_at, id
LIMIT :limit;

-- name: close_lost_attempts
-- A lost delivery never reported its counts: the steps it ran are those of its operation
-- recorded since it started (a later delivery has not run yet: this closes it at the takeover).
UPDATE attempts SET outcome = 'lost', ended_at = :now,
    steps_run = (SELECT count(*) FROM steps
                 WHERE steps.operation_key = attempts.operation_key
                   AND steps.created_at >= attempts.started_at)
WHERE lease_token IN (SELECT value FROM json_each(:tokens)) AND outcome = 'running';

-- name: bury_lost
-- A job whose last allowed delivery never reported back (its worker died): attempts are charged
-- at delivery, so it goes to the dead letter queue instead of looping forever. The reason is a
-- code; its words are made above the store.
UPDATE jobs
SET status = 'dead', available_at = NULL, lease_token = NULL, finished_at = :now,
    dead_code = :code, dead_reason = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'running';

-- name: lease_jobs
-- :lease_s and :max_attempts are the fetching worker's lease and attempt limit for these jobs'
-- task (NULL: the stored ones); the limit it enforces is the one the row then shows.
UPDATE jobs
SET status = 'running', attempts = attempts + 1, worker_id = :worker_id,
    lease_token = lower(hex(randomblob(16))),
    available_at = :now + coalesce(:lease_s, visibility_timeout_s),
    max_attempts = coalesce(:max_attempts, max_attempts)
WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING *, coalesce(:lease_s, visibility_timeout_s) AS lease_s;

-- name: insert_attempts
-- The attempts of deliveries just leased and begun (:items: job_id, lock_owner, fence), each
-- with the lock its begin granted: the row is written once here, not marked afterwards.
INSERT INTO attempts (job_id, attempt, task, queue, operation_key, worker_id, lease_token,
                      lock_owner, fence, started_at, host_delivery)
SELECT j.id, j.attempts, j.task, j.queue, j.operation_key, j.worker_id, j.lease_token,
       json_extract(item.value, '$.lock_owner'), json_extract(item.value, '$.fence'), :now, :host
FROM json_each(:items) AS item
JOIN jobs AS j ON j.id = json_extract(item.value, '$.job_id')
RETURNING id, job_id;

-- name: extend_leases
-- The leases still held extended (:items: job_id, lease_token, visibility_timeout_s) from the
-- store clock. Returns the leases it extended, each with
-- who asked to cancel its job, if anyone did (its worker then tells the run).
UPDATE jobs
SET available_at = :now + item.visibility_timeout_s
FROM (SELECT json_extract(value, '$.job_id') AS job_id,
             json_extract(value, '$.lease_token') AS lease_token,
             json_extract(value, '$.visibility_timeout_s') AS visibility_timeout_s
      FROM json_each(:items)) AS item
-- +jobs.status: not by the status index, which would visit every running job (every worker's)
-- once per item; the items lead, each job found by its id.
WHERE jobs.id = item.job_id AND jobs.lease_token = item.lease_token AND +jobs.status = 'running'
RETURNING jobs.id, jobs.lease_token, jobs.cancel_requested_by;

-- name: settle_jobs
-- How deliveries end, many at once (:items: job_id, lease_token, resource, fence, slot_key,
-- slot, slot_fence, key, status, delay_s, uncharge, deferral, set_error, last_error,
-- set_signature, error_signature, same_error_count, code, reason), each only with every proof in
-- place: the lease, and for a success the newest fence of its lock (resource, fence) and of its
-- concurrency slot (slot_key, slot, slot_fence) and the operation's claim (key).
-- status 'completed' finishes the job, 'dead' buries it, 'queued' requeues it after delay_s
-- (NULL: now, keeping its run_at); uncharge hands the attempt back. Returns the ids it moved.
UPDATE jobs
SET status = item.status,
    available_at = CASE WHEN item.status = 'queued' THEN :now + coalesce(item.delay_s, 0) END,
    run_at = CASE WHEN item.delay_s IS NULL THEN jobs.run_at ELSE :now + item.delay_s END,
    lease_token = NULL,
    finished_at = CASE WHEN item.status = 'queued' THEN jobs.finished_at ELSE :now END,
    attempts = jobs.attempts - item.uncharge,
    -- Stops at the column's largest value: past it the count turns into a real number, and the
    -- job's next fetch would bury it as unrunnable instead of deferring it again.
    deferrals = min(jobs.deferrals, 9223372036854775807 - item.deferral) + item.deferral,
    last_error = CASE WHEN item.set_error THEN item.last_error ELSE jobs.last_error END,
    error_signature = CASE WHEN item.set_signature THEN item.error_signature
                           ELSE jobs.error_signature END,
    same_error_count = CASE WHEN item.set_signature THEN item.same_error_count
                            ELSE jobs.same_error_count END,
    dead_code = CASE WHEN item.status = 'dead' THEN item.code ELSE jobs.dead_code END,
    dead_reason = CASE WHEN item.status = 'dead' THEN item.reason ELSE jobs.dead_reason END
FROM (SELECT json_extract(value, '$.job_id') AS job_id,
             json_extract(value, '$.lease_token') AS lease_token,
             json_extract(value, '$.resource') AS resource,
             json_extract(value, '$.fence') AS fence,
             json_extract(value, '$.slot_key') AS slot_key,
             json_extract(value, '$.slot') AS slot,
             json_extract(value, '$.slot_fence') AS slot_fence,
             json_extract(value, '$.key') AS key,
             json_extract(value, '$.status') AS status,
             json_extract(value, '$.delay_s') AS delay_s,
             json_extract(value, '$.uncharge') AS uncharge,
             json_extract(value, '$.deferral') AS deferral,
             json_extract(value, '$.set_error') AS set_error,
             json_extract(value, '$.last_error') AS last_error,
             json_extract(value, '$.set_signature') AS set_signature,
             json_extract(value, '$.error_signature') AS error_signature,
             json_extract(value, '$.same_error_count') AS same_error_count,
             json_extract(value, '$.code') AS code,
             json_extract(value, '$.reason') AS reason
      FROM json_each(:items)) AS item
-- +jobs.status: the items lead, each job found by its id (as in extend_leases).
WHERE jobs.id = item.job_id AND jobs.lease_token = item.lease_token AND +jobs.status = 'running'
  AND (item.resource IS NULL
       OR NOT EXISTS (SELECT 1 FROM locks
                      WHERE locks.resource = item.resource AND locks.fence > item.fence))
  AND (item.slot_key IS NULL
       OR NOT EXISTS (SELECT 1 FROM slots
                      WHERE slots.key = item.slot_key AND slots.slot = item.slot
                        AND slots.fence > item.slot_fence))
  AND (item.key IS NULL
       OR EXISTS (SELECT 1 FROM operations
                  WHERE operations.key = item.key AND operations.owner_lease = item.lease_token))
RETURNING jobs.id;

-- name: complete_operations
-- The operations of finished deliveries completed, where the delivery still holds the claim
-- (:items: key, owner_lease, result, external_ref, fence).
UPDATE operations
SET status = 'completed', result = item.result, external_ref = item.external_ref,
    fence = item.fence, owner_lease = NULL, updated_at = :now, completed_at = :now,
    last_error = NULL
FROM (SELECT json_extract(value, '$.key') AS key,
             json_extract(value, '$.owner_lease') AS owner_lease,
             json_extract(value, '$.result') AS result,
             json_extract(value, '$.external_ref') AS external_ref,
             json_extract(value, '$.fence') AS fence
      FROM json_each(:items)) AS item
WHERE operations.key = item.key AND operations.owner_lease = item.owner_lease
  AND operations.status = 'processing';

-- name: close_attempts
-- The attempts of ended deliveries closed (:items: attempt_id, outcome, duration_s, error_type,
-- error_message, traceback, lock_owner, fence, steps_run, steps_skipped).
UPDATE attempts
SET outcome = item.outcome, ended_at = :now, duration_s = item.duration_s,
    error_type = item.error_type, error_message = item.error_message, traceback = item.traceback,
    lock_owner = item.lock_owner, fence = item.fence, steps_run = item.steps_run,
    steps_skipped = item.steps_skipped
FROM (SELECT json_extract(value, '$.attempt_id') AS attempt_id,
             json_extract(value, '$.outcome') AS outcome,
             json_extract(value, '$.duration_s') AS duration_s,
             json_extract(value, '$.error_type') AS error_type,
             json_extract(value, '$.error_message') AS error_message,
             json_extract(value, '$.traceback') AS traceback,
             json_extract(value, '$.lock_owner') AS lock_owner,
             json_extract(value, '$.fence') AS fence,
             json_extract(value, '$.steps_run') AS steps_run,
             json_extract(value, '$.steps_skipped') AS steps_skipped
      FROM json_each(:items)) AS item
WHERE attempts.id = item.attempt_id;

-- name: mark_attempts
-- Record on stale deliveries' own attempt rows that their writes were refused (diagnostics
-- only; :items: attempt_id, outcome, duration_s, error_type, error_message, steps_run,
-- steps_skipped). An attempt already closed (as lost, by the fetch that took the job over)
-- keeps when it ended.
UPDATE attempts
SET outcome = item.outcome, ended_at = coalesce(attempts.ended_at, :now),
    duration_s = coalesce(attempts.duration_s, item.duration_s),
    error_type = item.error_type, error_message = item.error_message,
    steps_run = max(attempts.steps_run, item.steps_run),
    steps_skipped = max(attempts.steps_skipped, item.steps_skipped)
FROM (SELECT json_extract(value, '$.attempt_id') AS attempt_id,
             json_extract(value, '$.outcome') AS outcome,
             json_extract(value, '$.duration_s') AS duration_s,
             json_extract(value, '$.error_type') AS error_type,
             json_extract(value, '$.error_message') AS error_message,
             json_extract(value, '$.steps_run') AS steps_run,
             json_extract(value, '$.steps_skipped') AS steps_skipped
      FROM json_each(:items)) AS item
WHERE attempts.id = item.attempt_id;

-- name: release_locks
-- release_lock for many (:items: resource, owner).
UPDATE locks SET owner = NULL, expires_at = NULL
FROM (SELECT json_extract(value, '$.resource') AS resource,
             json_extract(value, '$.owner') AS owner
      FROM json_each(:items)) AS item
WHERE locks.resource = item.resource AND locks.owner = item.owner;

-- name: cancel_job
-- A cancel (#17): a queued job is buried as cancelled (:code, :reason); a running one only
-- records the request, which its worker reads with each renewal. The first request is kept.
UPDATE jobs
SET status = CASE WHEN status = 'queued' THEN 'dead' ELSE status END,
    available_at = CASE WHEN status = 'queued' THEN NULL ELSE available_at END,
    finished_at = CASE WHEN status = 'queued' THEN :now ELSE finished_at END,
    dead_code = CASE WHEN status = 'queued' THEN :code ELSE dead_code END,
    dead_reason = CASE WHEN status = 'queued' THEN :reason ELSE dead_reason END,
    cancel_requested_at = coalesce(cancel_requested_at, :now),
    cancel_requested_by = coalesce(cancel_requested_by, :actor)
WHERE id = :job_id AND status IN ('queued', 'running')
RETURNING *;

-- name: dead_jobs
SELECT * FROM jobs WHERE status = 'dead' ORDER BY finished_at DESC, id DESC LIMIT :limit;

-- name: retry_now
-- A queued job waiting for its run time (a retry's backoff, a delay, a busy lock) is due now;
-- nothing else of it changes. No row: it is not queued, or already due.
UPDATE jobs SET available_at = :now, run_at = :now
WHERE id = :job_id AND status = 'queued' AND available_at > :now
RETURNING *;

-- name: replay_job
-- Back to the queue with the same id, payload and keys (its operation key is kept, so completed work is not redone).
UPDATE jobs
SET status = 'queued', available_at = :now, run_at = :now, attempts = 0, deferrals = 0,
    same_error_count = 0, error_signature = NULL, dead_code = NULL, dead_reason = NULL,
    finished_at = NULL, cancel_requested_at = NULL, cancel_requested_by = NULL
WHERE id = :job_id AND status = 'dead'
RETURNING *;

-- name: purge_attempts
DELETE FROM attempts
WHERE job_id IN (SELECT id FROM jobs WHERE status = 'dead'
                 AND (:job_id IS NULL OR id = :job_id));

-- name: purge_jobs
DELETE FROM jobs WHERE status = 'dead' AND (:job_id IS NULL OR id = :job_id);

-- name: attempts_of_job
SELECT * FROM attempts WHERE job_id = :job_id ORDER BY id;

-- name: attempts_of_operation
SELECT * FROM attempts WHERE operation_key = :operation_key ORDER BY id;

-- name: recent_attempts
SELECT * FROM attempts ORDER BY id DESC LIMIT :limit;

-- name: lock_row
SELECT resource, owner, fence, expires_at FROM locks WHERE resource = :resource;

-- name: grant_locks
-- grant_lock for many distinct resources (:items: resource, owner, expires_at). Returns the
-- granted ones. (WHERE true: SQLite's parser needs it before ON CONFLICT after a SELECT.) A lock
-- or slot whose fence is at the largest integer (written by hand) is never granted again: a
-- fence must grow, and its job waits as for a busy one, as on PostgreSQL.
INSERT INTO locks (resource, owner, fence, expires_at)
SELECT json_extract(value, '$.resource'), json_extract(value, '$.owner'), 1,
       json_extract(value, '$.expires_at')
FROM json_each(:items) WHERE true
ON CONFLICT (resource) DO UPDATE
SET owner = excluded.owner, fence = locks.fence + 1, expires_at = excluded.expires_at
WHERE (locks.owner IS NULL OR locks.expires_at <= :now) AND locks.fence < 9223372036854775807
RETURNING resource, fence;

-- name: grant_slots
-- Concurrency slots for many deliveries (:items: key, lim, owner, expires_at, nth): each gets
-- the nth (from 0) free slot of its key among slots 0..lim-1 (free: never held, released or
-- expired), nth distinct per key. Returns the granted ones (key, slot, owner, fence): an item
-- whose nth free slot is not below its limit gets none.
WITH RECURSIVE
    item AS (SELECT json_extract(value, '$.key') AS key, json_extract(value, '$.lim') AS lim,
                    json_extract(value, '$.owner') AS owner,
                    json_extract(value, '$.expires_at') AS expires_at,
                    json_extract(value, '$.nth') AS nth
             FROM json_each(:items)),
    wanted AS (SELECT key, max(lim) AS lim FROM item GROUP BY key),
    numbered (key, slot, lim) AS (
        SELECT key, 0, lim FROM wanted
        UNION ALL SELECT key, slot + 1, lim FROM numbered WHERE slot + 1 < lim),
    free AS (SELECT numbered.key, numbered.slot,
                    row_number() OVER (PARTITION BY numbered.key ORDER BY numbered.slot) - 1 AS nth
             FROM numbered LEFT JOIN slots
                  ON slots.key = numbered.key AND slots.slot = numbered.slot
             WHERE (slots.key IS NULL OR slots.owner IS NULL OR slots.expires_at <= :now)
               AND (slots.fence IS NULL OR slots.fence < 9223372036854775807))
INSERT INTO slots (key, slot, owner, fence, expires_at)
SELECT free.key, free.slot, item.owner, 1, item.expires_at
FROM item JOIN free ON free.key = item.key AND free.nth = item.nth
WHERE free.slot < item.lim
ON CONFLICT (key, slot) DO UPDATE
SET owner = excluded.owner, fence = slots.fence + 1, expires_at = excluded.expires_at
WHERE (slots.owner IS NULL OR slots.expires_at <= :now) AND slots.fence < 9223372036854775807
RETURNING key, slot, owner, fence;

-- name: renew_slots
-- The slots still owned extended (:items: key, slot, owner, ttl_s) from the store clock.
-- Returns the slots it extended.
UPDATE slots
SET expires_at = :now + item.ttl_s
FROM (SELECT json_extract(value, '$.key') AS key,
             json_extract(value, '$.slot') AS slot,
             json_extract(value, '$.owner') AS owner,
             json_extract(value, '$.ttl_s') AS ttl_s
      FROM json_each(:items)) AS item
WHERE slots.key = item.key AND slots.slot = item.slot AND slots.owner = item.owner
RETURNING slots.key, slots.slot, slots.owner;

-- name: release_slots
-- The slots of ended deliveries freed, where each owner still holds its slot (:items: key,
-- slot, owner); the fence counter is kept.
UPDATE slots SET owner = NULL, expires_at = NULL
FROM (SELECT json_extract(value, '$.key') AS key, json_extract(value, '$.slot') AS slot,
             json_extract(value, '$.owner') AS owner
      FROM json_each(:items)) AS item
WHERE slots.key = item.key AND slots.slot = item.slot AND slots.owner = item.owner;

-- name: slot_rows
SELECT key, slot, owner, fence, expires_at FROM slots WHERE key = :key ORDER BY slot;

-- name: attempt_locks
-- attempt_lock for many (:items: attempt_id, lock_owner, fence).
UPDATE attempts SET lock_owner = item.lock_owner, fence = item.fence
FROM (SELECT json_extract(value, '$.attempt_id') AS attempt_id,
             json_extract(value, '$.lock_owner') AS lock_owner,
             json_extract(value, '$.fence') AS fence
      FROM json_each(:items)) AS item
WHERE attempts.id = item.attempt_id;

-- name: insert_operations
-- insert_operation for many distinct keys (:items: key, resource_key, owner_lease, fence);
-- returns the keys it inserted (keys already recorded are left alone).
INSERT INTO operations (key, status, resource_key, owner_lease, attempts, fence, created_at,
                        updated_at)
SELECT json_extract(value, '$.key'), 'processing', json_extract(value, '$.resource_key'),
       json_extract(value, '$.owner_lease'), 1, json_extract(value, '$.fence'), :now, :now
FROM json_each(:items) WHERE true
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: renew_locks
-- The locks still owned extended (:items: resource, owner, ttl_s) from the store clock.
-- Returns the locks it extended.
UPDATE locks
SET expires_at = :now + item.ttl_s
FROM (SELECT json_extract(value, '$.resource') AS resource,
             json_extract(value, '$.owner') AS owner,
             json_extract(value, '$.ttl_s') AS ttl_s
      FROM json_each(:items)) AS item
WHERE locks.resource = item.resource AND locks.owner = item.owner
RETURNING locks.resource, locks.owner;

-- name: operation_row
SELECT * FROM operations WHERE key = :key;

-- name: operation_row_for_update
SELECT * FROM operations WHERE key = :key;

-- name: claim_operation
UPDATE operations
SET status = 'processing', owner_lease = :owner_lease, attempts = attempts + 1, fence = :fence,
    updated_at = :now
WHERE key = :key AND status != 'completed'
RETURNING *;

-- name: release_operations
-- The claims of ended deliveries dropped (:items: key, owner_lease, status, last_error): a
-- retry leaves its operation 'processing', a burial marks it 'failed', a release only unclaims
-- it (last_error NULL keeps the one recorded).
UPDATE operations
SET status = item.status, owner_lease = NULL,
    last_error = coalesce(item.last_error, operations.last_error), updated_at = :now
FROM (SELECT json_extract(value, '$.key') AS key,
             json_extract(value, '$.owner_lease') AS owner_lease,
             json_extract(value, '$.status') AS status,
             json_extract(value, '$.last_error') AS last_error
      FROM json_each(:items)) AS item
WHERE operations.key = item.key AND operations.owner_lease = item.owner_lease
  AND operations.status = 'processing';

-- name: steps_of_operation
SELECT name, result FROM steps WHERE operation_key = :key;

-- part: step_proofs
-- What a step's record proves as it is written (as on PostgreSQL; here the write transaction
-- already excludes every other writer): the lease current, no newer fence on the lock nor on
-- the slot, the claim held by this lease.
EXISTS (SELECT 1 FROM jobs
        WHERE id = :job_id AND lease_token = :lease_token AND status = 'running')
AND (:resource IS NULL
     OR coalesce((SELECT fence FROM locks WHERE resource = :resource), 0) <= :fence)
AND (:slot_key IS NULL
     OR coalesce((SELECT fence FROM slots WHERE key = :slot_key AND slot = :slot), 0)
        <= :slot_fence)
AND EXISTS (SELECT 1 FROM operations WHERE key = :key AND owner_lease = :lease_token)

-- name: insert_step
-- A step recorded only while every proof still holds (step_proofs). Inserts nothing when one
-- fails (the caller reads which, and rolls back).
INSERT INTO steps (operation_key, name, result, fence, created_at)
SELECT :key, :name, :result, :fence, :now
WHERE {part:step_proofs};

-- name: insert_step_or_fail
-- A db_writes step's record, first in its transaction, written only while every proof holds
-- (step_proofs), and not over a record of the step already there; it returns the row it wrote,
-- and the driver stops the write (before the step's statements) when there is none.
INSERT OR IGNORE INTO steps (operation_key, name, result, fence, created_at)
SELECT :key, :name, :result, :fence, :now
WHERE {part:step_proofs}
RETURNING 1 AS proven;

-- name: lease_holder_alive
-- Is the operation's current claimant still alive (its lease unexpired)?
SELECT 1 FROM jobs
WHERE lease_token = :owner_lease AND status = 'running' AND available_at > :now;

-- name: guard_state
-- Everything a guarded write must prove, in one round trip: lease current, newest fence issued
-- for the resource and for the concurrency slot, whether this lease holds the operation's claim,
-- and (for a db_step) the step's stored result if it already ran.
SELECT
    (SELECT 1 FROM jobs
     WHERE id = :job_id AND lease_token = :lease_token AND status = 'running') AS lease_ok,
    (SELECT fence FROM locks WHERE resource = :resource) AS fence,
    (SELECT fence FROM slots WHERE key = :slot_key AND slot = :slot) AS slot_fence,
    (SELECT 1 FROM operations WHERE key = :key AND owner_lease = :lease_token) AS claim_ok,
    (SELECT result FROM steps WHERE operation_key = :key AND name = :step) AS step_result;

-- name: any_ready
-- A cheap read-only look before taking the write lock for a fetch.
SELECT 1 FROM jobs
WHERE queue IN (SELECT value FROM json_each(:queues)) AND status IN ('queued', 'running') AND available_at <= :now
  AND NOT EXISTS (SELECT 1 FROM paused_queues p WHERE p.queue = jobs.queue)
LIMIT 1;

-- name: prunable_jobs
-- Completed jobs finished before :cutoff whose dedup window is over too (so pruning never lets a
-- duplicate in). Operation records and steps are kept: they are what makes a late duplicate
-- "already processed".
SELECT id FROM jobs
WHERE status = 'completed' AND finished_at < :cutoff AND finished_at + dedup_window_s <= :now
ORDER BY id LIMIT :limit;

-- name: prune_attempts
DELETE FROM attempts WHERE job_id IN (SELECT value FROM json_each(:ids));

-- name: prune_jobs
DELETE FROM jobs WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'completed';

-- Operator views (dashboard and metrics exporter). Each is bounded: live jobs through the
-- jobs_ready index, dead jobs through jobs_dead, recent attempts by id.

-- name: queue_backlog
SELECT queue,
       sum(CASE WHEN status = 'queued' AND available_at <= :now THEN 1 ELSE 0 END) AS ready,
       sum(CASE WHEN status = 'queued' AND available_at > :now THEN 1 ELSE 0 END) AS scheduled,
       min(CASE WHEN status = 'queued' AND available_at <= :now THEN run_at END) AS oldest_ready_at
FROM jobs WHERE status IN ('queued', 'running') GROUP BY queue;

-- name: queue_running
SELECT j.queue, count(*) AS running, min(a.started_at) AS oldest_running_since,
       min(j.visibility_timeout_s) AS shortest_lease_s
FROM jobs j JOIN attempts a ON a.lease_token = j.lease_token
WHERE j.status = 'running' GROUP BY j.queue;

-- name: queue_dead
SELECT queue, count(*) AS dead FROM jobs WHERE status = 'dead' GROUP BY queue;

-- name: find_jobs
SELECT * FROM jobs
WHERE (:status IS NULL OR status = :status) AND (:queue IS NULL OR queue = :queue)
  AND (:task IS NULL OR task = :task)
ORDER BY id DESC LIMIT :limit OFFSET :offset;

-- name: outcome_timeline
SELECT CAST((ended_at - :since) / :bucket_s AS INTEGER) AS bucket, outcome, count(*) AS n
FROM attempts
WHERE id > (SELECT coalesce(max(id), 0) FROM attempts) - :window
  AND ended_at >= :since AND outcome != 'running'
GROUP BY bucket, outcome ORDER BY bucket, outcome;

-- name: insert_audit
INSERT INTO audit (at, actor, action, target, detail)
VALUES (:now, :actor, :action, :target, :detail);

-- name: audit_trail
SELECT * FROM audit ORDER BY id DESC LIMIT :limit;
-- name: schedule_states
SELECT * FROM schedules ORDER BY name;

-- name: insert_schedule
-- The first scheduler to see a schedule creates its row; a concurrent one changes nothing.
INSERT INTO schedules (name, cursor, updated_at) VALUES (:name, :cursor, :now)
ON CONFLICT (name) DO NOTHING;

-- name: advance_schedule
-- Compare-and-set: only the scheduler that read the current cursor moves it.
UPDATE schedules SET cursor = :cursor, updated_at = :now
WHERE name = :name AND cursor = :expected;

-- name: record_schedule_job
UPDATE schedules SET last_tick = :tick, last_job_id = :job_id WHERE name = :name;

-- Paused queues. A pause is a row; it takes effect when committed, and is then stamped with the
-- time (so no lease of the queue is granted after paused_at). Resume deletes the row.

-- name: pause_queue
INSERT INTO paused_queues (queue, paused_at, paused_by) VALUES (:queue, :now, :actor)
ON CONFLICT (queue) DO NOTHING
RETURNING queue;

-- name: stamp_pause
UPDATE paused_queues SET paused_at = :now WHERE queue = :queue AND paused_by = :actor;

-- name: resume_queue
DELETE FROM paused_queues WHERE queue = :queue RETURNING queue;

-- name: paused_queues
SELECT queue, paused_at, paused_by FROM paused_queues ORDER BY queue;

-- Bulk DLQ actions (#17): the selection of a DeadFilter, in id order from a cursor.

-- name: dead_selection
SELECT * FROM jobs
WHERE status = 'dead' AND id > :after_id
  AND (:task IS NULL OR task = :task) AND (:queue IS NULL OR queue = :queue)
  AND (:code IS NULL OR dead_code = :code)
  AND (:since IS NULL OR finished_at >= :since) AND (:until IS NULL OR finished_at < :until)
ORDER BY id LIMIT :limit;

-- name: count_dead_selection
SELECT count(*) AS n FROM jobs
WHERE status = 'dead'
  AND (:task IS NULL OR task = :task) AND (:queue IS NULL OR queue = :queue)
  AND (:code IS NULL OR dead_code = :code)
  AND (:since IS NULL OR finished_at >= :since) AND (:until IS NULL OR finished_at < :until);

-- name: count_dead_held
-- What a replay in id order would leave dead: a live job holds the dedup key (as in
-- live_dedup_job), or an earlier dead job of the same selection does, replayed first.
SELECT count(*) AS n FROM jobs AS d
WHERE d.status = 'dead' AND d.dedup_key IS NOT NULL
  AND (:task IS NULL OR d.task = :task) AND (:queue IS NULL OR d.queue = :queue)
  AND (:code IS NULL OR d.dead_code = :code)
  AND (:since IS NULL OR d.finished_at >= :since) AND (:until IS NULL OR d.finished_at < :until)
  AND (EXISTS (SELECT 1 FROM jobs AS l
               WHERE l.dedup_key = d.dedup_key
                 AND (l.status IN ('queued', 'running')
                      OR (l.status = 'completed' AND l.finished_at + l.dedup_window_s > :now)))
       OR EXISTS (SELECT 1 FROM jobs AS e
                  WHERE e.dedup_key = d.dedup_key AND e.status = 'dead' AND e.id < d.id
                    AND (:task IS NULL OR e.task = :task) AND (:queue IS NULL OR e.queue = :queue)
                    AND (:code IS NULL OR e.dead_code = :code)
                    AND (:since IS NULL OR e.finished_at >= :since)
                    AND (:until IS NULL OR e.finished_at < :until)));

-- name: purge_dead_attempts
DELETE FROM attempts WHERE job_id IN (SELECT value FROM json_each(:ids))
  AND job_id IN (SELECT id FROM jobs WHERE status = 'dead');

-- name: purge_dead_jobs
DELETE FROM jobs WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'dead';

-- name: host_job
-- The newest shadow job of a host queue's operation, whatever its state (jobguard.hosts).
SELECT * FROM jobs WHERE dedup_key = :dedup_key ORDER BY id DESC LIMIT 1;


-- name: retake_host_job
-- A deduplicated send takes over a shadow job left due with no delivery (its message was never
-- sent, or lost): the new message's id in its headers, due from now. Callers hold the key's
-- dedup lock; due_before makes it a no-op on a job a delivery moved meanwhile.
UPDATE jobs SET headers = :headers, available_at = :now
WHERE id = :id AND status IN ('queued', 'running') AND available_at <= :due_before
RETURNING *;

