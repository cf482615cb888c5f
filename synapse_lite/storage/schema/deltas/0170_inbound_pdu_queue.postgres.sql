-- PDUs of received transactions waiting for their room's writer
-- (docs/federation.md, "Inbound: the durable queue"): written by the
-- process that answered /send, before it answered 200; moved to
-- received_pdus in the transaction that persists the event, or deleted
-- when the writer refuses it. queue_id (from a sequence) orders a room's PDUs.
CREATE TABLE inbound_pdu_queue (
    queue_id BIGSERIAL PRIMARY KEY,
    event_id TEXT NOT NULL UNIQUE,
    room_id TEXT NOT NULL,
    origin TEXT NOT NULL,
    pdu_json TEXT NOT NULL,
    received_ts BIGINT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX inbound_pdu_queue_room ON inbound_pdu_queue (room_id, queue_id);
