-- The device whose access token created a pusher: deleting the device (log
-- out, DELETE /devices, a password change logging the other devices out,
-- deactivation) deletes its pushers. NULL for pushers set before this column.
ALTER TABLE pushers ADD COLUMN device_id TEXT;
-- When the pushkey was last set (ms): sent to gateways as pushkey_ts.
ALTER TABLE pushers ADD COLUMN pushkey_ts BIGINT NOT NULL DEFAULT 0;
CREATE INDEX pushers_user_device ON pushers (user_id, device_id);
