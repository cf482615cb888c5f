-- Rooms as event graphs (docs/event-graph.md#what-is-stored). An event's
-- depth stays in events.topological_ordering (1 + its deepest parent).
--
-- event_edges: an event's prev_events, one row per parent; walked both ways
-- (the parents of an event by its primary key, the children of an event by
-- event_edges_prev).
CREATE TABLE event_edges (
    event_id TEXT NOT NULL,
    prev_event_id TEXT NOT NULL,
    PRIMARY KEY (event_id, prev_event_id)
);
CREATE INDEX event_edges_prev ON event_edges (prev_event_id, event_id);

-- event_auth_edges: an event's auth_events, both ways likewise.
CREATE TABLE event_auth_edges (
    event_id TEXT NOT NULL,
    auth_id TEXT NOT NULL,
    PRIMARY KEY (event_id, auth_id)
);
CREATE INDEX event_auth_edges_auth ON event_auth_edges (auth_id, event_id);

-- The room's forward extremities: its events with no children yet, which a
-- new local event names as its prev_events.
CREATE TABLE event_forward_extremities (
    room_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    PRIMARY KEY (room_id, event_id)
);

-- Existing rooms were lines: each event's parent is the room's event before
-- it in stream order (what its prev_events, and from version 3 its id,
-- named when it was persisted) ...
INSERT INTO event_edges (event_id, prev_event_id)
SELECT event_id, prev_event_id FROM (
    SELECT event_id,
        LAG(event_id) OVER (PARTITION BY room_id ORDER BY stream_ordering) AS prev_event_id
    FROM events
) AS linear WHERE prev_event_id IS NOT NULL;

-- ... and the room's newest event is its single forward extremity. Their
-- auth_events were empty when persisted (and the ids of versions 3 on hash
-- that), so no auth edges are written for them.
INSERT INTO event_forward_extremities (room_id, event_id)
SELECT room_id, event_id FROM (
    SELECT room_id, event_id,
        ROW_NUMBER() OVER (PARTITION BY room_id ORDER BY stream_ordering DESC) AS newest
    FROM events
) AS ranked WHERE newest = 1;
