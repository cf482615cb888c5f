-- How far each application service has been sent the events stream
-- (docs/application-services.md#transactions). ``stream_position``: every
-- event at or below it that concerns the service was acknowledged by it;
-- ``last_txn_id``: the id of the last transaction it acknowledged. While a
-- transaction is being sent, ``pending_txn_id``, ``pending_upto`` and
-- ``pending_event_ids`` (a JSON list) say which: the events it carries and
-- the position it completes. A restart sends exactly those again under the
-- same id, so the service, which ignores a transaction id it has seen, gets
-- each event once.
CREATE TABLE application_services_state (
    as_id TEXT NOT NULL PRIMARY KEY,
    stream_position BIGINT NOT NULL,
    last_txn_id BIGINT NOT NULL,
    pending_txn_id BIGINT,
    pending_upto BIGINT,
    pending_event_ids TEXT
);
