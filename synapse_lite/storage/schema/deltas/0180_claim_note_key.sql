-- The public half of the key the main process signs its CHECKED notes with
-- (Redis replication: "I read this stream's sequence at N", which spares
-- every other process the same read; docs/reliability.md, "Who checks").
-- One row, written afresh each time the main process starts with a new key;
-- the private half never leaves the main process's memory. Whoever could
-- change this row could as well move the sequences the notes vouch for.
CREATE TABLE claim_note_key (
    id INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    instance_name TEXT NOT NULL,
    verify_key TEXT NOT NULL,
    updated_ts BIGINT NOT NULL
);
