-- Other servers' users' device lists and keys, kept current by their
-- m.device_list_update and m.signing_key_update EDUs (docs/federation.md,
-- "Device lists across servers"). A user has a row in
-- remote_device_list_users once we fetched their whole list; stream_id is
-- the origin's device list stream id it is current at, and stale = 1 means
-- an update was missed (a prev_id gap): the list is fetched again before
-- it is served.
CREATE TABLE remote_device_list_users (
    user_id TEXT NOT NULL PRIMARY KEY,
    stream_id BIGINT NOT NULL,
    stale SMALLINT NOT NULL,
    updated_ts BIGINT NOT NULL
);

-- keys: the device's signed device keys (JSON), NULL when it has none.
CREATE TABLE remote_devices (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    display_name TEXT,
    keys TEXT,
    PRIMARY KEY (user_id, device_id)
);

-- keytype: master or self_signing (a user-signing key never leaves its server).
CREATE TABLE remote_cross_signing_keys (
    user_id TEXT NOT NULL,
    keytype TEXT NOT NULL,
    key_json TEXT NOT NULL,
    PRIMARY KEY (user_id, keytype)
);
