-- The auth chain index (docs/event-graph.md#the-stored-auth-chain-index):
-- auth chains and auth differences answered from positions and links
-- instead of walking event_auth_edges event by event.
--
-- event_auth_chains: each state event's position (chain, sequence). A chain
-- is a run of events of one state key in one room, each citing the one
-- before it as an auth event; its id is the stream ordering of its first
-- event (unique across the events writers, so no sequence is needed).
-- Messages are never auth events nor in state sets: they have no position.
CREATE TABLE event_auth_chains (
    event_id TEXT NOT NULL PRIMARY KEY,
    chain_id BIGINT NOT NULL,
    sequence_number BIGINT NOT NULL
);
CREATE UNIQUE INDEX event_auth_chains_position
    ON event_auth_chains (chain_id, sequence_number);

-- event_auth_chain_links: an auth event in another chain than its event's,
-- as positions: (origin chain, origin sequence) cites (target chain, target
-- sequence). Read by origin chain.
CREATE TABLE event_auth_chain_links (
    origin_chain_id BIGINT NOT NULL,
    origin_sequence_number BIGINT NOT NULL,
    target_chain_id BIGINT NOT NULL,
    target_sequence_number BIGINT NOT NULL
);
CREATE INDEX event_auth_chain_links_origin
    ON event_auth_chain_links (origin_chain_id, origin_sequence_number);
