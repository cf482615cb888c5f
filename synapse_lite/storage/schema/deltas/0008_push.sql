-- Push notifications (docs/push.md).
--
-- A user's push rules: one JSON document per user holding the rules they
-- added and what they changed of the server-default rules. Each change
-- rewrites the document with a new id of the push_rules stream (one writer,
-- stream_writers.push_rules), so the stream's rows are the users whose rules
-- changed, read in id order.
CREATE TABLE push_rules_user (
    user_id TEXT NOT NULL PRIMARY KEY,
    rules TEXT NOT NULL,
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL
);
CREATE INDEX push_rules_user_stream ON push_rules_user (stream_id);
CREATE SEQUENCE push_rules_stream_sequence;

-- What users' push rules said about an event, written with the event (in
-- the transaction persisting it). Most members of a room get the same
-- outcome, so it is stored on the event's own row: events.push_actions is
-- what the event does for every local member joined when it was sent (but
-- its sender), NULL when it notifies nobody by default; event_push_actions
-- holds a row per member only where that member's outcome differs (notif
-- FALSE: not notified although the others are), or for an invited user.
-- Counts in /sync are the user's notifications after their read receipt
-- (docs/push.md).
ALTER TABLE events ADD COLUMN push_actions TEXT;
ALTER TABLE events ADD COLUMN push_highlight BOOLEAN;

CREATE TABLE event_push_actions (
    room_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    actions TEXT NOT NULL,
    notif BOOLEAN NOT NULL,
    highlight BOOLEAN NOT NULL,
    received_ts BIGINT NOT NULL
);
CREATE UNIQUE INDEX event_push_actions_event_user ON event_push_actions (event_id, user_id);
CREATE INDEX event_push_actions_user_room ON event_push_actions (user_id, room_id, stream_ordering);
CREATE INDEX event_push_actions_user_order ON event_push_actions (user_id, stream_ordering);

-- Pushers: where to deliver a user's notifications (POST /pushers/set). A
-- change rewrites the row under a new id of the pushers stream (one writer,
-- stream_writers.pushers); a removed pusher stays as a row with deleted TRUE,
-- so followers learn of the removal from the stream.
CREATE TABLE pushers (
    user_id TEXT NOT NULL,
    app_id TEXT NOT NULL,
    pushkey TEXT NOT NULL,
    kind TEXT NOT NULL,
    app_display_name TEXT NOT NULL,
    device_display_name TEXT NOT NULL,
    profile_tag TEXT,
    lang TEXT NOT NULL,
    data TEXT NOT NULL,
    deleted BOOLEAN NOT NULL,
    -- Where delivery has got to (stream ordering of the last notification
    -- delivered or given up on), kept by the pusher instance owning it.
    last_stream_ordering BIGINT NOT NULL DEFAULT 0,
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL
);
CREATE UNIQUE INDEX pushers_key ON pushers (app_id, pushkey, user_id);
CREATE INDEX pushers_user ON pushers (user_id);
CREATE INDEX pushers_stream ON pushers (stream_id);
CREATE SEQUENCE pushers_sequence;
