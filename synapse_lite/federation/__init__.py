"""Server-to-server federation: identity, transport, inbound and outbound.

* ``crypto.py``: canonical JSON, unpadded base64, ed25519 signing keys.
* ``auth.py``: the ``X-Matrix`` request signature.
* ``keyring.py``: our key document, remote servers' keys (fetched, cached,
  old ones kept), notaries asked and the notary we are.
* ``discovery.py``: where a server name is (``.well-known``, SRV, 8448).
* ``connect.py``: connections to it (address checks, TLS and SNI, SRV lookups).
* ``client.py`` / ``server.py``: HTTP to and from other servers.
* ``queries.py``: profiles and aliases of other servers, for our clients.
* ``inbound.py``: what a received transaction does.
* ``send_queue.py``: the main process's federation stream, when a worker sends.
* ``sender/``: the federation sender (per-destination transactions, backoff).

``docs/federation.md`` tells the whole story.
"""
