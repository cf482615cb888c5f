-- Each process as it last started: where it answers internal HTTP requests and
-- whether it writes the events stream. Processes read it when they meet an
-- events writer their config does not list, so an events writer can be added
-- or removed without restarting every process (docs/workers.md).
CREATE TABLE instances (
    instance_name TEXT NOT NULL PRIMARY KEY,
    replication_host TEXT,
    replication_port INTEGER,
    writes_events BOOLEAN NOT NULL,
    updated_ts BIGINT NOT NULL
);
