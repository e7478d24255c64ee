-- Named queries of the PostgreSQL backend. Each "-- name:" starts one statement.
-- Every statement that changes a delivery names its lease token in the WHERE clause.
-- A list of items (%(items)s, one jsonb) is taken by the planner for 100 rows, so joined to a
-- table it may be planned as a scan of the whole table, whose cost grows with the queue's
-- history. Each statement therefore reads its rows by key: "col = ANY (ARRAY(<the items'
-- keys>))" gives the table's primary-key index the keys to look up. But a prepared statement
-- keeps the plan it was given while the tables were small (a new store), and there a list of
-- keys costs more by the index than a scan of the small table: the fetch of new jobs therefore
-- probes operations with one sub-query per item.
-- {store_now} is the store clock a statement is given as %(now)s (a test's injected clock), or
-- when that is NULL the server's clock_timestamp(), read by the statement itself.

-- name: job_by_id
SELECT * FROM {schema}.jobs WHERE id = %(id)s;

-- name: job_by_id_for_update
SELECT * FROM {schema}.jobs WHERE id = %(id)s FOR UPDATE;

-- name: count_by_status
SELECT status, count(*) AS n FROM {schema}.jobs GROUP BY status;

-- name: live_dedup_job
-- A job holds its dedup key while queued or running, and for dedup_window_s after completion.
SELECT * FROM {schema}.jobs
WHERE dedup_key = %(dedup_key)s
  AND (status IN ('queued', 'running')
       OR (status = 'completed' AND finished_at + dedup_window_s > %(now)s))
ORDER BY id DESC LIMIT 1;

-- name: lock_dedup_key
-- Enqueues of one dedup key take turns until their transaction ends, so the check for a live
-- holder and the insert cannot interleave (the first key of the pair keeps jobguard's locks apart
-- from the application's own advisory locks).
SELECT pg_advisory_xact_lock(hashtext('jobguard.dedup'), hashtext(%(dedup_key)s));

-- name: count_dedup_hit
-- A count stops at its column's largest value (see lease_jobs).
UPDATE {schema}.jobs SET dedup_hits = least(dedup_hits + 1::bigint, 2147483647) WHERE id = %(id)s;

-- name: insert_job
-- Created at %(now)s (NULL: the server's clock, read by the statement, so that a fetch after
-- the commit, judging on that clock, finds a job due now ready) and due %(delay_s)s later.
INSERT INTO {schema}.jobs (task, queue, payload, status, priority, available_at, run_at, max_attempts,
                  visibility_timeout_s, operation_key, resource_key, lock_ttl_s, dedup_key,
                  dedup_window_s, headers, soft_time_limit_s, time_limit_s, concurrency_key,
                  concurrency_limit, created_at)
SELECT %(task)s, %(queue)s, %(payload)s, 'queued', %(priority)s, clock.now + %(delay_s)s::float8,
       clock.now + %(delay_s)s::float8, %(max_attempts)s, %(visibility_timeout_s)s,
       %(operation_key)s, %(resource_key)s, %(lock_ttl_s)s, %(dedup_key)s, %(dedup_window_s)s,
       %(headers)s, %(soft_time_limit_s)s, %(time_limit_s)s, %(concurrency_key)s,
       %(concurrency_limit)s, clock.now
FROM (SELECT {store_now} AS now) AS clock
RETURNING *, pg_notify({channel}, queue)::text AS notified;

-- name: close_lost_attempts
-- A lost delivery never reported its counts: the steps it ran are those of its operation
-- recorded since it started (a later delivery has not run yet: this closes it at the takeover).
UPDATE {schema}.attempts SET outcome = 'lost', ended_at = %(now)s,
    steps_run = (SELECT count(*) FROM {schema}.steps
                 WHERE steps.operation_key = attempts.operation_key
                   AND steps.created_at >= attempts.started_at)
WHERE lease_token = ANY(%(tokens)s::text[]) AND outcome = 'running';

-- name: bury_lost
-- A job whose last allowed delivery never reported back (its worker died): attempts are charged
-- at delivery, so it goes to the dead letter queue instead of looping forever. The reason is a
-- code; its words are made above the store.
UPDATE {schema}.jobs
SET status = 'dead', available_at = NULL, lease_token = NULL, finished_at = %(now)s,
    dead_code = %(code)s, dead_reason = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'running';

-- name: lease_jobs
-- %(lease_s)s and %(max_attempts)s are the fetching worker's lease and attempt limit for these
-- jobs' task (NULL: the stored ones); the limit it enforces is the one the row then shows.
-- Each count jobguard adds to stops at its column's largest value: one stored there (by hand)
-- would otherwise fail the statement ("integer out of range"), and with it every fetch of the
-- queue. Such a job runs with no attempt left after this one.
UPDATE {schema}.jobs
SET status = 'running', attempts = least(attempts + 1::bigint, 2147483647),
    worker_id = %(worker_id)s,
    lease_token = replace(gen_random_uuid()::text, '-', ''),
    available_at = %(now)s + coalesce(%(lease_s)s::float8, visibility_timeout_s),
    max_attempts = coalesce(%(max_attempts)s::integer, max_attempts)
WHERE id = ANY(%(ids)s::bigint[])
RETURNING *, coalesce(%(lease_s)s::float8, visibility_timeout_s) AS lease_s;

-- name: insert_attempts
-- The attempts of deliveries just leased and begun (%(items)s: job_id, lock_owner, fence), each
-- with the lock its begin granted: the row is written once here, not marked afterwards.
INSERT INTO {schema}.attempts (job_id, attempt, task, queue, operation_key, worker_id, lease_token,
                      lock_owner, fence, started_at, host_delivery)
SELECT j.id, j.attempts, j.task, j.queue, j.operation_key, j.worker_id, j.lease_token,
       item.lock_owner, item.fence, %(now)s, %(host)s::text
FROM jsonb_to_recordset(%(items)s::jsonb) AS item(job_id bigint, lock_owner text, fence bigint)
JOIN {schema}.jobs AS j ON j.id = item.job_id
WHERE j.id = ANY (ARRAY(SELECT (jsonb_array_elements(%(items)s::jsonb) ->> 'job_id')::bigint))
RETURNING id, job_id;

-- name: extend_leases
-- The leases still held extended (%(items)s: job_id, lease_token, visibility_timeout_s) from
-- the store clock: %(now)s, or the server's own when the caller did not ask for it (NULL), so
-- a renewal is one statement and one round trip. Returns the leases it extended, each
-- with who asked to cancel its job, if anyone did (its worker then tells the run).
UPDATE {schema}.jobs AS j
SET available_at = {store_now}
                   + item.visibility_timeout_s
FROM jsonb_to_recordset(%(items)s::jsonb)
     AS item(job_id bigint, lease_token text, visibility_timeout_s float8)
WHERE j.id = item.job_id AND j.lease_token = item.lease_token AND j.status = 'running'
  AND j.id = ANY (ARRAY(SELECT (jsonb_array_elements(%(items)s::jsonb) ->> 'job_id')::bigint))
RETURNING j.id, j.lease_token, j.cancel_requested_by;

-- name: settle_set
-- How deliveries end, many at once, in one statement for the batch (SQLite, which cannot write
-- inside WITH, runs settle_jobs and the statements after it instead). Each item (%(items)s)
-- moves its job only with every proof in place: the lease, and for a success the newest fence
-- of its lock (resource, fence) and of its concurrency slot (slot_key, slot, slot_fence) and
-- the operation's claim (key). status 'completed' finishes the job, 'dead' buries it, 'queued'
-- requeues it after delay_s (NULL: now, keeping its run_at); uncharge hands the attempt back.
-- Only an item whose job moved then frees its lock (held_resource, held_owner) and slot
-- (held_slot_key, held_slot, held_slot_owner), moves its operation (op_key: to op_status, a
-- success with op_result, op_external_ref, op_fence; a dropped claim keeping its last error
-- unless op_last_error) and, with close, closes its attempt row (attempt_*). Rows are taken
-- in the order a fetch's begin takes them: jobs, locks, slots, operations (each waits, through
-- an uncorrelated sub-query, for the one before to finish), then attempts. Returns the moved
-- job ids and how many operations it completed. %(now)s NULL: the server's clock, read by the
-- statement itself (as extend_leases does), so settling needs no reading of its own. With
-- %(strict)s, a moved success whose operation it could not complete (its claim taken between
-- the proof and the write) fails the statement instead, so that, run on its own outside a
-- transaction, it writes nothing: the cast of a text that is no number is the one way plain SQL
-- has to raise.
WITH clock AS (
         SELECT {store_now} AS now),
     item AS (
         SELECT * FROM jsonb_to_recordset(%(items)s::jsonb)
             AS item(job_id bigint, lease_token text, resource text, fence bigint,
                     slot_key text, slot integer, slot_fence bigint, key text, status text,
                     delay_s float8, uncharge integer, deferral integer, set_error boolean,
                     last_error text, set_signature boolean, error_signature text,
                     same_error_count integer, code text, reason text,
                     held_resource text, held_owner text,
                     held_slot_key text, held_slot integer, held_slot_owner text,
                     op_key text, op_status text, op_result text, op_external_ref text,
                     op_fence bigint, op_last_error text,
                     close boolean, attempt_attempt_id bigint, attempt_outcome text,
                     attempt_duration_s float8, attempt_error_type text,
                     attempt_error_message text, attempt_traceback text,
                     attempt_lock_owner text, attempt_fence bigint, attempt_steps_run integer,
                     attempt_steps_skipped integer)),
     -- Each item's proofs, read once: a filter on item inside moved's join is run again for
     -- every job row the join pairs the item with (batch x batch primary-key reads). Each
     -- proof reads one row by its primary key (an EXISTS may be planned as a hash of the
     -- whole table).
     proven AS MATERIALIZED (
         SELECT item.*,
                (item.resource IS NULL
                 OR NOT coalesce((SELECT l.fence > item.fence FROM {schema}.locks AS l
                                  WHERE l.resource = item.resource), false))
                AND (item.slot_key IS NULL
                     OR NOT coalesce((SELECT s.fence > item.slot_fence FROM {schema}.slots AS s
                                      WHERE s.key = item.slot_key AND s.slot = item.slot), false))
                AND (item.key IS NULL
                     OR coalesce((SELECT o.owner_lease = item.lease_token
                                  FROM {schema}.operations AS o WHERE o.key = item.key), false))
                    AS holds
         FROM item),
     moved AS (
         UPDATE {schema}.jobs AS j
         SET status = item.status,
             available_at = CASE WHEN item.status = 'queued'
                                 THEN (SELECT now FROM clock) + coalesce(item.delay_s, 0) END,
             run_at = CASE WHEN item.delay_s IS NULL THEN j.run_at
                           ELSE (SELECT now FROM clock) + item.delay_s END,
             lease_token = NULL,
             finished_at = CASE WHEN item.status = 'queued' THEN j.finished_at
                                ELSE (SELECT now FROM clock) END,
             attempts = j.attempts - item.uncharge,
             deferrals = least(j.deferrals + item.deferral::bigint, 2147483647),
             last_error = CASE WHEN item.set_error THEN item.last_error ELSE j.last_error END,
             error_signature = CASE WHEN item.set_signature THEN item.error_signature
                                    ELSE j.error_signature END,
             same_error_count = CASE WHEN item.set_signature THEN item.same_error_count
                                     ELSE j.same_error_count END,
             dead_code = CASE WHEN item.status = 'dead' THEN item.code ELSE j.dead_code END,
             dead_reason = CASE WHEN item.status = 'dead' THEN item.reason ELSE j.dead_reason END
         FROM proven AS item
         WHERE j.id = item.job_id AND j.lease_token = item.lease_token AND j.status = 'running'
           AND j.id = ANY (ARRAY(SELECT job_id FROM item)) AND item.holds
         RETURNING j.id),
     done AS (SELECT item.* FROM item JOIN moved ON moved.id = item.job_id),
     freed_locks AS (
         UPDATE {schema}.locks AS l SET owner = NULL, expires_at = NULL
         FROM done
         WHERE l.resource = done.held_resource AND l.owner = done.held_owner
         RETURNING l.resource),
     freed_slots AS (
         UPDATE {schema}.slots AS s SET owner = NULL, expires_at = NULL
         FROM done
         WHERE (SELECT count(*) FROM freed_locks) >= 0
           AND s.key = done.held_slot_key AND s.slot = done.held_slot
           AND s.owner = done.held_slot_owner
         RETURNING s.key),
     operated AS (
         UPDATE {schema}.operations AS o
         SET status = done.op_status,
             result = CASE WHEN done.op_status = 'completed' THEN done.op_result
                           ELSE o.result END,
             external_ref = CASE WHEN done.op_status = 'completed' THEN done.op_external_ref
                                 ELSE o.external_ref END,
             fence = CASE WHEN done.op_status = 'completed' THEN done.op_fence ELSE o.fence END,
             completed_at = CASE WHEN done.op_status = 'completed' THEN (SELECT now FROM clock)
                                 ELSE o.completed_at END,
             last_error = CASE WHEN done.op_status = 'completed' THEN NULL
                               ELSE coalesce(done.op_last_error, o.last_error) END,
             owner_lease = NULL, updated_at = (SELECT now FROM clock)
         FROM done
         WHERE (SELECT count(*) FROM freed_slots) >= 0
           AND o.key = done.op_key AND o.owner_lease = done.lease_token
           AND o.status = 'processing'
         RETURNING o.status),
     closed AS (
         UPDATE {schema}.attempts AS a
         SET outcome = done.attempt_outcome, ended_at = (SELECT now FROM clock),
             duration_s = done.attempt_duration_s,
             error_type = done.attempt_error_type, error_message = done.attempt_error_message,
             traceback = done.attempt_traceback, lock_owner = done.attempt_lock_owner,
             fence = done.attempt_fence, steps_run = done.attempt_steps_run,
             steps_skipped = done.attempt_steps_skipped
         FROM done
         WHERE done.close AND a.id = done.attempt_attempt_id
         RETURNING a.id),
     counted AS (
         SELECT (SELECT count(*) FROM operated WHERE status = 'completed') AS completed,
                (SELECT count(*) FROM done WHERE op_status = 'completed') AS completing)
SELECT (SELECT coalesce(array_agg(id), '{{}}') FROM moved) AS moved,
       CASE WHEN NOT %(strict)s::boolean OR completed = completing THEN completed
            ELSE ('settle_set: an operation claim was taken while settling: completed '
                  || completed || ' of ' || completing)::bigint END AS completed,
       (SELECT count(*) FROM closed) AS closed
FROM counted;

-- name: mark_attempts
-- Record on stale deliveries' own attempt rows that their writes were refused (diagnostics
-- only; %(items)s: attempt_id, outcome, duration_s, error_type, error_message, steps_run,
-- steps_skipped). An attempt already closed (as lost, by the fetch that took the job over)
-- keeps when it ended.
UPDATE {schema}.attempts AS a
SET outcome = item.outcome, ended_at = coalesce(a.ended_at, %(now)s),
    duration_s = coalesce(a.duration_s, item.duration_s),
    error_type = item.error_type, error_message = item.error_message,
    steps_run = greatest(a.steps_run, item.steps_run),
    steps_skipped = greatest(a.steps_skipped, item.steps_skipped)
