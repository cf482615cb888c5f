-- Reports get ids (the admin API's /v1/event_reports/{reportId}): assigned
-- by the database on insert; the existing reports are numbered as they are
-- added to the column.
ALTER TABLE content_reports ADD COLUMN id BIGSERIAL PRIMARY KEY;
