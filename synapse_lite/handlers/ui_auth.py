"""User-interactive auth for a logged-in user's sensitive requests (deleting
devices, replacing cross-signing keys): the client proves it knows the
account's password again (``m.login.password``).

The first request without ``auth`` answers 401 with the flows and a session
id; the client repeats it with ``auth``. A wrong password answers 401 again,
with ``M_FORBIDDEN``, so the client may ask once more. Sessions are rows of
``ui_auth_sessions`` (shared with registration), so the retry may reach any
process.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, InteractiveAuthIncomplete, SynapseError
from synapse_lite.api.identifiers import MAX_ID_LENGTH
from synapse_lite.handlers.auth import MAX_PASSWORD_LENGTH, Requester, check_password
from synapse_lite.handlers.ratelimit import Ratelimiter

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.storage.databases.main import GenericWorkerStore

PASSWORD_FLOWS = [{"stages": ["m.login.password"]}]
#: How long a session id stays valid.
SESSION_LIFETIME_MS = 30 * 60 * 1000


class UserInteractiveAuth:
    """Checks the ``auth`` of a request against the requester's password."""

    def __init__(self, store: GenericWorkerStore, clock: Clock, config: HomeServerConfig) -> None:
        self._store = store
        self._clock = clock
        self._server_name = config.server_name
        limits = config.rate_limits
        self._attempts = Ratelimiter(clock, limits.login, limits.enabled)

    async def validate(self, requester: Requester, auth: Any) -> None:
        """Return when ``auth`` proves the requester knows their password;
        otherwise raise the 401 that asks for it (or a 400 for a malformed
        ``auth``)."""
        if auth is None:
            raise InteractiveAuthIncomplete(await self._challenge(None))
        if not isinstance(auth, dict):
            raise SynapseError(400, "'auth' must be an object", Codes.BAD_JSON)
        session = auth.get("session")
        if session is not None and (
            not isinstance(session, str)
            or len(session) > 64
            or await self._store.get_ui_auth_session(session) is None
        ):
            raise SynapseError(400, "Unknown session in 'auth'", Codes.UNKNOWN)
        if auth.get("type") != "m.login.password":
            raise InteractiveAuthIncomplete(await self._challenge(session))
        password = auth.get("password")
        if not isinstance(password, str) or len(password) > MAX_PASSWORD_LENGTH:
            raise SynapseError(400, "'auth.password' must be a string", Codes.BAD_JSON)
        claimed = self._claimed_user(auth)
        self._attempts.ratelimit(requester.user_id)
        user = await self._store.get_user(requester.user_id)
        if (
            claimed != requester.user_id
            or user is None
            or not await check_password(password, user["password_hash"])
        ):
            challenge = await self._challenge(session)
            challenge.update({"errcode": Codes.FORBIDDEN, "error": "Invalid password"})
            raise InteractiveAuthIncomplete(challenge)

    def _claimed_user(self, auth: dict[str, Any]) -> str | None:
        identifier = auth.get("identifier")
        user = auth.get("user")
        if isinstance(identifier, dict) and identifier.get("type") == "m.id.user":
            user = identifier.get("user")
        if not isinstance(user, str) or not user or len(user) > MAX_ID_LENGTH:
            return None
        return user if user.startswith("@") else f"@{user.lower()}:{self._server_name}"

    async def _challenge(self, session: str | None) -> dict[str, Any]:
        if session is None:
            session = secrets.token_urlsafe(18)
            await self._store.create_ui_auth_session(session)
            await self._store.delete_old_ui_auth_sessions(
                self._clock.time_msec() - SESSION_LIFETIME_MS
            )
        return {"flows": PASSWORD_FLOWS, "params": {}, "session": session}
