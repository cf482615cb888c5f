-- Other servers' media, fetched over federation for our users and cached by
-- the media instance (synapse_lite/media/remote.py). The file is on disk,
-- named by filesystem_id (ours, never the other server's id); a row is
-- written only once its file is complete.
CREATE TABLE remote_media_cache (
    media_origin TEXT NOT NULL,
    media_id TEXT NOT NULL,
    filesystem_id TEXT NOT NULL,
    media_type TEXT NOT NULL,
    media_length BIGINT NOT NULL,
    upload_name TEXT,
    created_ts BIGINT NOT NULL,
    -- Kept current (coarsely) by downloads; purge_media_cache goes by it.
    last_access_ts BIGINT NOT NULL,
    PRIMARY KEY (media_origin, media_id)
);
CREATE INDEX remote_media_cache_last_access ON remote_media_cache (last_access_ts);

-- Thumbnails made here of cached remote media, as local_media_thumbnails.
CREATE TABLE remote_media_cache_thumbnails (
    media_origin TEXT NOT NULL,
    media_id TEXT NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    method TEXT NOT NULL,
    animated BOOLEAN NOT NULL,
    actual_width INTEGER NOT NULL,
    actual_height INTEGER NOT NULL,
    media_type TEXT NOT NULL,
    media_length BIGINT NOT NULL,
    PRIMARY KEY (media_origin, media_id, width, height, method, animated)
);
