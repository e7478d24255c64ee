-- jobguard SQLite schema, version 2: reason codes, job headers and the host clock.

-- Why a job is dead, as a code; the words are made above the store (NULL text: from the code).
ALTER TABLE jobs ADD COLUMN dead_code TEXT;
-- Context carried with a job (a JSON object as text), e.g. the enqueuer's trace.
ALTER TABLE jobs ADD COLUMN headers TEXT;
UPDATE jobs SET dead_code = 'lost'
WHERE status = 'dead' AND dead_reason LIKE 'attempts exhausted (%): the worker never reported back%';

-- The store clock of one host: seconds since boot (a clock every process shares and that does
-- not step) plus the wall-clock offset recorded by the first process of each boot.
CREATE TABLE IF NOT EXISTS jobguard_clock (
    boot_id  TEXT PRIMARY KEY,
    offset_s REAL NOT NULL
);
