-- Which deployment this database is: one row, its id made at the first
-- start. The Redis key space records the same id (`sync:deployment`), and a
-- worker whose database and key space name different deployments refuses
-- to start: two deployments sharing one Redis prefix would otherwise
-- reconcile away each other's accounts.
CREATE TABLE deployment (
    singleton BIGINT PRIMARY KEY CHECK (singleton = 1),
    id TEXT NOT NULL
);
