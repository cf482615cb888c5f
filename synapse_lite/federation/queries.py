"""Questions our clients ask about other servers' users and aliases, asked of
those servers: ``GET /_matrix/federation/v1/query/profile`` and
``/query/directory``.

Any process serving the client API may ask. One that takes part in
federation anyway uses its federation client; another (a client worker)
makes its own on the first question, reading the signing key the main
process created. Answers are checked before they are used: a server answers
for its own users and aliases only, in the shapes the spec gives.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.federation.client import FederationClient, FederationRequestError
from synapse_lite.federation.crypto import SigningKeyFileError, load_or_create_signing_key
from synapse_lite.federation.discovery import ServerNameError, parse_server_name

if TYPE_CHECKING:
    from synapse_lite.config.federation import FederationConfig

logger = logging.getLogger(__name__)

QUERY_PREFIX = "/_matrix/federation/v1/query"
PROFILE_FIELDS = ("displayname", "avatar_url")


class RemoteUnavailable(SynapseError):
    """The other server could not be asked, or answered nonsense: for our
    client a 404 saying why (the profile or alias is not to be had here; a
    client-API answer is never a 5xx for what a user can name)."""

    def __init__(self, server: str, why: str) -> None:
        super().__init__(
            404, f"Not found: no answer could be had from {server}: {why}", Codes.NOT_FOUND
        )


class FederationQueries:
    """Profile and alias lookups on other servers."""

    def __init__(self, get_client: Callable[[], FederationClient]) -> None:
        self._get_client = get_client

    @classmethod
    def on_demand(
        cls, config: FederationConfig, data_dir: str, reactor: Any, server_name: str
    ) -> tuple[FederationQueries, Callable[[], Any]]:
        """Queries with a client made at the first question; and what closes
        that client (if it was made) at shutdown."""
        made: list[FederationClient] = []

        def get_client() -> FederationClient:
            if not made:
                try:
                    key = load_or_create_signing_key(data_dir, create=False)
                except SigningKeyFileError as e:
                    raise SynapseError(503, str(e), Codes.UNKNOWN) from e
                made.append(FederationClient(config, reactor, key, server_name))
            return made[0]

        async def close() -> None:
            for client in made:
                await client.close()

        return cls(get_client), close

    def client(self) -> FederationClient:
        """The federation client these queries use (made now if it was not:
        503 when the signing key does not exist yet)."""
        return self._get_client()

    async def _ask(self, server: str, path: str) -> Any:
        try:
            parse_server_name(server)
        except ServerNameError as e:
            raise SynapseError(400, f"Not a valid server name: {e}", Codes.INVALID_PARAM) from e
        try:
            return await self._get_client().get_json(server, path)
        except FederationRequestError as e:
            if e.code == 404:
                raise NotFoundError(f"{server} does not know it") from e
            logger.info("A query to %s failed: %s", server, e)
            raise RemoteUnavailable(server, str(e)) from e

    async def profile(self, user_id: str, field: str | None = None) -> dict[str, Any]:
        """``user_id``'s profile from its server (only ``field`` with one)."""
        server = user_id.split(":", 1)[1]
        query = {"user_id": user_id, **({"field": field} if field else {})}
        answer = await self._ask(server, f"{QUERY_PREFIX}/profile?{urllib.parse.urlencode(query)}")
        if not isinstance(answer, dict):
            raise RemoteUnavailable(server, "the profile is not a JSON object")
        profile: dict[str, Any] = {}
        for name in PROFILE_FIELDS if field is None else (field,):
            value = answer.get(name)
            if value is not None and not isinstance(value, str):
                raise RemoteUnavailable(server, f"'{name}' is not a string")
            if value is not None:
                profile[name] = value
        return profile

    async def directory(self, alias: str) -> dict[str, Any]:
        """``{room_id, servers}`` of ``alias`` from its server."""
        server = alias.split(":", 1)[1]
        query = urllib.parse.urlencode({"room_alias": alias})
        answer = await self._ask(server, f"{QUERY_PREFIX}/directory?{query}")
        room_id = answer.get("room_id") if isinstance(answer, dict) else None
        servers = answer.get("servers") if isinstance(answer, dict) else None
        if not isinstance(room_id, str) or not room_id.startswith("!"):
            raise RemoteUnavailable(server, "the answer has no room_id")
        if not isinstance(servers, list) or not all(isinstance(s, str) for s in servers):
            raise RemoteUnavailable(server, "the answer has no list of servers")
        return {"room_id": room_id, "servers": servers}
