-- jobguard PostgreSQL schema, version 7: concurrency limits (slots).
-- A job may name a concurrency key and its limit N: it runs only while holding one of the key's
-- N slots. Each slot is a lock of its own (owner, fence, expiry), numbered 0..N-1.
ALTER TABLE jobs ADD COLUMN concurrency_key text;
ALTER TABLE jobs ADD COLUMN concurrency_limit integer;

-- One row per slot ever held: the fence counter must survive release so it never repeats.
CREATE TABLE slots (
    key         text    NOT NULL,
    slot        integer NOT NULL,
    owner       text,
    fence       bigint  NOT NULL,
    expires_at  double precision,
    PRIMARY KEY (key, slot)
);
