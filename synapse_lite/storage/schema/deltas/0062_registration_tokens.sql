-- Registration tokens (the admin API's /_synapse/admin/v1/registration_tokens,
-- the client's m.login.registration_token stage):
--   uses_allowed: registrations the token may complete (NULL: unlimited);
--   pending:      registrations under way that reserved a use;
--   completed:    registrations it completed;
--   expiry_time:  ms since the epoch after which it is refused (NULL: never).
CREATE TABLE registration_tokens (
    token TEXT NOT NULL PRIMARY KEY,
    uses_allowed INTEGER,
    pending INTEGER NOT NULL,
    completed INTEGER NOT NULL,
    expiry_time BIGINT
);
