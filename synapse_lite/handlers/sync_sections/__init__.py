"""The sections of the /sync response, one concept per module.

``request.py`` holds what every section reads (:class:`SyncRequest`) and
writes (:class:`SyncResponse`), and the :class:`SyncSection` protocol;
``builtin.py`` lists the spec's sections in the order they run;
``stream_parts.py`` turns the /sync parts of streams added later into
sections. The sync handler (``handlers/sync.py``) runs them.
"""
