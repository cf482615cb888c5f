-- End-to-end encryption keys (synapse_lite/storage/databases/main/end_to_end_keys.py).
-- A device's identity keys, as the client signed them (the JSON object is
-- stored verbatim: its signatures cover every field).
CREATE TABLE e2e_device_keys_json (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    ts_added_ms BIGINT NOT NULL,
    key_json TEXT NOT NULL,
    PRIMARY KEY (user_id, device_id)
);

-- One-time keys: each row is handed out once, by deleting it (a claim is one
-- DELETE ... RETURNING, so two claims can never return the same row).
CREATE TABLE e2e_one_time_keys_json (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    key_id TEXT NOT NULL,
    ts_added_ms BIGINT NOT NULL,
    key_json TEXT NOT NULL,
    PRIMARY KEY (user_id, device_id, algorithm, key_id)
);

-- The fallback key of each algorithm of a device, handed out when no
-- one-time key is left (and then marked used; it stays until replaced).
CREATE TABLE e2e_fallback_keys_json (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    key_id TEXT NOT NULL,
    key_json TEXT NOT NULL,
    used BOOLEAN NOT NULL,
    PRIMARY KEY (user_id, device_id, algorithm)
);

-- Cross-signing keys (master, self_signing, user_signing), one current key
-- of each type per user. A second table of the device_lists stream: an
-- upload takes one device_lists id, shared by the keys it replaces, written
-- by the writer (instance_name) that took it; no device_lists_stream row.
CREATE TABLE e2e_cross_signing_keys (
    user_id TEXT NOT NULL,
    keytype TEXT NOT NULL,
    key_json TEXT NOT NULL,
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    PRIMARY KEY (user_id, keytype)
);
CREATE INDEX e2e_cross_signing_keys_stream ON e2e_cross_signing_keys (stream_id);

-- Signatures uploaded separately from the key they sign (POST
-- /keys/signatures/upload): merged into the key's "signatures" when shown.
CREATE TABLE e2e_cross_signing_signatures (
    user_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    target_user_id TEXT NOT NULL,
    target_device_id TEXT NOT NULL,
    signature TEXT NOT NULL,
    PRIMARY KEY (user_id, key_id, target_user_id, target_device_id)
);
CREATE INDEX e2e_cross_signing_signatures_target
    ON e2e_cross_signing_signatures (target_user_id, target_device_id);

-- Server-side key backup: versions (deleted ones kept, marked) and the
-- session keys of each version.
CREATE TABLE e2e_room_keys_versions (
    user_id TEXT NOT NULL,
    version BIGINT NOT NULL,
    algorithm TEXT NOT NULL,
    auth_data TEXT NOT NULL,
    deleted BOOLEAN NOT NULL,
    -- Bumped by every change of the version's keys (the spec's etag).
    etag BIGINT NOT NULL,
    PRIMARY KEY (user_id, version)
);

CREATE TABLE e2e_room_keys (
    user_id TEXT NOT NULL,
    version BIGINT NOT NULL,
    room_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    first_message_index BIGINT NOT NULL,
    forwarded_count BIGINT NOT NULL,
    is_verified BOOLEAN NOT NULL,
    session_data TEXT NOT NULL,
    PRIMARY KEY (user_id, version, room_id, session_id)
);
