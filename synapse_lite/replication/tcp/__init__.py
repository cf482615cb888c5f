"""The replication line protocol and its two transports.

* ``commands.py``: every wire command, parsed and serialised side by side
  (``wire_fields.py``: the rules for each kind of field).
* ``connection.py``: what transports and the command handler promise each other.
* ``protocol.py``: direct TCP framing and connection lifecycle, shared by
  ``tcp_server.py`` (the main process listens, authenticates workers and relays
  what one worker sends to the others) and ``tcp_client.py`` (workers connect
  and reconnect). ``clock.py`` types the injected clock.
* ``redis.py``: Redis pub/sub, every process a peer on one channel
  (``redis_connections.py`` keeps its two Redis connections up).
* ``handler.py``: what a process does with the commands it receives.
* ``streamer.py``: what a process sends for the streams it writes.
* ``streams/``: the streams, their row types and update functions.
"""
