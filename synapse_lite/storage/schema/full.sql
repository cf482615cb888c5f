-- The complete schema at version 1, for a new database. Later changes are
-- ordered files in deltas/. One dialect for both engines: "CREATE SEQUENCE x"
-- is turned into the engine's own sequence by the schema loader.

CREATE TABLE schema_version (
    lock CHAR(1) NOT NULL DEFAULT 'X' UNIQUE,
    version INTEGER NOT NULL,
    upgraded_ts BIGINT NOT NULL
);

-- Where each writer of each stream has got to: see storage/id_generators/.
CREATE TABLE stream_positions (
    stream_name TEXT NOT NULL,
    instance_name TEXT NOT NULL,
    stream_id BIGINT NOT NULL
);
CREATE UNIQUE INDEX stream_positions_idx ON stream_positions (stream_name, instance_name);

-- Short numbers for instance names, so stream tokens stay short.
CREATE TABLE stream_instance_ids (
    instance_id INTEGER NOT NULL PRIMARY KEY,
    instance_name TEXT NOT NULL UNIQUE
);

-- Users, devices, access tokens

CREATE TABLE users (
    name TEXT NOT NULL PRIMARY KEY,
    password_hash TEXT,
    creation_ts BIGINT NOT NULL,
    admin BOOLEAN NOT NULL DEFAULT FALSE,
    deactivated BOOLEAN NOT NULL DEFAULT FALSE
);

CREATE TABLE devices (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    display_name TEXT,
    created_ts BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id)
);

-- Only a SHA-256 of each token is stored.
CREATE TABLE access_tokens (
    token_hash TEXT NOT NULL PRIMARY KEY,
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    created_ts BIGINT NOT NULL
);
CREATE INDEX access_tokens_user_device ON access_tokens (user_id, device_id);

CREATE TABLE user_ips (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    ip TEXT NOT NULL,
    user_agent TEXT NOT NULL,
    last_seen BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, ip, user_agent)
);

CREATE TABLE ui_auth_sessions (
    session_id TEXT NOT NULL PRIMARY KEY,
    creation_ts BIGINT NOT NULL,
    completed_stages TEXT NOT NULL
);

CREATE TABLE user_filters (
    user_id TEXT NOT NULL,
    filter_id BIGINT NOT NULL,
    filter_json TEXT NOT NULL,
    PRIMARY KEY (user_id, filter_id)
);

-- Rooms and events

CREATE TABLE rooms (
    room_id TEXT NOT NULL PRIMARY KEY,
    creator TEXT NOT NULL,
    is_public BOOLEAN NOT NULL,
    room_version TEXT NOT NULL,
    creation_ts BIGINT NOT NULL
);

-- stream_ordering: the events stream id (positive), or the backfill stream id
-- (negative). topological_ordering: the event's depth in its room.
CREATE TABLE events (
    stream_ordering BIGINT NOT NULL,
    topological_ordering BIGINT NOT NULL,
    event_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    type TEXT NOT NULL,
    state_key TEXT,
    sender TEXT NOT NULL,
    origin_server_ts BIGINT NOT NULL,
    content TEXT NOT NULL,
    redacts TEXT,
    membership TEXT,
    outlier BOOLEAN NOT NULL DEFAULT FALSE,
    instance_name TEXT NOT NULL
);
CREATE UNIQUE INDEX events_stream_ordering ON events (stream_ordering);
CREATE UNIQUE INDEX events_event_id ON events (event_id);
CREATE INDEX events_room_stream ON events (room_id, stream_ordering);

-- Idempotent sends: one event per (user, device, transaction id).
CREATE TABLE event_txn_ids (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    txn_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    inserted_ts BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, txn_id)
);

CREATE TABLE room_memberships (
    event_id TEXT NOT NULL PRIMARY KEY,
    user_id TEXT NOT NULL,
    sender TEXT NOT NULL,
    room_id TEXT NOT NULL,
    membership TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL
);
CREATE INDEX room_memberships_user_stream ON room_memberships (user_id, stream_ordering);
CREATE INDEX room_memberships_room ON room_memberships (room_id);

CREATE TABLE current_state_events (
    room_id TEXT NOT NULL,
    type TEXT NOT NULL,
    state_key TEXT NOT NULL,
    event_id TEXT NOT NULL,
    membership TEXT,
    PRIMARY KEY (room_id, type, state_key)
);

-- Changes of current state, in the events stream's id space (the stream id
-- of the event that made the change).
CREATE TABLE current_state_delta_stream (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    room_id TEXT NOT NULL,
    type TEXT NOT NULL,
    state_key TEXT NOT NULL,
    event_id TEXT,
    prev_event_id TEXT
);
CREATE INDEX current_state_delta_stream_idx ON current_state_delta_stream (stream_id);

-- Membership of local users, kept with the events that change it.
CREATE TABLE local_current_membership (
    room_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    membership TEXT NOT NULL,
    event_stream_ordering BIGINT NOT NULL
);
CREATE UNIQUE INDEX local_current_membership_idx ON local_current_membership (user_id, room_id);
CREATE INDEX local_current_membership_room ON local_current_membership (room_id);

-- Receipts

CREATE TABLE receipts_linearized (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    room_id TEXT NOT NULL,
    receipt_type TEXT NOT NULL,
    user_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    thread_id TEXT,
    data TEXT NOT NULL
);
CREATE UNIQUE INDEX receipts_linearized_uniq ON receipts_linearized (room_id, receipt_type, user_id);
CREATE INDEX receipts_linearized_stream ON receipts_linearized (stream_id);

