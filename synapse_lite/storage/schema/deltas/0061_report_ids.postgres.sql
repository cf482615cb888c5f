-- Reports get ids (the admin API's /v1/event_reports/{reportId}): assigned
-- by the database on insert, from a sequence; the existing reports are
-- numbered in the order they came (as SQLite's file does).
ALTER TABLE content_reports ADD COLUMN id BIGINT;
UPDATE content_reports SET id = numbered.n
FROM (SELECT ctid AS row_ref, ROW_NUMBER() OVER (ORDER BY received_ts, ctid) AS n
      FROM content_reports) AS numbered
WHERE content_reports.ctid = numbered.row_ref;
CREATE SEQUENCE content_reports_id_seq;
SELECT setval('content_reports_id_seq', (SELECT COALESCE(MAX(id), 0) + 1 FROM content_reports), false);
ALTER TABLE content_reports ALTER COLUMN id SET DEFAULT nextval('content_reports_id_seq');
ALTER TABLE content_reports ADD PRIMARY KEY (id);
