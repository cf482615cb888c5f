-- The media repository (synapse_lite/media/): one row per mxc:// id this
-- server handed out. The file itself is on disk, named by media_id; a row
-- with uploaded_ts NULL is an id from POST /_matrix/media/v1/create still
-- waiting for its content, until unused_expires_at.
CREATE TABLE local_media (
    media_id TEXT NOT NULL PRIMARY KEY,
    user_id TEXT NOT NULL,
    created_ts BIGINT NOT NULL,
    media_type TEXT,
    media_length BIGINT,
    upload_name TEXT,
    uploaded_ts BIGINT,
    unused_expires_at BIGINT
);
CREATE INDEX local_media_pending ON local_media (user_id, unused_expires_at);

-- Thumbnails made of a local upload (pre-generated or on demand), each a
-- file beside it; a row is written only once its file is complete.
CREATE TABLE local_media_thumbnails (
    media_id TEXT NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    method TEXT NOT NULL,
    animated BOOLEAN NOT NULL,
    -- The size the thumbnail really has (never larger than the source).
    actual_width INTEGER NOT NULL,
    actual_height INTEGER NOT NULL,
    media_type TEXT NOT NULL,
    media_length BIGINT NOT NULL,
    PRIMARY KEY (media_id, width, height, method, animated)
);
