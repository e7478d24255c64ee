-- The demo report's queries: everything it says is read from these tables (and the mail log).
-- Each "-- name:" starts one statement.

-- name: per_order
-- One row per order: its data, how many effects it has, and how its jobs ended.
WITH j AS (
    SELECT json_extract(payload, '$.order_id') AS order_id,
           sum(status = 'completed') AS completed,
           sum(status = 'dead') AS dead,
           sum(status IN ('queued', 'running')) AS live,
           count(*) AS jobs
    FROM jobs WHERE task = :task GROUP BY 1
), i AS (
    SELECT order_id, count(*) AS n FROM invoices GROUP BY order_id
), m AS (
    SELECT s.order_id, count(*) AS n, sum(s.quantity) AS units,
           sum(s.quantity != o.quantity OR s.product_id != o.product_id) AS wrong
    FROM stock_movements AS s JOIN orders AS o ON o.id = s.order_id GROUP BY s.order_id
)
SELECT o.id, o.quantity, o.email, p.id IS NULL AS unknown_product,
       coalesce(i.n, 0) AS invoices, coalesce(m.n, 0) AS stock_cuts,
       coalesce(m.units, 0) AS units_cut, coalesce(m.wrong, 0) AS wrong_cuts,
       coalesce(j.jobs, 0) AS jobs, coalesce(j.completed, 0) AS jobs_completed,
       coalesce(j.dead, 0) AS jobs_dead, coalesce(j.live, 0) AS jobs_live
FROM orders AS o
LEFT JOIN products AS p ON p.id = o.product_id
LEFT JOIN i ON i.order_id = o.id
LEFT JOIN m ON m.order_id = o.id
LEFT JOIN j ON j.order_id = o.id
ORDER BY o.id;

-- name: shelf
-- Units missing from the shelves; must equal the units in the stock ledger.
SELECT coalesce(sum(initial_stock - stock), 0) AS units_missing FROM products;

-- name: attempt_outcomes
SELECT outcome, count(*) AS n FROM attempts GROUP BY outcome;

-- name: jobs_by_status
SELECT status, count(*) AS n FROM jobs GROUP BY status;

-- name: attempt_counters
SELECT count(*) AS attempts,
       coalesce(sum(steps_skipped), 0) AS steps_skipped,
       coalesce(sum(steps_run), 0) AS steps_run,
       coalesce(sum(outcome = 'deferred' AND error_message LIKE 'resource is busy%'), 0)
           AS lock_busy,
       coalesce(sum(outcome = 'deferred' AND error_message NOT LIKE 'resource is busy%'), 0)
           AS operation_busy
FROM attempts;

-- name: dedup_hits
SELECT coalesce(sum(dedup_hits), 0) AS hits, count(*) AS jobs FROM jobs;

-- name: slow_jobs_carried
-- Deliveries that completed although they ran longer than their lease: the heartbeat kept it.
SELECT count(*) AS n FROM attempts AS a JOIN jobs AS j ON j.id = a.job_id
WHERE a.outcome = 'completed' AND a.duration_s > j.visibility_timeout_s;

-- name: completed_operations
SELECT count(*) AS n FROM operations WHERE status = 'completed';

-- name: dead_jobs
SELECT id, json_extract(payload, '$.order_id') AS order_id, dead_reason, last_error
FROM jobs WHERE status = 'dead' ORDER BY id;

-- name: events_by_kind
SELECT kind, count(*) AS n FROM demo_events GROUP BY kind;

-- name: invoice_sources
-- Extra invoices split by cause: another job for the same order (a duplicate trigger) or
-- another delivery of the same job (a redelivery after a crash or an expired lease).
SELECT coalesce(sum(jobs - 1), 0) AS from_duplicate_jobs,
       coalesce(sum(n - jobs), 0) AS from_redeliveries
FROM (SELECT order_id, count(*) AS n, count(DISTINCT job_id) AS jobs
      FROM invoices GROUP BY order_id);

-- name: stock_cut_sources
SELECT coalesce(sum(jobs - 1), 0) AS from_duplicate_jobs,
       coalesce(sum(n - jobs), 0) AS from_redeliveries
FROM (SELECT order_id, count(*) AS n, count(DISTINCT job_id) AS jobs
      FROM stock_movements GROUP BY order_id);

-- name: live_progress
-- Cheap numbers for the progress display while the demo runs.
SELECT
    (SELECT count(DISTINCT json_extract(payload, '$.order_id')) FROM jobs
     WHERE status IN ('completed', 'dead')) AS orders_settled,
    (SELECT count(*) FROM invoices) AS invoices,
    (SELECT coalesce(sum(dedup_hits), 0) FROM jobs) AS dedup_hits,
    (SELECT count(*) FROM demo_events WHERE kind = 'worker_killed') AS workers_killed,
    (SELECT count(*) FROM demo_events WHERE kind = 'worker_frozen') AS workers_frozen,
    (SELECT coalesce(sum(steps_skipped), 0) FROM attempts) AS memoised_steps,
    (SELECT count(*) FROM attempts WHERE outcome = 'retry') AS retries,
    (SELECT count(*) FROM attempts WHERE outcome = 'deferred') AS deferrals,
    (SELECT count(*) FROM attempts WHERE outcome = 'already_processed') AS already_processed,
    (SELECT count(*) FROM attempts WHERE outcome IN ('lost', 'lease_refused', 'fence_refused'))
        AS stale;
