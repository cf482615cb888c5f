"""Requests between processes that need an answer, over authenticated HTTP.

Each endpoint is an :class:`~.calls.InternalCall` declared once, with its
request and response types (attrs classes whose fields declare their kinds,
carried by ``synapse_lite/codec/``), served under
``/_synapse/replication/<name>`` by the process that owns the work (a
stream's writer, the main process) and made through
:class:`~.calls.InternalCalls`.
"""
