-- Profiles of local users (GET/PUT /profile/{userId}/...): a user with no row
-- has the display name of their localpart and no avatar (docs/client-api.md).
CREATE TABLE profiles (
    user_id TEXT NOT NULL PRIMARY KEY,
    displayname TEXT,
    avatar_url TEXT
);

-- Room aliases of this server (#alias:server_name -> room), with who made them
-- (the creator may delete theirs; so may a room moderator).
CREATE TABLE room_aliases (
    room_alias TEXT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    creator TEXT NOT NULL
);
CREATE INDEX room_aliases_room ON room_aliases (room_id);

-- Rooms a user forgot (POST /rooms/{roomId}/forget) after leaving them.
CREATE TABLE forgotten_rooms (
    user_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    PRIMARY KEY (user_id, room_id)
);

-- Whether a room is listed in the public room directory (GET /publicRooms):
-- its own setting (PUT /directory/list/room/{roomId}, createRoom's
-- visibility), apart from its join rule.
ALTER TABLE rooms ADD COLUMN in_directory BOOLEAN NOT NULL DEFAULT FALSE;

-- Finding the redaction of an event when it is read (redactions are applied
-- to what is served, see storage/databases/main/events_worker.py).
CREATE INDEX events_redacts ON events (redacts);

-- Relations between events (content."m.relates_to" with a rel_type), written
-- with the event: /relations, /threads and the bundled aggregations read it.
CREATE TABLE event_relations (
    event_id TEXT NOT NULL PRIMARY KEY,
    relates_to_id TEXT NOT NULL,
    relation_type TEXT NOT NULL,
    room_id TEXT NOT NULL,
    sender TEXT NOT NULL,
    type TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL
);
CREATE INDEX event_relations_parent ON event_relations (relates_to_id, relation_type, stream_ordering);
CREATE INDEX event_relations_room ON event_relations (room_id, relation_type, stream_ordering);
