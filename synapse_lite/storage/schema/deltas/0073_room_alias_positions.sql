-- The events stream position when each alias was made: the application
-- service sender judges an event by the aliases its room had when the event
-- was written (docs/appservices.md). Aliases made before this column count
-- as always there (0).
ALTER TABLE room_aliases ADD COLUMN stream_ordering BIGINT NOT NULL DEFAULT 0;
