-- Events other servers made, as they sent them (docs/federation.md,
-- "Rooms: serving"): their signatures, hashes and any keys we do not model
-- are part of what their ids and signatures cover, so we serve them back
-- byte-for-byte equivalent instead of rebuilding them from the events row.
-- Written before the event is persisted (a row whose event never was is
-- harmless: nothing reads it without the events row).
CREATE TABLE received_pdus (
    event_id TEXT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    origin TEXT NOT NULL,
    pdu_json TEXT NOT NULL
);
