-- jobguard SQLite schema, version 7: time limits and cancellation (#17).
-- A job's soft and hard run-time limits in seconds (NULL: none), stored at enqueue.
ALTER TABLE jobs ADD COLUMN soft_time_limit_s REAL;
ALTER TABLE jobs ADD COLUMN time_limit_s REAL;
-- A cancel asked of a running job: when and by whom (its worker reads it with each renewal).
ALTER TABLE jobs ADD COLUMN cancel_requested_at REAL;
ALTER TABLE jobs ADD COLUMN cancel_requested_by TEXT;
