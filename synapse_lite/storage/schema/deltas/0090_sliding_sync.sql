-- Sliding sync connections (docs/sliding-sync.md#connection-state): one row
-- per pos handed out, with what the connection had been sent by then, so
-- that any process continues the connection. A connection keeps the pos its
-- client last used and the one it was handed after it; older rows go.
CREATE TABLE sliding_sync_positions (
    pos TEXT NOT NULL PRIMARY KEY,
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    conn_id TEXT NOT NULL,
    stream_token TEXT NOT NULL,
    state TEXT NOT NULL,
    created_ts BIGINT NOT NULL
);
CREATE INDEX sliding_sync_positions_connection
    ON sliding_sync_positions (user_id, device_id, conn_id);
