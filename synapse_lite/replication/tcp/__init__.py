"""The replication line protocol and its two transports.

* ``commands.py``: every wire command, parsed and serialised side by side.
* ``connection.py``: what transports and the command handler promise each other.
* ``protocol.py``: direct TCP (main process listens, workers connect; the main
  process relays what one worker publishes to the others).
* ``redis.py``: Redis pub/sub, every process a peer on one channel.
* ``handler.py``: what a process does with the commands it receives.
* ``streamer.py``: what a process sends for the streams it writes.
* ``streams/``: the streams, their row types and update functions.
"""
