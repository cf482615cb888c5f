-- Received events' outcomes (docs/event-graph.md#rejected-soft-failed-and-outliers).
--
-- Every event is stored; these say which ones belong to the room as clients
-- and the graph see it. A *rejected* event (refused by the authorisation
-- rules against its own auth events or against the state before it) is in
-- no state, no extremity and nothing served; a *soft-failed* one (allowed
-- by those, refused against the room's current state) is in the graph and
-- its state groups, but not in the current state, the extremities or
-- anything served; an *outlier* (events.outlier, since the first schema)
-- has no state groups. Reads that serve events filter on these columns.
ALTER TABLE events ADD COLUMN rejected BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE events ADD COLUMN soft_failed BOOLEAN NOT NULL DEFAULT FALSE;

-- Why each rejected event was rejected (the rule it broke), for admins and
-- logs; events.rejected is what reads filter on.
CREATE TABLE rejections (
    event_id TEXT NOT NULL PRIMARY KEY,
    reason TEXT NOT NULL,
    rejected_ts BIGINT NOT NULL
);
