-- jobguard SQLite schema, version 8: concurrency limits (slots).
-- A job may name a concurrency key and its limit N: it runs only while holding one of the key's
-- N slots. Each slot is a lock of its own (owner, fence, expiry), numbered 0..N-1.
ALTER TABLE jobs ADD COLUMN concurrency_key TEXT;
ALTER TABLE jobs ADD COLUMN concurrency_limit INTEGER;

-- One row per slot ever held: the fence counter must survive release so it never repeats.
CREATE TABLE IF NOT EXISTS slots (
    key         TEXT    NOT NULL,
    slot        INTEGER NOT NULL,
    owner       TEXT,
    fence       INTEGER NOT NULL,
    expires_at  REAL,
    PRIMARY KEY (key, slot)
);
