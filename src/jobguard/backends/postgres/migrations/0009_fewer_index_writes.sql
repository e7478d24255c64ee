-- jobguard PostgreSQL schema, version 9: fewer index entries written per job.
-- A job's row is written three times (enqueue, lease, settle), and none of the writes can be a
-- heap-only update (each changes a column the fetch's index holds), so every write adds an entry
-- to every index of jobs whose predicate the new row meets. Three of those entries bought
-- nothing:
-- * jobs_operation: no statement looks jobs up by operation key (attempts and operations are);
-- * jobs_status: an entry for each finished job, which no statement looks up by status (the
--   retention's own index, jobs_finished, finds them); now only unfinished jobs;
-- * the lease token's unique index: an entry for each job without a lease (queued, or ended),
--   which no statement looks up; now only jobs that hold one, still unique.
DROP INDEX jobs_operation;
DROP INDEX jobs_status;
CREATE INDEX jobs_status ON jobs (status, id) WHERE status <> 'completed';
ALTER TABLE jobs DROP CONSTRAINT jobs_lease_token_key;
CREATE UNIQUE INDEX jobs_lease_token ON jobs (lease_token) WHERE lease_token IS NOT NULL;
