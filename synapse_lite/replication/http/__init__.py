"""Requests between processes that need an answer, over authenticated HTTP.

Each endpoint is a :class:`ReplicationEndpoint` served under
``/_synapse/replication/<NAME>`` by the process that owns the work (a stream's
writer, the main process) and called with :class:`ReplicationClient`.
"""
