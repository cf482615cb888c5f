-- Whether a process's recorded internal HTTP address answers with TLS, so a
-- process that learns of it from this table (an events writer added while it
-- runs) calls it the right way (docs/deployment.md).
ALTER TABLE instances ADD COLUMN replication_tls BOOLEAN NOT NULL DEFAULT FALSE;
