"""OpenID tokens: a user proves who they are to a third party (an
integration manager, a widget) without handing over their access token.

``POST /user/{userId}/openid/request_token`` issues a random token valid for
an hour; the third party asks our federation API,
``GET /_matrix/federation/v1/openid/userinfo?access_token=``, who it belongs
to. Only the token's SHA-256 is stored.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import AuthError, Codes
from synapse_lite.handlers.auth import Requester, hash_token

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.storage.databases.main import GenericWorkerStore

OPENID_TOKEN_LIFETIME_MS = 3_600_000
_MAX_TOKEN_LENGTH = 256


class OpenIdHandler:
    def __init__(self, store: GenericWorkerStore, clock: Clock, server_name: str) -> None:
        self._store = store
        self._clock = clock
        self._server_name = server_name

    async def request_token(self, requester: Requester, user_id: str) -> dict[str, Any]:
        if requester.user_id != user_id:
            raise AuthError(403, "You can only request an OpenID token for yourself")
        token = "syo_" + secrets.token_urlsafe(32)
        await self._store.add_openid_token(
            hash_token(token), user_id, self._clock.time_msec() + OPENID_TOKEN_LIFETIME_MS
        )
        return {
            "access_token": token,
            "token_type": "Bearer",
            "matrix_server_name": self._server_name,
            "expires_in": OPENID_TOKEN_LIFETIME_MS // 1000,
        }

    async def userinfo(self, token: str | None) -> dict[str, Any]:
        """``{"sub": user_id}`` for a valid token, else a 401."""
        if not token:
            raise AuthError(401, "Missing access_token", Codes.MISSING_TOKEN)
        user_id = None
        if len(token) <= _MAX_TOKEN_LENGTH:
            user_id = await self._store.get_user_by_openid_token(hash_token(token))
        if user_id is None:
            raise AuthError(401, "Invalid or expired OpenID token", Codes.UNKNOWN_TOKEN)
        return {"sub": user_id}
