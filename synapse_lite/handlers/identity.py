"""Binding third-party identifiers at identity servers (the Identity Service
API, v2), for ``/account/3pid/bind``, ``/unbind``, ``/delete`` and
deactivation.

The identity server is the one the client names (``id_server``, a server
name): this server sends it the user's validation session
(``POST /_matrix/identity/v2/3pid/bind`` with the client's
``id_access_token``) and remembers the binding, so that removing the 3PID or
deactivating the account unbinds it there (``POST .../3pid/unbind``, signed
with this server's key, as the spec asks). Identity servers are reached
with the client for user-named servers: HTTPS only, verified, never at an
address ``outbound_requests.ip_range_denylist`` covers unless allowed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.federation.auth import sign_request
from synapse_lite.federation.crypto import SigningKeyFileError
from synapse_lite.http.fields import get_optional_str, get_str
from synapse_lite.http.outbound import OutboundRequestError

if TYPE_CHECKING:
    from synapse_lite.federation.crypto import SigningKey
    from synapse_lite.handlers.auth import Requester
    from synapse_lite.http.outbound import OutboundAnswer, OutboundHttpClient
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

MEDIA = ("email", "msisdn")
BIND_PATH = "/_matrix/identity/v2/3pid/bind"
UNBIND_PATH = "/_matrix/identity/v2/3pid/unbind"
#: A server name: a host (name, IPv4, or [IPv6]) and an optional port.
_SERVER_NAME = re.compile(r"(?:[A-Za-z0-9.-]{1,255}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")


def check_id_server(value: object) -> str:
    """An identity server as clients name it, or a 400."""
    if not isinstance(value, str) or not _SERVER_NAME.fullmatch(value):
        raise SynapseError(
            400, "'id_server' must be a server name (host[:port])", Codes.INVALID_PARAM
        )
    return value


def check_threepid(body: dict[str, Any]) -> tuple[str, str]:
    """``(medium, address)`` of a request body, or a 400."""
    medium = get_str(body, "medium", max_length=16)
    if medium not in MEDIA:
        raise SynapseError(400, "'medium' must be 'email' or 'msisdn'", Codes.INVALID_PARAM)
    return medium, get_str(body, "address", max_length=512)


class IdentityHandler:
    """3PID bindings of local users at the identity servers they name."""

    def __init__(
        self,
        store: GenericWorkerStore,
        http: OutboundHttpClient,
        signing_key: Callable[[], SigningKey],
        server_name: str,
    ) -> None:
        self._store = store
        self._http = http
        #: Read when first needed: the requests are routed to the main
        #: process, which made the key; another process has it only if it
        #: shares the data directory.
        self._load_signing_key = signing_key
        self._signing_key: SigningKey | None = None
        self._server_name = server_name

    async def bind(self, requester: Requester, body: dict[str, Any]) -> None:
        """``POST /account/3pid/bind``: have the identity server bind the
        3PID its validation session proved to the user, and remember it."""
        id_server = check_id_server(body.get("id_server"))
        token = get_str(body, "id_access_token", max_length=1024)
        session = {
            "sid": get_str(body, "sid", max_length=255),
            "client_secret": get_str(body, "client_secret", max_length=255),
            "mxid": requester.user_id,
        }
        answer = await self._call(
            id_server, BIND_PATH, session, {"Authorization": f"Bearer {token}"}
        )
        if not 200 <= answer.code < 300:
            raise _refusal(id_server, answer)
        bound = answer.json()
        medium = bound.get("medium") if isinstance(bound, dict) else None
        address = bound.get("address") if isinstance(bound, dict) else None
        if medium not in MEDIA or not isinstance(address, str) or not address:
            raise SynapseError(
                502, f"The identity server {id_server} answered no 3PID", Codes.UNKNOWN
            )
        await self._store.add_threepid_binding(requester.user_id, medium, address, id_server)
        logger.info("%s bound a 3PID (%s) at %s", requester.user_id, medium, id_server)

    async def unbind(self, user_id: str, body: dict[str, Any]) -> str:
        """``/account/3pid/unbind`` and ``/delete``: unbind the 3PID at the
        ``id_server`` given, else at every server it was bound at through
        this server. ``"success"``, or ``"no-support"`` when there was no
        server to ask or one refused."""
        medium, address = check_threepid(body)
        named = get_optional_str(body, "id_server", max_length=255)
        if named is not None:
            servers = [check_id_server(named)]
        else:
            servers = [
                s for m, a, s in await self._store.get_threepid_bindings(user_id)
                if (m, a) == (medium, address)
            ]  # fmt: skip
        result = "success" if servers else "no-support"
        for id_server in servers:
            if not await self._unbind_at(user_id, medium, address, id_server):
                result = "no-support"
        return result

    async def unbind_all(self, user_id: str, id_server: str | None) -> str:
        """Deactivation: unbind everything the user bound (at ``id_server``
        too, when given, for 3PIDs bound elsewhere). Never fails: an identity
        server that cannot be reached makes the result ``"no-support"``."""
        bindings = await self._store.get_threepid_bindings(user_id)
        if id_server is not None:
            check_id_server(id_server)
        if not bindings:
            return "no-support"
        result = "success"
        for medium, address, bound_at in bindings:
            # The spec: the server named, else the one each was bound at.
            server = id_server or bound_at
            try:
                if not await self._unbind_at(user_id, medium, address, server):
                    result = "no-support"
            except SynapseError as e:
                logger.warning("Unbinding %s's 3PID at %s failed: %s", user_id, server, e)
                result = "no-support"
            await self._store.remove_threepid_binding(user_id, medium, address, bound_at)
        return result

    async def _unbind_at(self, user_id: str, medium: str, address: str, id_server: str) -> bool:
        """Whether ``id_server`` unbound it (2xx); the binding is forgotten
        whenever the server answered (a refusal means it has none for us)."""
        content = {"mxid": user_id, "threepid": {"medium": medium, "address": address}}
        if self._signing_key is None:
            try:
                self._signing_key = self._load_signing_key()
            except SigningKeyFileError as e:
                raise SynapseError(
                    503, f"This process cannot sign requests to identity servers: {e}",
                    Codes.UNKNOWN,
                ) from None  # fmt: skip
        authorization = sign_request(
            self._signing_key, self._server_name, id_server, "POST", UNBIND_PATH, content
        )
        answer = await self._call(id_server, UNBIND_PATH, content, {"Authorization": authorization})
        if answer.code >= 500:
            raise _refusal(id_server, answer)
        await self._store.remove_threepid_binding(user_id, medium, address, id_server)
        return 200 <= answer.code < 300

    async def _call(
        self, id_server: str, path: str, content: dict[str, Any], headers: dict[str, str]
    ) -> OutboundAnswer:
        try:
            return await self._http.request(
                "POST", f"https://{id_server}{path}", json_body=content, headers=headers
            )
        except OutboundRequestError as e:
            if e.denied:
                raise SynapseError(400, str(e), Codes.SERVER_NOT_TRUSTED) from None
            raise SynapseError(
                502, f"The identity server {id_server} could not be reached: {e}", Codes.UNKNOWN
            ) from None


def _refusal(id_server: str, answer: OutboundAnswer) -> SynapseError:
    """The identity server's error, passed on to the client."""
    body = answer.json()
    errcode = body.get("errcode") if isinstance(body, dict) else None
    message = body.get("error") if isinstance(body, dict) else None
    code = answer.code if 400 <= answer.code < 500 else 502
    return SynapseError(
        code,
        f"The identity server {id_server} refused: {str(message or answer.code)[:300]}",
        errcode if isinstance(errcode, str) and errcode.startswith("M_") else Codes.UNKNOWN,
    )