-- Account data: one id space over the global, per-room and tag tables.

CREATE TABLE account_data (
    user_id TEXT NOT NULL,
    account_data_type TEXT NOT NULL,
    stream_id BIGINT NOT NULL,
    content TEXT NOT NULL,
    instance_name TEXT NOT NULL
);
CREATE UNIQUE INDEX account_data_uniq ON account_data (user_id, account_data_type);
CREATE INDEX account_data_stream ON account_data (stream_id);

CREATE TABLE room_account_data (
    user_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    account_data_type TEXT NOT NULL,
    stream_id BIGINT NOT NULL,
    content TEXT NOT NULL,
    instance_name TEXT NOT NULL
);
CREATE UNIQUE INDEX room_account_data_uniq ON room_account_data (user_id, room_id, account_data_type);
CREATE INDEX room_account_data_stream ON room_account_data (stream_id);

CREATE TABLE room_tags (
    user_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    tag TEXT NOT NULL,
    content TEXT NOT NULL,
    PRIMARY KEY (user_id, room_id, tag)
);

CREATE TABLE room_tags_revisions (
    user_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL
);
CREATE UNIQUE INDEX room_tags_revisions_uniq ON room_tags_revisions (user_id, room_id);
CREATE INDEX room_tags_revisions_stream ON room_tags_revisions (stream_id);

-- To-device messages: local inboxes and the outbox to other servers share the
-- to_device stream; the outbox row is written in the same transaction.

CREATE TABLE device_inbox (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    stream_id BIGINT NOT NULL,
    message_json TEXT NOT NULL,
    instance_name TEXT NOT NULL
);
CREATE INDEX device_inbox_user_stream ON device_inbox (user_id, device_id, stream_id);
CREATE INDEX device_inbox_stream ON device_inbox (stream_id);

CREATE TABLE device_federation_outbox (
    destination TEXT NOT NULL,
    stream_id BIGINT NOT NULL,
    queued_ts BIGINT NOT NULL,
    messages_json TEXT NOT NULL,
    instance_name TEXT NOT NULL
);
CREATE INDEX device_federation_outbox_dest ON device_federation_outbox (destination, stream_id);
CREATE INDEX device_federation_outbox_stream ON device_federation_outbox (stream_id);

CREATE TABLE device_federation_inbox (
    origin TEXT NOT NULL,
    message_id TEXT NOT NULL,
    received_ts BIGINT NOT NULL,
    PRIMARY KEY (origin, message_id)
);

-- Presence: the latest state of each user, at the stream id that set it.

CREATE TABLE presence_stream (
    stream_id BIGINT NOT NULL,
    user_id TEXT NOT NULL,
    state TEXT NOT NULL,
    last_active_ts BIGINT NOT NULL,
    last_federation_update_ts BIGINT NOT NULL,
    last_user_sync_ts BIGINT NOT NULL,
    status_msg TEXT,
    currently_active BOOLEAN NOT NULL,
    instance_name TEXT NOT NULL
);
CREATE UNIQUE INDEX presence_stream_user ON presence_stream (user_id);
CREATE INDEX presence_stream_id ON presence_stream (stream_id);

-- Device lists

CREATE TABLE device_lists_stream (
    stream_id BIGINT NOT NULL,
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    instance_name TEXT NOT NULL
);
CREATE INDEX device_lists_stream_id ON device_lists_stream (stream_id);
CREATE INDEX device_lists_stream_user ON device_lists_stream (user_id, stream_id);

-- Cache invalidations, written in the transaction of the change they describe.
-- keys: a JSON list, or NULL to invalidate the whole cache.

CREATE TABLE cache_invalidation_stream_by_instance (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    cache_func TEXT NOT NULL,
    keys TEXT,
    invalidation_ts BIGINT NOT NULL
);
CREATE UNIQUE INDEX cache_invalidation_stream_by_instance_id
    ON cache_invalidation_stream_by_instance (stream_id);
CREATE INDEX cache_invalidation_stream_by_instance_instance
    ON cache_invalidation_stream_by_instance (instance_name, stream_id);

-- Federation

CREATE TABLE server_keys (
    server_name TEXT NOT NULL,
    key_id TEXT NOT NULL,
    verify_key TEXT NOT NULL,
    valid_until_ts BIGINT NOT NULL,
    fetched_ts BIGINT NOT NULL,
    PRIMARY KEY (server_name, key_id)
);

CREATE TABLE received_transactions (
    origin TEXT NOT NULL,
    transaction_id TEXT NOT NULL,
    response_json TEXT NOT NULL,
    received_ts BIGINT NOT NULL,
    PRIMARY KEY (origin, transaction_id)
);

-- Outbound delivery state per remote server. last_sent_stream_id: the to_device
-- stream id up to which the outbox has been delivered.
CREATE TABLE destinations (
    destination TEXT NOT NULL PRIMARY KEY,
    retry_last_ts BIGINT NOT NULL DEFAULT 0,
    retry_interval BIGINT NOT NULL DEFAULT 0,
    failure_ts BIGINT,
    last_sent_stream_id BIGINT NOT NULL DEFAULT 0
);

CREATE SEQUENCE events_stream_seq;
CREATE SEQUENCE events_backfill_stream_seq;
CREATE SEQUENCE cache_invalidation_stream_seq;
CREATE SEQUENCE receipts_sequence;
CREATE SEQUENCE account_data_sequence;
CREATE SEQUENCE device_inbox_sequence;
CREATE SEQUENCE presence_stream_sequence;
CREATE SEQUENCE device_lists_sequence;
CREATE SEQUENCE stream_instance_id_seq;
