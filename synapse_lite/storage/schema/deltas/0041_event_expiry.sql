-- MSC2228 self-destructing events (experimental_features, off by default):
-- when each event that asked for it is due to have its content pruned. Rows
-- are written by the event's writer with the event and deleted once the
-- content is pruned.
CREATE TABLE event_expiry (
    event_id TEXT NOT NULL PRIMARY KEY,
    expiry_ts BIGINT NOT NULL
);
CREATE INDEX event_expiry_ts ON event_expiry (expiry_ts);
