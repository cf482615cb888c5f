-- Tokens with an end: those an admin gets to act as a user
-- (POST /_synapse/admin/v1/users/{userId}/login with valid_until_ms).
-- NULL: valid until logged out, as every other token.
ALTER TABLE access_tokens ADD COLUMN valid_until_ms BIGINT;
