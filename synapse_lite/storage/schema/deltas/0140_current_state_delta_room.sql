-- Sliding sync's StateStubs read a room's state deltas since a position
-- (docs/sliding-sync.md): without this index a connection resumed after a
-- long gap scanned every room's deltas since then, once per room it resent.
CREATE INDEX current_state_delta_stream_room
    ON current_state_delta_stream (room_id, stream_id);
