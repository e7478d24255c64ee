-- The demo shop's tables and queries. They live in the same SQLite file as jobguard's store, so
-- a write made through ctx.db_step() commits in the same transaction as its step record.
-- Each "-- name:" starts one statement.

-- name: create_products
CREATE TABLE IF NOT EXISTS products (
    id            INTEGER PRIMARY KEY,
    sku           TEXT    NOT NULL UNIQUE,
    price_cents   INTEGER NOT NULL,
    stock         INTEGER NOT NULL,
    initial_stock INTEGER NOT NULL
);

-- name: create_orders
-- No CHECK constraints on purpose: poison orders carry data the shop must refuse at fulfilment.
CREATE TABLE IF NOT EXISTS orders (
    id          INTEGER PRIMARY KEY,
    product_id  INTEGER NOT NULL,
    quantity    INTEGER NOT NULL,
    email       TEXT    NOT NULL,
    created_at  REAL    NOT NULL
);

-- name: create_stock_movements
-- The stock ledger: one row per cut, so a second cut for one order is visible, not just a number.
CREATE TABLE IF NOT EXISTS stock_movements (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id    INTEGER NOT NULL,
    product_id  INTEGER NOT NULL,
    quantity    INTEGER NOT NULL,
    job_id      INTEGER,
    attempt     INTEGER,
    worker_id   TEXT,
    created_at  REAL    NOT NULL
);

-- name: create_invoices_safe
-- One invoice per order, stated in the storage itself (the article's advice, G4.5).
CREATE TABLE IF NOT EXISTS invoices (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id      INTEGER NOT NULL UNIQUE,
    number        TEXT    NOT NULL UNIQUE,
    amount_cents  INTEGER NOT NULL,
    job_id        INTEGER,
    attempt       INTEGER,
    worker_id     TEXT,
    created_at    REAL    NOT NULL
);

-- name: create_invoices_unsafe
-- --unsafe: the same table without UNIQUE(order_id), as in the article's broken shop.
CREATE TABLE IF NOT EXISTS invoices (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id      INTEGER NOT NULL,
    number        TEXT    NOT NULL UNIQUE,
    amount_cents  INTEGER NOT NULL,
    job_id        INTEGER,
    attempt       INTEGER,
    worker_id     TEXT,
    created_at    REAL    NOT NULL
);

-- name: create_demo_events
-- What the supervisor did to the workers (kills it observed, freezes, back-office locks,
-- late redeliveries), so the report reads the faults from the database like everything else.
CREATE TABLE IF NOT EXISTS demo_events (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    kind      TEXT    NOT NULL,
    order_id  INTEGER,
    worker    TEXT,
    detail    TEXT,
    at        REAL    NOT NULL
);

-- name: create_demo_run
CREATE TABLE IF NOT EXISTS demo_run (
    key    TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);

-- name: insert_product
INSERT INTO products (id, sku, price_cents, stock, initial_stock)
VALUES (:id, :sku, :price_cents, :stock, :stock);

-- name: insert_order
INSERT INTO orders (id, product_id, quantity, email, created_at)
VALUES (:id, :product_id, :quantity, :email, :now);

-- name: put_run_value
INSERT INTO demo_run (key, value) VALUES (:key, :value)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: insert_event
INSERT INTO demo_events (kind, order_id, worker, detail, at)
VALUES (:kind, :order_id, :worker, :detail, :now);

-- name: order_with_product
SELECT o.id, o.product_id, o.quantity, o.email, p.sku, p.price_cents
FROM orders AS o LEFT JOIN products AS p ON p.id = o.product_id
WHERE o.id = :order_id;

-- name: cut_stock
UPDATE products SET stock = stock - :quantity WHERE id = :product_id AND stock >= :quantity;

-- name: insert_stock_movement
INSERT INTO stock_movements (order_id, product_id, quantity, job_id, attempt, worker_id, created_at)
VALUES (:order_id, :product_id, :quantity, :job_id, :attempt, :worker_id, :now);

-- name: insert_invoice
-- Invoice numbers come from a running sequence, so a second invoice gets a new number, the way
-- real double invoices reach customers.
INSERT INTO invoices (order_id, number, amount_cents, job_id, attempt, worker_id, created_at)
VALUES (:order_id,
        printf('INV-%06d', (SELECT coalesce(max(id), 0) + 1 FROM invoices)),
        :amount_cents, :job_id, :attempt, :worker_id, :now)
RETURNING id, number;

-- name: deferred_attempt
-- Has the fulfilment of this order been deferred at least once (the back-office saw it wait)?
SELECT 1 FROM attempts WHERE operation_key = :operation_key AND outcome = 'deferred' LIMIT 1;

-- name: lock_state
SELECT owner, expires_at FROM locks WHERE resource = :resource;

-- name: order_job_states
-- How the jobs of some orders stand (for late redeliveries: fire only after completion).
SELECT json_extract(payload, '$.order_id') AS order_id,
       sum(status = 'completed') AS completed,
       sum(status = 'dead') AS dead,
       sum(status IN ('queued', 'running')) AS live
FROM jobs
WHERE json_extract(payload, '$.order_id') IN (SELECT value FROM json_each(:order_ids))
GROUP BY 1;
