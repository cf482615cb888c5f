"""Routing client requests to the process that serves them.

* ``table.py``: the routing table, derived from the servlets' declarations
  (``rest/client/served_by.py``), the config and the stream catalog;
* ``formats.py``: the table as JSON, or as nginx and haproxy configurations
  (``synapse-lite routes``);
* the built-in router, a process of its own on the client port: ``relay.py``
  (client connections), ``exchange.py`` (one request relayed, streamed both
  ways, repeated elsewhere when its process fails), ``pool.py`` (kept-alive
  connections to the processes), ``http1.py`` (just enough HTTP/1.1),
  ``backends.py`` (the processes and their health), ``room_writers.py`` (each
  room's events writer, kept current over replication) and ``router.py``
  (choosing the process for a request).

``docs/routing.md`` describes all of it.
"""
