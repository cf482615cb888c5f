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

-- What the user's rules said to do about an event, written in the
-- transaction that persists the event (one row per local member the event
-- notifies). Counts in /sync are the rows after the user's read receipt.
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
CREATE INDEX event_push_actions_user_room ON event_push_actions (user_id, room_id, stream_ordering);
CREATE INDEX event_push_actions_user_order ON event_push_actions (user_id, stream_ordering);
