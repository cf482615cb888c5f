-- Writes a client may retry with the same transaction id (PUT .../{txnId}),
-- recorded by their writer in the same database transaction as the write, so
-- a retry after any restart (or after a COMMIT whose outcome was unknown) is
-- answered with the first answer instead of writing again
-- (docs/reliability.md). ``kind`` names the endpoint ('to_device', ...);
-- ``device_id`` is '' for an access token without a device; ``stream_id`` is
-- the stream position the first write answered with.
CREATE TABLE client_transactions (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    txn_id TEXT NOT NULL,
    stream_id BIGINT,
    inserted_ts BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, kind, txn_id)
);
CREATE INDEX client_transactions_inserted ON client_transactions (inserted_ts);

-- Which deployment this database belongs to: one row, a random id written by
-- the first process that starts on it. Every Redis replication message names
-- it, so processes of another deployment sharing the channel (same server
-- name, no channel prefix) are recognised and refused (docs/reliability.md).
CREATE TABLE deployment (
    id INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    deployment_id TEXT NOT NULL
);
