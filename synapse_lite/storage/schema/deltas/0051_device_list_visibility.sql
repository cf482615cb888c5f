-- A device_lists change only one user is told of: a user's signature of
-- another user's master key (made with their user-signing key, shown to
-- them alone) is a change of the signed user's keys for the signer only.
-- NULL: every user sharing a room with user_id is told.
ALTER TABLE device_lists_stream ADD COLUMN visible_to TEXT;