FROM jsonb_to_recordset(%(items)s::jsonb)
     AS item(attempt_id bigint, outcome text, duration_s float8, error_type text,
             error_message text, steps_run integer, steps_skipped integer)
WHERE a.id = item.attempt_id
  AND a.id = ANY (ARRAY(SELECT (jsonb_array_elements(%(items)s::jsonb) ->> 'attempt_id')::bigint));

-- name: release_locks
-- release_lock for many (%(items)s: resource, owner).
UPDATE {schema}.locks AS l SET owner = NULL, expires_at = NULL
FROM jsonb_to_recordset(%(items)s::jsonb) AS item(resource text, owner text)
WHERE l.resource = item.resource AND l.owner = item.owner
  AND l.resource = ANY (ARRAY(SELECT (jsonb_array_elements(%(items)s::jsonb) ->> 'resource')));

-- name: cancel_job
-- A cancel (#17): a queued job is buried as cancelled (code, reason); a running one only
-- records the request, which its worker reads with each renewal. The first request is kept.
UPDATE {schema}.jobs
SET status = CASE WHEN status = 'queued' THEN 'dead' ELSE status END,
    available_at = CASE WHEN status = 'queued' THEN NULL ELSE available_at END,
    finished_at = CASE WHEN status = 'queued' THEN %(now)s ELSE finished_at END,
    dead_code = CASE WHEN status = 'queued' THEN %(code)s ELSE dead_code END,
    dead_reason = CASE WHEN status = 'queued' THEN %(reason)s ELSE dead_reason END,
    cancel_requested_at = coalesce(cancel_requested_at, %(now)s),
    cancel_requested_by = coalesce(cancel_requested_by, %(actor)s)
WHERE id = %(job_id)s AND status IN ('queued', 'running')
RETURNING *;

-- name: dead_jobs
SELECT * FROM {schema}.jobs WHERE status = 'dead' ORDER BY finished_at DESC, id DESC LIMIT %(limit)s;

-- name: retry_now
-- A queued job waiting for its run time (a retry's backoff, a delay, a busy lock) is due now;
-- nothing else of it changes. No row: it is not queued, or already due. %(now)s NULL: now on
-- the server's clock, read by the statement (as insert_job stamps a job due now).
UPDATE {schema}.jobs AS j SET available_at = due.at, run_at = due.at
FROM (SELECT {store_now} AS at) AS due
WHERE j.id = %(job_id)s AND j.status = 'queued' AND j.available_at > due.at
RETURNING j.*;

-- name: replay_job
-- Back to the queue with the same id, payload and keys (its operation key is kept, so completed
-- work is not redone), due now (%(now)s NULL: on the server's clock, as in retry_now).
UPDATE {schema}.jobs AS j
SET status = 'queued', available_at = due.at, run_at = due.at, attempts = 0, deferrals = 0,
    same_error_count = 0, error_signature = NULL, dead_code = NULL, dead_reason = NULL,
    finished_at = NULL, cancel_requested_at = NULL, cancel_requested_by = NULL
FROM (SELECT {store_now} AS at) AS due
WHERE j.id = %(job_id)s AND j.status = 'dead'
RETURNING j.*;

-- name: purge_attempts
DELETE FROM {schema}.attempts
WHERE job_id IN (SELECT id FROM {schema}.jobs WHERE status = 'dead'
                 AND (%(job_id)s::bigint IS NULL OR id = %(job_id)s::bigint));

-- name: purge_jobs
DELETE FROM {schema}.jobs WHERE status = 'dead' AND (%(job_id)s::bigint IS NULL OR id = %(job_id)s::bigint);

-- name: attempts_of_job
SELECT * FROM {schema}.attempts WHERE job_id = %(job_id)s ORDER BY id;

-- name: attempts_of_operation
SELECT * FROM {schema}.attempts WHERE operation_key = %(operation_key)s ORDER BY id;

-- name: recent_attempts
SELECT * FROM {schema}.attempts ORDER BY id DESC LIMIT %(limit)s;

-- name: lock_row
SELECT resource, owner, fence, expires_at FROM {schema}.locks WHERE resource = %(resource)s;

-- name: grant_locks
-- grant_lock for many distinct resources (%(items)s: resource, owner, expires_at), in resource
-- order so that two workers granting overlapping sets do not deadlock; byte order (COLLATE "C"),
-- the order the store sorts one-by-one begins in, whatever the database's collation. Returns the
-- granted ones. A lock whose fence is at bigint's largest value (written by hand) is never granted
-- again, here or in the statements that grant as this one does: a fence must grow, and its job
-- waits as for a busy lock (buried as waited after max_defer_s) instead of failing the fetch.
INSERT INTO {schema}.locks (resource, owner, fence, expires_at)
SELECT item.resource, item.owner, 1, item.expires_at
FROM jsonb_to_recordset(%(items)s::jsonb) AS item(resource text, owner text, expires_at float8)
ORDER BY item.resource COLLATE "C"
ON CONFLICT (resource) DO UPDATE
SET owner = excluded.owner, fence = locks.fence + 1, expires_at = excluded.expires_at
WHERE (locks.owner IS NULL OR locks.expires_at <= %(now)s) AND locks.fence < 9223372036854775807
RETURNING resource, fence;

-- name: begin_batch
-- A fetched batch's begin in one statement, for deliveries that ask for distinct resources and
-- operations and no concurrency slot (%(items)s: job_id, and, if it asks, resource, owner and
-- expires_at of its lock, key of its operation): every lock granted as grant_locks grants (in
-- resource order), then every new operation inserted and claimed as insert_operations inserts
-- (in key order, once every lock row is taken: the order a finish takes rows in), for a
-- delivery whose lock was granted or that asks for none, then every attempt row written as
-- insert_attempts writes it, with the lock it was granted (%(host)s: a host queue's delivery).
-- Per item: the fence granted (NULL: the lock is busy, or none was asked for), its attempt
-- row's id, and whether its operation row was inserted here (claimed: the row is then the one
-- the statement wrote, known to the caller; an operation already recorded is claimed, or found
-- busy, one at a time afterwards).
WITH item AS (
         SELECT * FROM ROWS FROM (jsonb_to_recordset(%(items)s::jsonb)
                                  AS (job_id bigint, resource text, owner text,
                                      expires_at float8, key text))
             WITH ORDINALITY AS item(job_id, resource, owner, expires_at, key, n)),
     granted AS (
         INSERT INTO {schema}.locks (resource, owner, fence, expires_at)
         SELECT item.resource, item.owner, 1, item.expires_at
         FROM item
         WHERE item.resource IS NOT NULL
         ORDER BY item.resource COLLATE "C"
         ON CONFLICT (resource) DO UPDATE
         SET owner = excluded.owner, fence = locks.fence + 1, expires_at = excluded.expires_at
         WHERE (locks.owner IS NULL OR locks.expires_at <= %(now)s) AND locks.fence < 9223372036854775807
         RETURNING resource, owner, fence),
     claimed AS (
         INSERT INTO {schema}.operations (key, status, resource_key, owner_lease, attempts, fence,
                                          created_at, updated_at)
         SELECT item.key, 'processing', item.resource, j.lease_token, 1, granted.fence,
                %(now)s, %(now)s
         FROM item JOIN {schema}.jobs AS j ON j.id = item.job_id
              LEFT JOIN granted ON granted.resource = item.resource
         WHERE (SELECT count(*) FROM granted) >= 0
           AND j.id = ANY (ARRAY(SELECT job_id FROM item))
           AND item.key IS NOT NULL AND (item.resource IS NULL OR granted.resource IS NOT NULL)
         ORDER BY item.key COLLATE "C"
         ON CONFLICT (key) DO NOTHING
         RETURNING key),  -- whether each was inserted: its row is known
     attempt AS (
         INSERT INTO {schema}.attempts (job_id, attempt, task, queue, operation_key, worker_id,
                                        lease_token, lock_owner, fence, started_at,
                                        host_delivery)
         SELECT j.id, j.attempts, j.task, j.queue, j.operation_key, j.worker_id, j.lease_token,
                granted.owner, granted.fence, %(now)s, %(host)s::text
         FROM item JOIN {schema}.jobs AS j ON j.id = item.job_id
              LEFT JOIN granted ON granted.resource = item.resource
         WHERE j.id = ANY (ARRAY(SELECT job_id FROM item))
         ORDER BY item.n  -- attempt ids in the batch's order, as insert_attempts gives them
         RETURNING id, job_id)
SELECT item.job_id, granted.fence, attempt.id AS attempt_id, claimed.key IS NOT NULL AS claimed
FROM item JOIN attempt ON attempt.job_id = item.job_id
     LEFT JOIN granted ON granted.resource = item.resource
     LEFT JOIN claimed ON claimed.key = item.key;

-- part: fetched_columns
-- The columns of a jobs row (j) that a fetch reads: what a delivery is made of (rows.delivery),
-- and what lease_and_begin reads itself (priority: its order of rows; worker_id: the attempt
-- row) or the fetch's transaction reads of a lease that expired (status). Not the rest: every
-- column sent is formatted by the server and parsed by the worker, once a job fetched.
j.id, j.task, j.queue, j.payload, j.status, j.priority, j.attempts, j.max_attempts, j.deferrals,
j.created_at, j.lease_token, j.worker_id, j.available_at, j.visibility_timeout_s,
j.operation_key, j.resource_key, j.lock_ttl_s, j.error_signature, j.same_error_count, j.headers,
j.soft_time_limit_s, j.time_limit_s, j.cancel_requested_by, j.concurrency_key,
j.concurrency_limit

-- name: lease_and_begin
-- A fetch's pick and lease of one queue in one statement, and with %(begin)s its begin too. The
-- queue's ready jobs are taken: queued ones whose time has come, and running ones whose lease
-- expired (a crashed or stalled worker; both are available_at <= now; nothing of a paused queue,
-- the one place a pause acts). %(rules)s: each task's task, lease_s, max_attempts and
-- lock_ttl_s (a task not named keeps its rows' lease and limit, and asks for nothing: the
-- worker does not know it).
-- Without %(begin)s (inside the fetch's transaction): the queued ones leased at once, as
-- lease_jobs leases; the expired ones come back as they were, leased false: their lost attempts
-- are closed (or the job buried) before lease_jobs leases them.
-- With %(begin)s (run on its own, autocommit), for a batch that needs nothing more (every job
-- picked queued, none asking for a concurrency slot, no two for the same resource or the same
-- operation, none for an operation recorded already): the jobs leased, then begun as
-- begin_batch begins them, in its order of rows (locks in resource order, then operations in
-- key order once every lock row is taken, then attempt rows with the locks they got), each
-- lock's owner the worker's id and a random part. The operations are a plain INSERT: one
-- recorded meanwhile fails the statement, and nothing of it is written. Any other batch
-- (fast_fit false): nothing is written, and the fetch takes its transaction.
-- First columns: fast_picked (jobs picked), fast_fit (begun here), fast_now (the store clock
-- used; %(now)s NULL: the server's); then the jobs in the order picked, or one row whose other
-- columns are NULL when there is none to return.
WITH clock AS (
         SELECT {store_now} AS now),
     picked AS (
         SELECT id, task, status, priority, available_at AS due, resource_key, operation_key,
                concurrency_key, concurrency_limit
         FROM {schema}.jobs
         WHERE queue = %(queue)s AND status IN ('queued', 'running')
           AND available_at <= (SELECT now FROM clock)
           AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queues WHERE queue = %(queue)s)
         ORDER BY priority DESC, available_at, id
         LIMIT %(limit)s
         FOR UPDATE SKIP LOCKED),
     rule AS (
         SELECT * FROM jsonb_to_recordset(%(rules)s::jsonb)
             AS rule(task text, lease_s float8, max_attempts integer, lock_ttl_s float8)),
     item AS MATERIALIZED (
         SELECT picked.*, rule.task IS NOT NULL AS known, rule.lease_s,
                rule.max_attempts AS rule_max_attempts, rule.lock_ttl_s AS rule_lock_ttl_s,
                CASE WHEN rule.task IS NOT NULL THEN picked.resource_key END AS resource,
                CASE WHEN rule.task IS NOT NULL THEN picked.operation_key END AS key,
                %(worker_id)s || '/' || left(replace(gen_random_uuid()::text, '-', ''), 16)
                    AS owner
         FROM picked LEFT JOIN rule ON rule.task = picked.task),
     fit AS (
         SELECT count(*) AS picked,
                %(begin)s::boolean AND count(*) > 0 AND bool_and(status = 'queued')
                AND NOT bool_or(known AND concurrency_key IS NOT NULL
                                AND concurrency_limit IS NOT NULL)
                AND count(resource) = count(DISTINCT resource)
                AND count(key) = count(DISTINCT key)
                -- One primary-key probe per item: an "= ANY" of the batch's keys is planned
                -- as a scan of the whole table while it is small, and a statement's cached
                -- plan then keeps that scan as the table grows.
                AND NOT coalesce(bool_or((SELECT true FROM {schema}.operations AS o
                                          WHERE o.key = item.key)), false) AS ok
         FROM item),
     leased AS (
         UPDATE {schema}.jobs AS j
         SET status = 'running', attempts = least(j.attempts + 1::bigint, 2147483647),
             worker_id = %(worker_id)s,
             lease_token = replace(gen_random_uuid()::text, '-', ''),
             available_at = (SELECT now FROM clock) + coalesce(item.lease_s, j.visibility_timeout_s),
             max_attempts = coalesce(item.rule_max_attempts, j.max_attempts)
         FROM item
         WHERE j.id = item.id AND item.status = 'queued'
           AND (NOT %(begin)s::boolean OR (SELECT ok FROM fit))
         RETURNING {part:fetched_columns},
                   coalesce(item.lease_s, j.visibility_timeout_s) AS lease_s, item.due,
                   item.resource AS wanted_resource, item.key AS wanted_key,
                   item.owner AS lock_owner, item.rule_lock_ttl_s),
     granted AS (
         INSERT INTO {schema}.locks (resource, owner, fence, expires_at)
         SELECT wanted_resource, lock_owner, 1, (SELECT now FROM clock) + rule_lock_ttl_s
         FROM leased
         WHERE wanted_resource IS NOT NULL AND (SELECT ok FROM fit)
         ORDER BY wanted_resource COLLATE "C"
         ON CONFLICT (resource) DO UPDATE
         SET owner = excluded.owner, fence = locks.fence + 1, expires_at = excluded.expires_at
         WHERE (locks.owner IS NULL OR locks.expires_at <= (SELECT now FROM clock)) AND locks.fence < 9223372036854775807
         RETURNING resource, owner, fence),
     claimed AS (
         INSERT INTO {schema}.operations (key, status, resource_key, owner_lease, attempts, fence,
                                          created_at, updated_at)
         SELECT l.wanted_key, 'processing', l.wanted_resource, l.lease_token, 1, granted.fence,
                (SELECT now FROM clock), (SELECT now FROM clock)
         FROM leased AS l LEFT JOIN granted ON granted.resource = l.wanted_resource
         WHERE (SELECT count(*) FROM granted) >= 0 AND (SELECT ok FROM fit)
           AND l.wanted_key IS NOT NULL
           AND (l.wanted_resource IS NULL OR granted.resource IS NOT NULL)
         ORDER BY l.wanted_key COLLATE "C"
         RETURNING key),  -- whether each was inserted: its row is known
     attempt AS (
         INSERT INTO {schema}.attempts (job_id, attempt, task, queue, operation_key, worker_id,
                                        lease_token, lock_owner, fence, started_at)
         SELECT l.id, l.attempts, l.task, l.queue, l.operation_key, l.worker_id, l.lease_token,
                granted.owner, granted.fence, (SELECT now FROM clock)
         FROM leased AS l LEFT JOIN granted ON granted.resource = l.wanted_resource
         WHERE (SELECT ok FROM fit)
         ORDER BY l.priority DESC, l.due, l.id
         RETURNING id, job_id)
SELECT fit.picked AS fast_picked, fit.ok AS fast_fit, clock.now AS fast_now, taken.*
FROM fit CROSS JOIN clock
     LEFT JOIN (
         SELECT l.*, true AS leased, granted.fence, attempt.id AS attempt_id,
                claimed.key IS NOT NULL AS claimed
         FROM leased AS l LEFT JOIN attempt ON attempt.job_id = l.id
              LEFT JOIN granted ON granted.resource = l.wanted_resource
              LEFT JOIN claimed ON claimed.key = l.wanted_key
         UNION ALL
         SELECT {part:fetched_columns}, NULL::float8, item.due, NULL::text, NULL::text,
                NULL::text, NULL::float8, false, NULL::bigint, NULL::bigint, NULL::boolean
         FROM {schema}.jobs AS j JOIN item ON item.id = j.id
         WHERE item.status = 'running' AND NOT %(begin)s::boolean) AS taken ON true
ORDER BY taken.priority DESC, taken.due, taken.id;

-- name: grant_slots
-- Concurrency slots for many deliveries (%(items)s: key, lim, owner, expires_at, nth): each gets
-- the nth (from 0) free slot of its key among slots 0..lim-1 (free: never held, released or
-- expired), nth distinct per key, in key and slot order (as grant_locks) so that two workers
-- granting slots of one key do not deadlock. A slot taken by another transaction since this one
-- looked is not granted (ON CONFLICT sees the committed row). Returns the granted ones (key,
-- slot, owner, fence): an item whose nth free slot is not below its limit gets none. A slot
-- whose fence is at bigint's largest value is never free again (as a lock's, grant_locks).
WITH item AS (
         SELECT * FROM jsonb_to_recordset(%(items)s::jsonb)
             AS x(key text, lim integer, owner text, expires_at float8, nth integer)),
     wanted AS (SELECT key, max(lim) AS lim FROM item GROUP BY key),
     free AS (
         SELECT w.key, n.slot, row_number() OVER (PARTITION BY w.key ORDER BY n.slot) - 1 AS nth
         FROM wanted AS w CROSS JOIN LATERAL generate_series(0, w.lim - 1) AS n(slot)
              LEFT JOIN {schema}.slots AS s ON s.key = w.key AND s.slot = n.slot
         WHERE (s.key IS NULL OR s.owner IS NULL OR s.expires_at <= %(now)s)
           AND (s.fence IS NULL OR s.fence < 9223372036854775807))
INSERT INTO {schema}.slots (key, slot, owner, fence, expires_at)
SELECT free.key, free.slot, item.owner, 1, item.expires_at
FROM item JOIN free ON free.key = item.key AND free.nth = item.nth
WHERE free.slot < item.lim
ORDER BY free.key COLLATE "C", free.slot
ON CONFLICT (key, slot) DO UPDATE
SET owner = excluded.owner, fence = slots.fence + 1, expires_at = excluded.expires_at
WHERE (slots.owner IS NULL OR slots.expires_at <= %(now)s) AND slots.fence < 9223372036854775807
RETURNING key, slot, owner, fence;

-- name: renew_slots
-- The slots still owned extended (%(items)s: key, slot, owner, ttl_s) from the store clock, as
-- renew_locks. Returns the slots it extended.
UPDATE {schema}.slots AS s
SET expires_at = {store_now}
                 + item.ttl_s
FROM jsonb_to_recordset(%(items)s::jsonb) AS item(key text, slot integer, owner text, ttl_s float8)
WHERE s.key = item.key AND s.slot = item.slot AND s.owner = item.owner
  AND s.key = ANY (ARRAY(SELECT (jsonb_array_elements(%(items)s::jsonb) ->> 'key')))
RETURNING s.key, s.slot, s.owner;

-- name: release_slots
-- The slots of ended deliveries freed, where each owner still holds its slot (%(items)s: key,
-- slot, owner); the fence counter is kept.
UPDATE {schema}.slots AS s SET owner = NULL, expires_at = NULL
FROM jsonb_to_recordset(%(items)s::jsonb) AS item(key text, slot integer, owner text)
WHERE s.key = item.key AND s.slot = item.slot AND s.owner = item.owner
  AND s.key = ANY (ARRAY(SELECT (jsonb_array_elements(%(items)s::jsonb) ->> 'key')));

-- name: slot_rows
SELECT key, slot, owner, fence, expires_at FROM {schema}.slots WHERE key = %(key)s ORDER BY slot;

-- name: attempt_locks
-- attempt_lock for many (%(items)s: attempt_id, lock_owner, fence).
UPDATE {schema}.attempts AS a SET lock_owner = item.lock_owner, fence = item.fence
FROM jsonb_to_recordset(%(items)s::jsonb) AS item(attempt_id bigint, lock_owner text, fence bigint)
WHERE a.id = item.attempt_id
  AND a.id = ANY (ARRAY(SELECT (jsonb_array_elements(%(items)s::jsonb) ->> 'attempt_id')::bigint));

-- name: insert_operations
-- insert_operation for many distinct keys (%(items)s: key, resource_key, owner_lease, fence), in
-- key order (byte order, as grant_locks); returns the keys it inserted (keys already recorded
-- are left alone).
INSERT INTO {schema}.operations (key, status, resource_key, owner_lease, attempts, fence,
                                 created_at, updated_at)
SELECT item.key, 'processing', item.resource_key, item.owner_lease, 1, item.fence, %(now)s, %(now)s
FROM jsonb_to_recordset(%(items)s::jsonb)
     AS item(key text, resource_key text, owner_lease text, fence bigint)
ORDER BY item.key COLLATE "C"
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: renew_locks
-- The locks still owned extended (%(items)s: resource, owner, ttl_s) from the store clock, as
-- extend_leases. Returns the locks it extended.
UPDATE {schema}.locks AS l
SET expires_at = {store_now}
                 + item.ttl_s
FROM jsonb_to_recordset(%(items)s::jsonb) AS item(resource text, owner text, ttl_s float8)
WHERE l.resource = item.resource AND l.owner = item.owner
  AND l.resource = ANY (ARRAY(SELECT (jsonb_array_elements(%(items)s::jsonb) ->> 'resource')))
RETURNING l.resource, l.owner;

-- name: operation_row
SELECT * FROM {schema}.operations WHERE key = %(key)s;

-- name: operation_row_for_update
SELECT * FROM {schema}.operations WHERE key = %(key)s FOR UPDATE;

-- name: claim_operation
UPDATE {schema}.operations
SET status = 'processing', owner_lease = %(owner_lease)s,
    attempts = least(attempts + 1::bigint, 2147483647), fence = %(fence)s, updated_at = %(now)s
WHERE key = %(key)s AND status != 'completed'
RETURNING *;

-- name: steps_of_operation
SELECT name, result FROM {schema}.steps WHERE operation_key = %(key)s;

-- part: step_proofs
-- What a step's record proves as it is written, just before its transaction commits: the lease
-- current, no newer fence on the resource's lock (the lock row held FOR SHARE until COMMIT, so
-- a takeover's grant, which raises the fence, waits for this transaction) nor on the
-- concurrency slot, the operation's claim held by this lease.
EXISTS (SELECT 1 FROM {schema}.jobs
        WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND status = 'running')
AND (%(resource)s::text IS NULL
     OR coalesce((SELECT fence FROM {schema}.locks WHERE resource = %(resource)s::text
                  FOR SHARE), 0) <= %(fence)s::bigint)
AND (%(slot_key)s::text IS NULL
     OR coalesce((SELECT fence FROM {schema}.slots
                  WHERE key = %(slot_key)s::text AND slot = %(slot)s::integer), 0)
        <= %(slot_fence)s::bigint)
AND EXISTS (SELECT 1 FROM {schema}.operations
            WHERE key = %(key)s AND owner_lease = %(lease_token)s)

-- name: insert_step
-- A step recorded only while every proof still holds (step_proofs). Inserts nothing when one
-- fails (the caller reads which, and rolls back).
INSERT INTO {schema}.steps (operation_key, name, result, fence, created_at)
SELECT %(key)s, %(name)s, %(result)s, %(fence)s, %(now)s
WHERE {part:step_proofs};

-- name: insert_step_or_fail
-- A db_writes step's record, first in its transaction and sent with the step's statements in
-- one round trip, written only while every proof holds (step_proofs; another delivery's record
-- of the step, not committed yet, makes this one wait and then fail as a duplicate). A proof
-- that fails leaves created_at NULL, which its NOT NULL refuses: the statement fails, and the
-- server runs none of the statements sent after it, COMMIT included. One plain INSERT: a
-- data-modifying WITH and an aggregate failing on no row written cost the server a tenth more
-- per step's transaction (python -m bench.step_server_cpu).
INSERT INTO {schema}.steps (operation_key, name, result, fence, created_at)
VALUES (%(key)s, %(name)s, %(result)s, %(fence)s,
        CASE WHEN {part:step_proofs} THEN {store_now} END);

-- name: lease_holder_alive
-- Is the operation's current claimant still alive (its lease unexpired)?
SELECT 1 FROM {schema}.jobs
WHERE lease_token = %(owner_lease)s AND status = 'running' AND available_at > %(now)s;

-- name: guard_state
-- Everything a guarded write must prove, in one round trip: lease current, newest fence issued
-- for the resource and for the concurrency slot, whether this lease holds the operation's claim,
-- and (for a db_step) the step's stored result if it already ran.
SELECT
    (SELECT 1 FROM {schema}.jobs
     WHERE id = %(job_id)s AND lease_token = %(lease_token)s AND status = 'running') AS lease_ok,
    (SELECT fence FROM {schema}.locks WHERE resource = %(resource)s::text) AS fence,
    (SELECT fence FROM {schema}.slots
     WHERE key = %(slot_key)s::text AND slot = %(slot)s::integer) AS slot_fence,
    (SELECT 1 FROM {schema}.operations
     WHERE key = %(key)s::text AND owner_lease = %(lease_token)s) AS claim_ok,
    (SELECT result FROM {schema}.steps
     WHERE operation_key = %(key)s::text AND name = %(step)s::text) AS step_result;

-- name: any_ready
-- A cheap read-only look before taking the write lock for a fetch.
SELECT 1 FROM {schema}.jobs
WHERE queue = ANY(%(queues)s::text[]) AND status IN ('queued', 'running')
  AND available_at <= {store_now}
  AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queues p WHERE p.queue = jobs.queue)
LIMIT 1;

-- name: prunable_jobs
-- Completed jobs finished before %(cutoff)s whose dedup window is over too (so pruning never lets a
-- duplicate in). Operation records and steps are kept: they are what makes a late duplicate
-- "already processed".
SELECT id FROM {schema}.jobs
WHERE status = 'completed' AND finished_at < %(cutoff)s AND finished_at + dedup_window_s <= %(now)s
ORDER BY id LIMIT %(limit)s;

-- name: prune_attempts
DELETE FROM {schema}.attempts WHERE job_id = ANY(%(ids)s::bigint[]);

-- name: prune_jobs
DELETE FROM {schema}.jobs WHERE id = ANY(%(ids)s::bigint[]) AND status = 'completed';

-- name: write_access
-- What would stop this session writing jobguard's tables: a read-only session (the database's
-- or the role's default_transaction_read_only) or server (a standby), or a table of the
-- schema %(schema)s the role may not insert into or update.
SELECT current_setting('transaction_read_only') = 'on' AS read_only,
       pg_is_in_recovery() AS standby,
       current_user::text AS role,
       ARRAY(SELECT c.relname::text
             FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
             WHERE n.nspname = %(schema)s AND c.relkind = 'r'
               AND c.relname IN ('jobs', 'attempts', 'locks', 'operations', 'steps', 'schedules')
               AND NOT (has_table_privilege(c.oid, 'INSERT')
                        AND has_table_privilege(c.oid, 'UPDATE'))
             ORDER BY c.relname) AS unwritable;

-- name: store_clock
-- The one clock every worker host agrees on: the database server's.
SELECT extract(epoch FROM clock_timestamp())::float8 AS now;

-- Operator views (dashboard and metrics exporter). Each is bounded: live jobs through the
-- jobs_ready index, dead jobs through jobs_dead, recent attempts by id.

-- name: queue_backlog
SELECT queue,
       count(*) FILTER (WHERE status = 'queued' AND available_at <= %(now)s) AS ready,
       count(*) FILTER (WHERE status = 'queued' AND available_at > %(now)s) AS scheduled,
       min(run_at) FILTER (WHERE status = 'queued' AND available_at <= %(now)s) AS oldest_ready_at
FROM {schema}.jobs WHERE status IN ('queued', 'running') GROUP BY queue;

-- name: queue_running
SELECT j.queue, count(*) AS running, min(a.started_at) AS oldest_running_since,
       min(j.visibility_timeout_s) AS shortest_lease_s
FROM {schema}.jobs j JOIN {schema}.attempts a ON a.lease_token = j.lease_token
WHERE j.status = 'running' GROUP BY j.queue;

-- name: queue_dead
SELECT queue, count(*) AS dead FROM {schema}.jobs WHERE status = 'dead' GROUP BY queue;

-- name: find_jobs
SELECT * FROM {schema}.jobs
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
ORDER BY id DESC LIMIT %(limit)s OFFSET %(offset)s;

-- name: outcome_timeline
-- The bucket stays a float: an ended_at no version wrote (1e300) must not overflow a bigint.
SELECT floor((ended_at - %(since)s::float8) / %(bucket_s)s::float8) AS bucket, outcome,
       count(*) AS n
FROM {schema}.attempts
WHERE id > (SELECT coalesce(max(id), 0) FROM {schema}.attempts) - %(window)s::bigint
  AND ended_at >= %(since)s::float8 AND outcome != 'running'
GROUP BY bucket, outcome ORDER BY bucket, outcome;

-- name: insert_audit
INSERT INTO {schema}.audit (at, actor, action, target, detail)
VALUES (%(now)s, %(actor)s, %(action)s, %(target)s, %(detail)s);

-- name: audit_trail
SELECT * FROM {schema}.audit ORDER BY id DESC LIMIT %(limit)s;
-- name: schedule_states
SELECT * FROM {schema}.schedules ORDER BY name;

-- name: insert_schedule
-- The first scheduler to see a schedule creates its row; a concurrent one changes nothing.
INSERT INTO {schema}.schedules (name, cursor, updated_at) VALUES (%(name)s, %(cursor)s, %(now)s)
ON CONFLICT (name) DO NOTHING;

-- name: advance_schedule
-- Compare-and-set: only the scheduler that read the current cursor moves it. A concurrent
-- update waits for the row and then finds the cursor moved (READ COMMITTED re-checks the WHERE).
UPDATE {schema}.schedules SET cursor = %(cursor)s, updated_at = %(now)s
WHERE name = %(name)s AND cursor = %(expected)s;

-- name: record_schedule_job
UPDATE {schema}.schedules SET last_tick = %(tick)s, last_job_id = %(job_id)s
WHERE name = %(name)s;

-- Paused queues. A pause is a row; it takes effect when committed, and is then stamped with the
-- time (so no lease of the queue is granted after paused_at). Resume deletes the row.

-- name: pause_queue
INSERT INTO {schema}.paused_queues (queue, paused_at, paused_by)
VALUES (%(queue)s, %(now)s, %(actor)s)
ON CONFLICT (queue) DO NOTHING
RETURNING queue;

-- name: stamp_pause
UPDATE {schema}.paused_queues SET paused_at = %(now)s
WHERE queue = %(queue)s AND paused_by = %(actor)s;

-- name: resume_queue
DELETE FROM {schema}.paused_queues WHERE queue = %(queue)s RETURNING queue;

-- name: paused_queues
SELECT queue, paused_at, paused_by FROM {schema}.paused_queues ORDER BY queue;

-- Bulk DLQ actions (#17): the selection of a DeadFilter, in id order from a cursor.

-- name: dead_selection
SELECT * FROM {schema}.jobs
WHERE status = 'dead' AND id > %(after_id)s::bigint
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(code)s::text IS NULL OR dead_code = %(code)s::text)
  AND (%(since)s::float8 IS NULL OR finished_at >= %(since)s::float8)
  AND (%(until)s::float8 IS NULL OR finished_at < %(until)s::float8)
ORDER BY id LIMIT %(limit)s;

-- name: count_dead_selection
SELECT count(*) AS n FROM {schema}.jobs
WHERE status = 'dead'
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(code)s::text IS NULL OR dead_code = %(code)s::text)
  AND (%(since)s::float8 IS NULL OR finished_at >= %(since)s::float8)
  AND (%(until)s::float8 IS NULL OR finished_at < %(until)s::float8);

-- name: count_dead_held
-- What a replay in id order would leave dead: a live job holds the dedup key (as in
-- live_dedup_job), or an earlier dead job of the same selection does, replayed first.
SELECT count(*) AS n FROM {schema}.jobs AS d
WHERE d.status = 'dead' AND d.dedup_key IS NOT NULL
  AND (%(task)s::text IS NULL OR d.task = %(task)s::text)
  AND (%(queue)s::text IS NULL OR d.queue = %(queue)s::text)
  AND (%(code)s::text IS NULL OR d.dead_code = %(code)s::text)
  AND (%(since)s::float8 IS NULL OR d.finished_at >= %(since)s::float8)
  AND (%(until)s::float8 IS NULL OR d.finished_at < %(until)s::float8)
  AND (EXISTS (SELECT 1 FROM {schema}.jobs AS l
               WHERE l.dedup_key = d.dedup_key
                 AND (l.status IN ('queued', 'running')
                      OR (l.status = 'completed'
                          AND l.finished_at + l.dedup_window_s > %(now)s::float8)))
       OR EXISTS (SELECT 1 FROM {schema}.jobs AS e
                  WHERE e.dedup_key = d.dedup_key AND e.status = 'dead' AND e.id < d.id
                    AND (%(task)s::text IS NULL OR e.task = %(task)s::text)
                    AND (%(queue)s::text IS NULL OR e.queue = %(queue)s::text)
                    AND (%(code)s::text IS NULL OR e.dead_code = %(code)s::text)
                    AND (%(since)s::float8 IS NULL OR e.finished_at >= %(since)s::float8)
                    AND (%(until)s::float8 IS NULL OR e.finished_at < %(until)s::float8)));

-- name: purge_dead_attempts
-- The job rows are locked first (FOR UPDATE), so a replay running beside us cannot move one
-- between deleting its attempts and deleting it.
DELETE FROM {schema}.attempts
WHERE job_id IN (SELECT id FROM {schema}.jobs
                 WHERE id = ANY(%(ids)s::bigint[]) AND status = 'dead' FOR UPDATE);

-- name: purge_dead_jobs
DELETE FROM {schema}.jobs WHERE id = ANY(%(ids)s::bigint[]) AND status = 'dead';

-- name: host_job
-- The newest shadow job of a host queue's operation, whatever its state (jobguard.hosts).
-- Callers hold the key's dedup lock, so admissions of one operation take turns.
SELECT * FROM {schema}.jobs WHERE dedup_key = %(dedup_key)s ORDER BY id DESC LIMIT 1 FOR UPDATE;


-- name: retake_host_job
-- A deduplicated send takes over a shadow job left due with no delivery (its message was never
-- sent, or lost): the new message's id in its headers, due from now. Callers hold the key's
-- dedup lock; due_before makes it a no-op on a job a delivery moved meanwhile.
UPDATE {schema}.jobs SET headers = %(headers)s, available_at = %(now)s
WHERE id = %(id)s AND status IN ('queued', 'running') AND available_at <= %(due_before)s
RETURNING *;

