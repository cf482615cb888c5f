-- Full-text search of room events (POST /search), SQLite: an FTS5 table,
-- one row per searchable event (m.room.message's content.body, m.room.name's
-- content.name, m.room.topic's content.topic, when a string), rowid = the
-- event's stream ordering. Filled by the room's events writer in the
-- transaction persisting the event; a redaction deletes its target's row.
-- The porter tokenizer stems English words as PostgreSQL's 'english'
-- configuration does (a search for "cats" finds "cat").
CREATE VIRTUAL TABLE event_search USING fts5(
    value,
    event_id UNINDEXED,
    room_id UNINDEXED,
    sender UNINDEXED,
    type UNINDEXED,
    key UNINDEXED,
    contains_url UNINDEXED,
    tokenize = 'porter unicode61 remove_diacritics 2'
);

-- The events persisted before this version, but redacted ones.
INSERT INTO event_search (rowid, value, event_id, room_id, sender, type, key, contains_url)
SELECT e.stream_ordering,
       json_extract(e.content, '$.' || k.field),
       e.event_id, e.room_id, e.sender, e.type, 'content.' || k.field,
       CASE WHEN json_type(e.content, '$.url') = 'text' THEN 1 ELSE 0 END
FROM events AS e
JOIN (SELECT 'm.room.message' AS type, 'body' AS field
      UNION ALL SELECT 'm.room.name', 'name'
      UNION ALL SELECT 'm.room.topic', 'topic') AS k ON k.type = e.type
WHERE NOT e.outlier
  AND json_type(e.content, '$.' || k.field) = 'text'
  AND e.event_id NOT IN (SELECT r.redacts FROM events AS r
                         WHERE r.type = 'm.room.redaction' AND r.redacts IS NOT NULL);
