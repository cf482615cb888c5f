-- The state at every event (docs/event-graph.md#state-at-every-event).
--
-- A state group is a room state shared by every event that has it: a full
-- snapshot (prev_group NULL, chain_length 0) or a delta against prev_group
-- (the keys it changes), at most MAX_DELTA_CHAIN deltas from a snapshot.
-- A group never loses a key against its prev_group (a state that does is
-- written as a snapshot), so reading a group is: its chain's rows, the
-- newest per key. Ids come from the stream ordering of the event that made
-- the group (2n for the state after event n, 2n - 1 for the resolved state
-- before it): unique across writers without a sequence.
CREATE TABLE state_groups (
    id BIGINT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    prev_group BIGINT,
    chain_length INTEGER NOT NULL
);

CREATE TABLE state_group_state (
    state_group BIGINT NOT NULL,
    type TEXT NOT NULL,
    state_key TEXT NOT NULL,
    event_id TEXT NOT NULL,
    PRIMARY KEY (state_group, type, state_key)
);

-- An event's state before it and after it (the same group for a message).
-- NULL before a create event (the empty state) and for events whose state
-- is unknown (outliers).
ALTER TABLE events ADD COLUMN state_group_before BIGINT;
ALTER TABLE events ADD COLUMN state_group BIGINT;
