-- users.suspended: an admin suspended the account (PUT
-- /_synapse/admin/v1/suspend/{userId}): the user may read, leave rooms and
-- redact their own events; creating, joining, knocking on and inviting to
-- rooms, sending and profile changes answer 403 M_USER_SUSPENDED.
ALTER TABLE users ADD COLUMN suspended BOOLEAN NOT NULL DEFAULT FALSE;
