-- Which events writer persists each room's events. Chosen when the room is
-- created and kept, so adding an events writer only affects new rooms and
-- processes with different writer lists still agree on existing rooms.
ALTER TABLE rooms ADD COLUMN event_writer TEXT;
