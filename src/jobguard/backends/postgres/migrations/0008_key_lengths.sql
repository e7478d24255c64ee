-- jobguard PostgreSQL schema, version 8: a job's keys are no longer than an enqueue allows.
-- Enqueue refuses a key of more than 512 characters. A row changed by hand to hold a longer one
-- made every fetch of its queue fail (the lock, operation or attempt row the fetch writes for it
-- is larger than an index can hold), so no job of the queue ran; now such a write is refused.
-- NOT VALID: rows stored before this version are not checked, so the migration cannot fail on
-- one.
ALTER TABLE jobs ADD CONSTRAINT jobs_keys_fit CHECK (
    char_length(operation_key) <= 512 AND char_length(resource_key) <= 512
    AND char_length(concurrency_key) <= 512 AND char_length(dedup_key) <= 512) NOT VALID;
