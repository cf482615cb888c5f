"""User-interactive authentication (the spec's "UIA"), for every endpoint
that asks for it: registration (``m.login.dummy``) and the account changes a
stolen access token must not be enough for (``m.login.password``).

Every flow we offer has a single stage, so a round either completes the
whole flow or fails: sessions only tie the rounds of one client together and
remember nothing but their existence (the ``ui_auth_sessions`` table, which
every process reads, so the rounds may land on different processes). A
session is dropped an hour after it was created.

A round that does not complete raises :class:`InteractiveAuthIncomplete`,
whose response the servlet returns with a 401: the flows, the session, the
stages completed (always none) and, after a failed attempt, why.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any, NoReturn

from synapse_lite.api.errors import AuthError, Codes, InteractiveAuthIncomplete, SynapseError
from synapse_lite.handlers.auth import MAX_PASSWORD_LENGTH, check_password
from synapse_lite.handlers.login import user_id_from_login_body
from synapse_lite.handlers.ratelimit import Ratelimiter
from synapse_lite.http.fields import get_str

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.storage.databases.main import GenericWorkerStore

DUMMY = "m.login.dummy"
PASSWORD = "m.login.password"
UI_AUTH_SESSION_LIFETIME_MS = 3_600_000
_MAX_SESSION_LENGTH = 64


class InteractiveAuthHandler:
    """Checks the ``auth`` object of a request against one single-stage flow."""

    def __init__(self, store: GenericWorkerStore, clock: Clock, config: HomeServerConfig) -> None:
        self._store = store
        self._clock = clock
        self._server_name = config.server_name
        limits = config.rate_limits
        # Password attempts count against the same budget as logins, per
        # account: a stolen token must not become a password-guessing oracle.
        self._password_attempts = Ratelimiter(clock, limits.login, limits.enabled)

    async def check_dummy(self, body: dict[str, Any]) -> None:
        """Pass if ``body["auth"]`` completes the ``m.login.dummy`` stage."""
        auth = await self._auth_object(body, DUMMY)
        if auth.get("type") != DUMMY:
            await self._incomplete(DUMMY, auth.get("session"))

    async def check_password(self, user_id: str, body: dict[str, Any]) -> None:
        """Pass if ``body["auth"]`` proves, with ``m.login.password``, that the
        caller knows ``user_id``'s password. A wrong password is a 401
        ``M_FORBIDDEN`` carrying the flows again; naming another user is a 403."""
        auth = await self._auth_object(body, PASSWORD)
        session = auth.get("session")
        if auth.get("type") != PASSWORD:
            await self._incomplete(PASSWORD, session)
        named = user_id_from_login_body(auth, self._server_name)
        if named != user_id:
            raise AuthError(403, "The user authenticated is not the one making the request")
        password = get_str(auth, "password", max_length=MAX_PASSWORD_LENGTH)
        self._password_attempts.ratelimit(user_id)
        user = await self._store.get_user(user_id)
        if user is None or not await check_password(password, user["password_hash"]):
            await self._incomplete(PASSWORD, session, error=("Invalid password", Codes.FORBIDDEN))

    async def _auth_object(self, body: dict[str, Any], stage: str) -> dict[str, Any]:
        """The request's ``auth`` object, its session checked; a first round
        (no ``auth``) gets the flows and a new session."""
        auth = body.get("auth")
        if auth is None:
            await self._incomplete(stage, None)
        if not isinstance(auth, dict):
            raise SynapseError(400, "'auth' must be an object", Codes.BAD_JSON)
        session = auth.get("session")
        if session is not None and (
            not isinstance(session, str)
            or len(session) > _MAX_SESSION_LENGTH
            or await self._store.get_ui_auth_session(session) is None
        ):
            raise SynapseError(400, "Unknown session", Codes.UNKNOWN)
        return auth

    async def _incomplete(
        self, stage: str, session: Any, error: tuple[str, str] | None = None
    ) -> NoReturn:
        """Raise the 401 of an incomplete round (a new session unless the
        client's, already checked, is given)."""
        if not isinstance(session, str):
            session = secrets.token_urlsafe(18)
            await self._store.create_ui_auth_session(session)
            await self._store.delete_old_ui_auth_sessions(
                self._clock.time_msec() - UI_AUTH_SESSION_LIFETIME_MS
            )
        response: dict[str, Any] = {
            "flows": [{"stages": [stage]}],
            "params": {},
            "session": session,
            "completed": [],
        }
        if error is not None:
            response["error"], response["errcode"] = error
        raise InteractiveAuthIncomplete(response)
