"""Rooms as event graphs: the pure core (issue 30).

Functions over plain values, with no database, reactor or clock, that the
storage and a room's writer call (see docs/event-graph.md):

* :mod:`~synapse_lite.event_graph.pdu`: :class:`Pdu`, an event as the graph
  sees it, read from its server-server form.
* :mod:`~synapse_lite.event_graph.hashing`: content hashes, reference hashes
  and event ids, signing and verifying events.
* :mod:`~synapse_lite.event_graph.authorisation`: which auth events an event
  cites, and the spec's authorisation rules of room versions 1 to 12.
* :mod:`~synapse_lite.event_graph.state_resolution`: state resolution v1 and
  v2 (with version 12's changes).
* :mod:`~synapse_lite.event_graph.auth_chain_index`: auth chains and auth
  differences from chain positions (a chain cover index).
* :mod:`~synapse_lite.event_graph.graph`: a new event's parents and depth,
  the forward extremities and the state after it.
"""
