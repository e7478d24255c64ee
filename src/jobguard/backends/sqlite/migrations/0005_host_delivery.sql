-- jobguard SQLite schema, version 5: the host queue's own id of a delivery (jobguard.hosts).
-- A guarded Celery, RQ or Dramatiq task records the host's delivery id on each attempt.
ALTER TABLE attempts ADD COLUMN host_delivery TEXT;
