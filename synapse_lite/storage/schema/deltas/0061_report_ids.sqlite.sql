-- Reports get ids (the admin API's /v1/event_reports/{reportId}): assigned
-- by the database on insert. SQLite cannot add such a column: the table is
-- rebuilt with one (an INTEGER PRIMARY KEY is the rowid, assigned on insert),
-- the existing reports numbered in the order they came.
CREATE TABLE content_reports_with_ids (
    id INTEGER PRIMARY KEY,
    reporter TEXT NOT NULL,
    received_ts BIGINT NOT NULL,
    room_id TEXT,
    event_id TEXT,
    reported_user_id TEXT,
    reason TEXT
);
INSERT INTO content_reports_with_ids
    (reporter, received_ts, room_id, event_id, reported_user_id, reason)
SELECT reporter, received_ts, room_id, event_id, reported_user_id, reason
FROM content_reports ORDER BY received_ts;
DROP TABLE content_reports;
ALTER TABLE content_reports_with_ids RENAME TO content_reports;
CREATE INDEX content_reports_received ON content_reports (received_ts);
