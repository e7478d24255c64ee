-- jobguard PostgreSQL schema, version 6: time limits and cancellation (#17).
-- A job's soft and hard run-time limits in seconds (NULL: none), stored at enqueue.
ALTER TABLE jobs ADD COLUMN soft_time_limit_s double precision;
ALTER TABLE jobs ADD COLUMN time_limit_s double precision;
-- A cancel asked of a running job: when and by whom (its worker reads it with each renewal).
ALTER TABLE jobs ADD COLUMN cancel_requested_at double precision;
ALTER TABLE jobs ADD COLUMN cancel_requested_by text;
