-- The address of the server that took the account's login when it was
-- added or updated: two names of one server (localhost, 127.0.0.1) are one
-- mailbox for the per-user duplicate check, which runs after the login.
-- (The global UNIQUE (host, port, username) of 0001 is replaced by a
-- per-user unique index at open: storage/accounts_unique.rs.)
ALTER TABLE accounts ADD COLUMN server_ip TEXT;
