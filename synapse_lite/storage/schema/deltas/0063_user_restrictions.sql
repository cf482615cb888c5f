-- What admins restrict a user with (the admin API):
--   users.shadow_banned: the user's sends answer as if they succeeded and
--     reach nobody (POST/DELETE /_synapse/admin/v1/users/{userId}/shadow_ban);
--   ratelimit_override: the user's message rate limit instead of the
--     configured one (.../override_ratelimit); messages_per_second 0 lifts it.
ALTER TABLE users ADD COLUMN shadow_banned BOOLEAN NOT NULL DEFAULT FALSE;
CREATE TABLE ratelimit_override (
    user_id TEXT NOT NULL PRIMARY KEY,
    messages_per_second BIGINT NOT NULL,
    burst_count BIGINT NOT NULL
);
