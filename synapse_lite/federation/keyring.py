"""Server keys: the document we publish, other servers' keys, the notary.

A remote key is looked up in memory, then in ``server_keys``; when it is
unknown or past its ``valid_until_ts`` the origin's ``GET /_matrix/key/v2/server``
is fetched, its self-signatures checked (every listed key must have signed the
document), and every key cached with the document's validity; its
``old_verify_keys`` are cached valid until their ``expired_ts`` (they verify
what was signed before then: old events, never a request now). When the origin
cannot be fetched or does not list the key, each of
``federation.trusted_key_servers`` is asked in turn
(``POST /_matrix/key/v2/query``): an answer counts when the origin signed it
and the notary did too, with the key configured for it (or its own published
key when none is configured). Concurrent lookups for one server share one
fetch, and a server is fetched at most once per :data:`MIN_REFETCH_SECONDS`:
a stream of requests naming made-up key ids cannot make us hammer anyone.

As a notary we answer with the newest document we hold of a server (fetched
again first when it is valid for less than asked), as it signed it, with our
signature added; for ourselves, our own document.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from synapse_lite.federation.client import FederationRequestError
from synapse_lite.federation.crypto import SignatureError, sign_json, verify_signed_json

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.federation import FederationConfig, TrustedKeyServer
    from synapse_lite.federation.client import FederationClient
    from synapse_lite.federation.crypto import SigningKey
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

KEY_PATH = "/_matrix/key/v2/server"
QUERY_PATH = "/_matrix/key/v2/query"
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
        #: Our own old keys as published (``federation.old_verify_keys``).
        self._old_keys = dict(config.old_verify_keys)

    def local_key_document(self) -> dict[str, Any]:
        """``GET /_matrix/key/v2/server``: our verify key, self-signed."""
        key = self._signing_key
        validity_ms = int(self._config.key_validity_seconds * 1000)
        document = {
            "server_name": self._server_name,
            "verify_keys": {key.key_id: {"key": key.verify_key_base64}},
            "old_verify_keys": {
                key_id: {"key": old, "expired_ts": expired}
                for key_id, (old, expired) in self._old_keys.items()
            },
            "valid_until_ts": self._clock.time_msec() + validity_ms,
        }
        return sign_json(document, self._server_name, key)

    async def get_verify_key(
        self, server_name: str, key_id: str, valid_at_ms: int | None = None
    ) -> str:
        """The base64 verify key ``key_id`` of ``server_name``, valid now
        (a request's signature) or, with ``valid_at_ms``, at that time (an
        event's: an old key verifies what was signed before it expired)."""
        at = self._clock.time_msec() if valid_at_ms is None else valid_at_ms
        if server_name == self._server_name:
            key = self._signing_key
            if key_id == key.key_id:
                return key.verify_key_base64
            old = self._old_keys.get(key_id)
            if old is not None and old[1] > at:
                return old[0]
            raise KeyLookupError(f"we have no key {key_id} valid then")
        found = self._valid(server_name, key_id, at)
        if found is None:
            self._cache[server_name] = await self._store.get_server_keys(server_name)
            found = self._valid(server_name, key_id, at)
        if found is None:
            await self._fetch(server_name, key_id)
            found = self._valid(server_name, key_id, at)
        if found is None:
            raise KeyLookupError(f"{server_name} has no valid key {key_id}")
        return found

    def _valid(self, server_name: str, key_id: str, at: int) -> str | None:
        entry = self._cache.get(server_name, {}).get(key_id)
        if entry is None or entry[1] <= at:
            return None
        return entry[0]

    async def notary_documents(
        self, server_name: str, minimum_valid_until_ts: int = 0
    ) -> list[dict[str, Any]]:
        """What we answer as a notary for ``server_name``: its newest key
        document, fetched again first when it expires before
        ``minimum_valid_until_ts`` (or now), with our signature added; none
        when we have none."""
        if server_name == self._server_name:
            return [self.local_key_document()]
        document = await self._store.get_server_key_json(server_name)
        wanted = max(minimum_valid_until_ts, self._clock.time_msec())
        if document is None or document.get("valid_until_ts", 0) < wanted:
            await self._fetch(server_name, None)
            document = await self._store.get_server_key_json(server_name)
        if document is None:
            return []
        return [sign_json(document, self._server_name, self._signing_key)]

    async def _fetch(self, server_name: str, key_id: str | None) -> None:
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
            found: set[str] = set()
            try:
                document = await self._client.get_json(server_name, KEY_PATH, signed=False)
                found = await self._store_document(server_name, document, "itself")
            except (FederationRequestError, SignatureError, ValueError) as e:
                logger.warning("Fetching the keys of %s failed: %s", server_name, e)
            if (not found or (key_id is not None and key_id not in found)) and (
                self._config.trusted_key_servers
            ):
                await self._ask_notaries(server_name, key_id)
        finally:
            for waiter in self._fetches.pop(server_name):
                waiter.callback(None)

    async def _ask_notaries(self, server_name: str, key_id: str | None) -> None:
        # Naming the key (and a validity) makes Synapse's notary fetch it
        # when it has no copy; asked for "all keys" it answers from its cache
        # only. Synapse also requires the (spec-optional) field to be present.
        criteria: dict[str, Any] = {}
        if key_id is not None:
            criteria[key_id] = {"minimum_valid_until_ts": self._clock.time_msec()}
        for notary in self._config.trusted_key_servers:
            if notary.server_name == server_name:
                continue
            try:
                answer = await self._client.post_json(
                    notary.server_name,
                    QUERY_PATH,
                    {"server_keys": {server_name: criteria}},
                    signed=False,
                )
                documents = answer.get("server_keys") if isinstance(answer, dict) else None
                if not isinstance(documents, list):
                    raise ValueError("the answer has no server_keys list")
                stored = False
                for document in documents:
                    if isinstance(document, dict) and document.get("server_name") == server_name:
                        await self._check_notary_signature(notary, document)
                        await self._store_document(server_name, document, notary.server_name)
                        stored = True
                if stored:
                    return
                logger.warning("Notary %s has no keys of %s", notary.server_name, server_name)
            except (FederationRequestError, SignatureError, KeyLookupError, ValueError) as e:
                logger.warning(
                    "Asking notary %s for the keys of %s failed: %s",
                    notary.server_name,
                    server_name,
                    e,
                )

    async def _check_notary_signature(
        self, notary: TrustedKeyServer, document: dict[str, Any]
    ) -> None:
        signatures = document.get("signatures", {}).get(notary.server_name)
        if not isinstance(signatures, dict) or not signatures:
            raise SignatureError(f"the document is not signed by notary {notary.server_name}")
        if notary.verify_keys:
            usable = [k for k in signatures if k in notary.verify_keys]
            if not usable:
                raise SignatureError(
                    f"notary {notary.server_name} signed with {', '.join(signatures)}, none of"
                    " the keys configured for it"
                )
            verify_signed_json(
                document, notary.server_name, usable[0], notary.verify_keys[usable[0]]
            )
            return
        key_id = sorted(signatures)[0]
        key = await self.get_verify_key(notary.server_name, key_id)
        verify_signed_json(document, notary.server_name, key_id, key)

    async def _store_document(self, server_name: str, document: Any, source: str) -> set[str]:
        """Check and cache a key document; the key ids it holds."""
        keys, valid_until = parse_key_document(document, server_name)
        entries = {key_id: (key, valid_until) for key_id, key in keys.items()}
        for key_id, entry in old_keys_of(document).items():
            entries.setdefault(key_id, entry)
        # As served to others when we are a notary: the origin's own
        # signatures only.
        own = {**document, "signatures": {server_name: document["signatures"][server_name]}}
        await self._store.store_server_keys(server_name, entries, own, valid_until)
        self._cache.setdefault(server_name, {}).update(entries)
        logger.info(
            "Fetched the keys of %s from %s: %s (valid until %d)",
            server_name,
            source,
            ", ".join(entries),
            valid_until,
        )
        return set(entries)


def old_keys_of(document: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """``key_id -> (verify key, expired_ts)`` of a checked key document's
    ``old_verify_keys``; malformed entries are left out."""
    old = document.get("old_verify_keys")
    result: dict[str, tuple[str, int]] = {}
    if not isinstance(old, dict):
        return result
    for key_id, entry in old.items():
        if not isinstance(key_id, str) or not key_id.startswith("ed25519:"):
            continue
        if not isinstance(entry, dict):
            continue
        key, expired = entry.get("key"), entry.get("expired_ts")
        if isinstance(key, str) and isinstance(expired, int) and not isinstance(expired, bool):
            result[key_id] = (key, expired)
    return result


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
