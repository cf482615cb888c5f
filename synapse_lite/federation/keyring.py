"""Server keys: the document we publish, and other servers' keys.

A remote key is looked up in memory, then in ``server_keys``; when it is
unknown or past its ``valid_until_ts`` the origin's ``GET /_matrix/key/v2/server``
is fetched, its self-signatures checked (every listed key must have signed the
document), and every key cached with the document's validity. Concurrent
lookups for one server share one fetch, and a server is fetched at most once
per :data:`MIN_REFETCH_SECONDS`: a stream of requests naming made-up key ids
cannot make us hammer anyone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from synapse_lite.federation.client import FederationRequestError
from synapse_lite.federation.crypto import SignatureError, sign_json, verify_signed_json

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.federation import FederationConfig
    from synapse_lite.federation.client import FederationClient
    from synapse_lite.federation.crypto import SigningKey
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

KEY_PATH = "/_matrix/key/v2/server"
MIN_REFETCH_SECONDS = 5.0


class KeyLookupError(Exception):
    """No valid key ``key_id`` of a server could be found."""


class Keyring:
    """Our key document and the verify keys of other servers."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        config: FederationConfig,
        client: FederationClient,
        signing_key: SigningKey,
        server_name: str,
    ) -> None:
        self._store = store
        self._clock = clock
        self._config = config
        self._client = client
        self._signing_key = signing_key
        self._server_name = server_name
        #: server -> key_id -> (verify key, valid_until_ts)
        self._cache: dict[str, dict[str, tuple[str, int]]] = {}
        #: Servers being fetched -> lookups waiting for that fetch.
        self._fetches: dict[str, list[defer.Deferred[None]]] = {}
        self._last_fetch: dict[str, float] = {}

    def local_key_document(self) -> dict[str, Any]:
        """``GET /_matrix/key/v2/server``: our verify key, self-signed."""
        key = self._signing_key
        validity_ms = int(self._config.key_validity_seconds * 1000)
        document = {
            "server_name": self._server_name,
            "verify_keys": {key.key_id: {"key": key.verify_key_base64}},
            "old_verify_keys": {},
            "valid_until_ts": self._clock.time_msec() + validity_ms,
        }
        return sign_json(document, self._server_name, key)

    async def get_verify_key(self, server_name: str, key_id: str) -> str:
        """The base64 verify key ``key_id`` of ``server_name``, valid now."""
        if server_name == self._server_name:
            key = self._signing_key
            if key_id == key.key_id:
                return key.verify_key_base64
            raise KeyLookupError(f"we have no key {key_id}")
        found = self._valid(server_name, key_id)
        if found is None:
            self._cache[server_name] = await self._store.get_server_keys(server_name)
            found = self._valid(server_name, key_id)
        if found is None:
            await self._fetch(server_name)
            found = self._valid(server_name, key_id)
        if found is None:
            raise KeyLookupError(f"{server_name} has no valid key {key_id}")
        return found

    def _valid(self, server_name: str, key_id: str) -> str | None:
        entry = self._cache.get(server_name, {}).get(key_id)
        if entry is None or entry[1] <= self._clock.time_msec():
            return None
        return entry[0]

    async def _fetch(self, server_name: str) -> None:
        waiting = self._fetches.get(server_name)
        if waiting is not None:
            waiter: defer.Deferred[None] = defer.Deferred()
            waiting.append(waiter)
            await waiter
            return
        now = self._clock.time()
        if now - self._last_fetch.get(server_name, -MIN_REFETCH_SECONDS) < MIN_REFETCH_SECONDS:
            return
        self._last_fetch[server_name] = now
        self._fetches[server_name] = []
        try:
            await self._fetch_and_store(server_name)
        except (FederationRequestError, SignatureError, ValueError) as e:
            logger.warning("Fetching the keys of %s failed: %s", server_name, e)
        finally:
            for waiter in self._fetches.pop(server_name):
                waiter.callback(None)

    async def _fetch_and_store(self, server_name: str) -> None:
        document = await self._client.get_json(server_name, KEY_PATH, signed=False)
        keys, valid_until = parse_key_document(document, server_name)
        await self._store.store_server_keys(server_name, keys, valid_until)
        self._cache.setdefault(server_name, {}).update(
            {key_id: (key, valid_until) for key_id, key in keys.items()}
        )
        logger.info(
            "Fetched the keys of %s: %s (valid until %d)", server_name, ", ".join(keys), valid_until
        )


def parse_key_document(document: Any, server_name: str) -> tuple[dict[str, str], int]:
    """``(key_id -> verify key, valid_until_ts)`` from a key document that
    ``server_name`` signed with every key it lists; ``ValueError`` or
    :class:`SignatureError` otherwise."""
    if not isinstance(document, dict):
        raise ValueError("the key document is not an object")
    if document.get("server_name") != server_name:
        raise ValueError(f"the key document is for {document.get('server_name')!r}")
    verify_keys = document.get("verify_keys")
    valid_until = document.get("valid_until_ts")
    if not isinstance(verify_keys, dict) or not verify_keys:
        raise ValueError("the key document lists no verify_keys")
    if isinstance(valid_until, bool) or not isinstance(valid_until, int):
        raise ValueError("valid_until_ts must be an integer")
    keys: dict[str, str] = {}
    for key_id, entry in verify_keys.items():
        if not key_id.startswith("ed25519:") or not isinstance(entry, dict):
            continue
        key = entry.get("key")
        if not isinstance(key, str):
            raise ValueError(f"verify key {key_id} has no 'key'")
        verify_signed_json(document, server_name, key_id, key)
        keys[key_id] = key
    if not keys:
        raise ValueError("the key document lists no ed25519 key")
    return keys, valid_until
