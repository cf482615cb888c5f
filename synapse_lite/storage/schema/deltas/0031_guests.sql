-- Guest accounts (POST /register?kind=guest): a guest is a users row with
-- is_guest set; upgrading it to a full account (POST /register with
-- guest_access_token) clears the flag and keeps the user id.
ALTER TABLE users ADD COLUMN is_guest BOOLEAN NOT NULL DEFAULT FALSE;
