-- How many messages the server said the folder holds (EXISTS) when it was
-- last selected: with the stored count, a first sync's progress.
ALTER TABLE folders ADD COLUMN server_messages BIGINT;
