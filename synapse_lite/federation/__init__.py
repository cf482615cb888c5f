"""Server-to-server federation: identity, transport, inbound and outbound.

* ``crypto.py``: canonical JSON, unpadded base64, ed25519 signing keys.
* ``auth.py``: the ``X-Matrix`` request signature.
* ``keyring.py``: our key document and remote servers' keys (fetched, cached).
* ``client.py`` / ``server.py``: HTTP to and from other servers.
* ``inbound.py``: what a received transaction does.
* ``send_queue.py``: the main process's federation stream, when a worker sends.
* ``sender/``: the federation sender (per-destination transactions, backoff).

``docs/federation.md`` tells the whole story.
"""
