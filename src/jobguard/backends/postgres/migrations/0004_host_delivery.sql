-- jobguard PostgreSQL schema, version 4: the host queue's own id of a delivery (jobguard.hosts).
-- A guarded Celery, RQ or Dramatiq task records the host's delivery id on each attempt.
ALTER TABLE attempts ADD COLUMN host_delivery text;
