-- Reports of rooms, events and users by local users (POST .../report):
-- kept for the server's admins to read in the database; nothing is sent
-- anywhere. Which of room_id, event_id and reported_user_id are set says
-- what was reported.
CREATE TABLE content_reports (
    reporter TEXT NOT NULL,
    received_ts BIGINT NOT NULL,
    room_id TEXT,
    event_id TEXT,
    reported_user_id TEXT,
    reason TEXT
);
CREATE INDEX content_reports_received ON content_reports (received_ts);

-- OpenID tokens (POST /user/{userId}/openid/request_token), which other
-- servers exchange for the user's id at GET /_matrix/federation/v1/openid/
-- userinfo. Stored as SHA-256 only, like access tokens; useless after
-- valid_until_ms and deleted some time after.
CREATE TABLE openid_tokens (
    token_hash TEXT NOT NULL PRIMARY KEY,
    user_id TEXT NOT NULL,
    valid_until_ms BIGINT NOT NULL
);
CREATE INDEX openid_tokens_expiry ON openid_tokens (valid_until_ms);
