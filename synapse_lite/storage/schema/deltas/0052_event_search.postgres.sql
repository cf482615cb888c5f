-- Full-text search of room events (POST /search), PostgreSQL: one row per
-- searchable event (m.room.message's content.body, m.room.name's
-- content.name, m.room.topic's content.topic, when a string) with its
-- tsvector ('english': stemmed, stop words dropped), found through a GIN
-- index. Filled by the room's events writer in the transaction persisting
-- the event; a redaction deletes its target's row.
CREATE TABLE event_search (
    event_id TEXT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    sender TEXT NOT NULL,
    type TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    contains_url BOOLEAN NOT NULL,
    stream_ordering BIGINT NOT NULL,
    vector TSVECTOR NOT NULL
);
CREATE INDEX event_search_vector ON event_search USING GIN (vector);
CREATE INDEX event_search_room_stream ON event_search (room_id, stream_ordering);

-- The events persisted before this version, but redacted ones.
INSERT INTO event_search (event_id, room_id, sender, type, key, value, contains_url,
                          stream_ordering, vector)
SELECT e.event_id, e.room_id, e.sender, e.type, 'content.' || k.field,
       e.content::jsonb ->> k.field,
       jsonb_typeof(e.content::jsonb -> 'url') IS NOT DISTINCT FROM 'string',
       e.stream_ordering,
       to_tsvector('english', e.content::jsonb ->> k.field)
FROM events AS e
JOIN (SELECT 'm.room.message' AS type, 'body' AS field
      UNION ALL SELECT 'm.room.name', 'name'
      UNION ALL SELECT 'm.room.topic', 'topic') AS k ON k.type = e.type
WHERE NOT e.outlier
  AND jsonb_typeof(e.content::jsonb -> k.field) = 'string'
  AND e.event_id NOT IN (SELECT r.redacts FROM events AS r
                         WHERE r.type = 'm.room.redaction' AND r.redacts IS NOT NULL);
