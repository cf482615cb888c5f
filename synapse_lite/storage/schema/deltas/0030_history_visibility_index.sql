-- History visibility is applied per event, with the setting in force at each
-- event: a room's m.room.history_visibility events in stream order. A partial
-- index holds only those events, so finding them costs a few rows whatever
-- the room's size, and sending any other event pays only the predicate.
CREATE INDEX events_history_visibility ON events (room_id, stream_ordering)
    WHERE type = 'm.room.history_visibility';
