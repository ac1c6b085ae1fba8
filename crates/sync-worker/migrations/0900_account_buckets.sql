-- Accounts hash into lease buckets (leasehold_core::BucketCount): a worker
-- leases buckets and reads only its buckets' accounts. Each row keeps its
-- bucket; the index on it is made at open, after any rebuild of the table
-- (see src/storage/buckets.rs), and rows from before this column are filled
-- in then too. The count is fixed once accounts exist.
ALTER TABLE accounts ADD COLUMN bucket BIGINT;
CREATE TABLE account_buckets (
    singleton BIGINT PRIMARY KEY CHECK (singleton = 1),
    count BIGINT NOT NULL
);
INSERT INTO account_buckets (singleton, count) VALUES (1, 4096);
