-- Quarantined media (the admin API): never served again by any process.
--   quarantined_by: the admin who quarantined it (NULL: not quarantined);
--   safe_from_quarantine: protected from the quarantine of a whole room's
--     or user's media (POST /_synapse/admin/v1/media/protect/{mediaId}).
ALTER TABLE local_media ADD COLUMN quarantined_by TEXT;
ALTER TABLE local_media ADD COLUMN safe_from_quarantine BOOLEAN NOT NULL DEFAULT FALSE;
