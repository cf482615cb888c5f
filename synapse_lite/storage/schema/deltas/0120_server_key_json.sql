-- The newest key document of each other server, exactly as it signed it:
-- what we answer as a notary (/_matrix/key/v2/query). Its keys are also in
-- server_keys, where old keys stay after a server stops listing them.
CREATE TABLE server_key_json (
    server_name TEXT NOT NULL PRIMARY KEY,
    key_json TEXT NOT NULL,
    valid_until_ts BIGINT NOT NULL,
    fetched_ts BIGINT NOT NULL
);
