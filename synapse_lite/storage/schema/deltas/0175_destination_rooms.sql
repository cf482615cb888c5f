-- Durable outbound PDUs (docs/federation.md, "Outbound: room events").
--
-- The newest of our events queued for each destination in each room, written
-- by the sender's room events feed before the events are queued in memory:
-- what a destination that fell behind is sent to catch up (one event per
-- room; it fetches the gap with get_missing_events).
CREATE TABLE destination_rooms (
    destination TEXT NOT NULL,
    room_id TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    event_id TEXT NOT NULL,
    PRIMARY KEY (destination, room_id)
);
CREATE INDEX destination_rooms_behind ON destination_rooms (destination, stream_ordering);

-- Every event for the destination at or below this events stream position
-- was accepted by it (NULL: none was ever queued for it).
ALTER TABLE destinations ADD COLUMN pdus_sent_upto BIGINT;
-- The transaction in flight carries the events above pdus_sent_upto up to
-- this position (NULL: none in flight): the next run sends the same one
-- again, with the same transaction id.
ALTER TABLE destinations ADD COLUMN pdus_in_flight_upto BIGINT;

-- How far the feed has written destination_rooms, for every destination
-- (one row; the largest any sender reached).
CREATE TABLE federation_feed_position (
    singleton INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    stream_ordering BIGINT NOT NULL
);
