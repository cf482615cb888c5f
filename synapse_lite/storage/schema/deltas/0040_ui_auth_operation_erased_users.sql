-- User-interactive auth sessions remember what they were started for, so a
-- session cannot authorise another operation than the one it was begun with
-- (the first request's), and what a registration session asked for and did:
--   operation: what the session authorises, as the handler names it
--              ("register", "delete device D", ...);
--   params:    JSON, the parameters of the first request a later round may
--              leave out (registration: username, password hash, device id,
--              device display name, inhibit_login); NULL for none;
--   result:    JSON, what the completed operation produced (registration:
--              the user id), so that repeating the last round is idempotent.
ALTER TABLE ui_auth_sessions ADD COLUMN operation TEXT NOT NULL DEFAULT '';
ALTER TABLE ui_auth_sessions ADD COLUMN params TEXT;
ALTER TABLE ui_auth_sessions ADD COLUMN result TEXT;

-- Users who deactivated their account with "erase": the events stream's
-- position then (NULL: not erased). Their events are served redacted to
-- anyone who could not see them by that position (the spec's erasure).
ALTER TABLE users ADD COLUMN erased_at_position BIGINT;
