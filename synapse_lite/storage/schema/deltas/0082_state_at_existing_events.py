"""Schema version 82: the state before and after every event of a database
written before state groups (linear rooms), derived by replaying each room
in stream order (docs/event-graph.md#migration-of-the-state)."""

from synapse_lite.storage.databases.main.state_groups import derive_state_groups_txn

run_upgrade = derive_state_groups_txn
