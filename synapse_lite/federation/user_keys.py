"""Our users' devices and keys served to other servers (docs/federation.md,
"Device lists across servers"), signed requests only:

* ``GET /_matrix/federation/v1/user/devices/{userId}``: the user's devices,
  their keys, the device list ``stream_id`` (which ``m.device_list_update``
  EDUs follow on from) and the master and self-signing keys;
* ``POST /user/keys/query``: device and cross-signing keys (never a
  user-signing key);
* ``POST /user/keys/claim``: one-time keys, each handed out once.

A user who is not ours is 400 for ``/user/devices`` and left out of the
answers of the others; malformed bodies are 400.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import is_mine_id, is_valid_user_id
from synapse_lite.handlers.e2e_keys import parse_key_claims, parse_key_query
from synapse_lite.http.server import JsonResource, parse_json_object_from_request

if TYPE_CHECKING:
    from synapse_lite.handlers.e2e_keys import E2eKeysHandler
    from synapse_lite.handlers.remote_devices import RemoteDeviceLists

PREFIX = "/_matrix/federation/v1/user"


def local_key_query(body: dict[str, Any], server_name: str) -> dict[str, list[str]]:
    """``{user: [device ids]}`` of a ``/user/keys/query`` body, our users only."""
    return {u: d for u, d in parse_key_query(body).items() if is_mine_id(u, server_name)}


def local_key_claims(body: dict[str, Any], server_name: str) -> list[tuple[str, str, str]]:
    """``(user, device, algorithm)`` of a ``/user/keys/claim`` body, our users only."""
    return [
        (user_id, device_id, algorithm)
        for user_id, devices in parse_key_claims(body).items()
        if is_mine_id(user_id, server_name)
        for device_id, algorithm in devices.items()
    ]


def register_user_keys_servlets(
    resource: JsonResource,
    authenticate: Callable[[Request, Any], Awaitable[str]],
    server_name: str,
    devices: RemoteDeviceLists,
    e2e_keys: E2eKeysHandler,
) -> None:
    """``authenticate(request, body)``: the request's origin, checked
    (``federation/server.py``)."""

    async def on_devices(request: Request, user_id: str) -> tuple[int, Any]:
        await authenticate(request, None)
        if not is_valid_user_id(user_id) or not is_mine_id(user_id, server_name):
            raise SynapseError(
                400, f"{user_id} is not a user of {server_name}", Codes.INVALID_PARAM
            )
        return 200, await devices.user_devices(user_id)

    async def on_query(request: Request) -> tuple[int, Any]:
        body = parse_json_object_from_request(request)
        await authenticate(request, body)
        keys = await e2e_keys.local_keys(local_key_query(body, server_name), None)
        del keys["user_signing_keys"]
        return 200, keys

    async def on_claim(request: Request) -> tuple[int, Any]:
        body = parse_json_object_from_request(request)
        await authenticate(request, body)
        claimed = await e2e_keys.claim_local_keys(local_key_claims(body, server_name))
        return 200, {"one_time_keys": claimed}

    resource.register_paths(
        "GET", PREFIX + r"/devices/(?P<user_id>[^/]+)", on_devices, "federation.user_devices"
    )
    resource.register_paths("POST", PREFIX + "/keys/query", on_query, "federation.user_keys_query")
    resource.register_paths("POST", PREFIX + "/keys/claim", on_claim, "federation.user_keys_claim")
