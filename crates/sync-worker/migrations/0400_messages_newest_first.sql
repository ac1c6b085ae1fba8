-- An account's mail newest first (the order of search results), so a
-- search that matches most of an account walks it in order and stops at a
-- page instead of sorting every match.
CREATE INDEX messages_newest_first ON messages (account_id, (COALESCE(internal_date, 0)) DESC, folder DESC, uid DESC);
