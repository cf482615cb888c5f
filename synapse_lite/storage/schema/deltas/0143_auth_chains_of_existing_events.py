"""Schema version 143: the auth chain index of a database's existing state
events, room by room (docs/event-graph.md#the-stored-auth-chain-index)."""

from synapse_lite.storage.databases.main.auth_chains import index_existing_events_txn

run_upgrade = index_existing_events_txn
