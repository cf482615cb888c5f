"""User-interactive authentication (the spec's "UIA"), for every endpoint
that asks for it: registration (``m.login.dummy``, or
``m.login.registration_token`` when the server requires tokens) and the account changes a
stolen access token must not be enough for (``m.login.password``).

Every flow we offer has a single stage, so a round either completes the
whole flow or fails. A session (a row of ``ui_auth_sessions``, which every
process reads, so the rounds may land on different processes) ties the rounds
of one client together and remembers what it was started for: the operation
(as the handler names it: a session begun to delete one device cannot
authorise deleting another, 403), the parameters of the first request a
later round may leave out, and once the operation is done what it produced
(registration repeats its answer). A session is dropped an hour after it was
created.

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
from synapse_lite.storage.databases.main.registration import UiAuthSession

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.storage.databases.main import GenericWorkerStore

DUMMY = "m.login.dummy"
PASSWORD = "m.login.password"
REGISTRATION_TOKEN = "m.login.registration_token"
UI_AUTH_SESSION_LIFETIME_MS = 3_600_000
_MAX_SESSION_LENGTH = 64


class InteractiveAuthHandler:
    """Checks the ``auth`` object of a request against one single-stage flow.

    ``operation`` names what the request does, exactly enough that two
    requests with the same name are the same operation (``"register"``,
    ``"delete device D"``): a session only authorises the operation it was
    begun for."""

    def __init__(self, store: GenericWorkerStore, clock: Clock, config: HomeServerConfig) -> None:
        self._store = store
        self._clock = clock
        self._server_name = config.server_name
        limits = config.rate_limits
        # Password attempts count against the same budget as logins, per
        # account: a stolen token must not become a password-guessing oracle.
        self._password_attempts = Ratelimiter(clock, limits.login, limits.enabled)

    async def session_of(self, body: dict[str, Any], operation: str) -> UiAuthSession | None:
        """The session ``body["auth"]`` names (None when it names none): 400
        for a session we did not issue, 403 for one begun for another
        operation."""
        auth = body.get("auth")
        if auth is None:
            return None
        if not isinstance(auth, dict):
            raise SynapseError(400, "'auth' must be an object", Codes.BAD_JSON)
        session_id = auth.get("session")
        if session_id is None:
            return None
        if not isinstance(session_id, str) or len(session_id) > _MAX_SESSION_LENGTH:
            raise SynapseError(400, "Unknown session", Codes.UNKNOWN)
        session = await self._store.get_ui_auth_session(session_id)
        if session is None:
            raise SynapseError(400, "Unknown session", Codes.UNKNOWN)
        # Sessions from before operations were recorded have none: any goes.
        if session.operation and session.operation != operation:
            raise AuthError(
                403,
                "This authentication session was begun for another request: start a new one"
                " for this request",
            )
        return session

    async def check_dummy(
        self, body: dict[str, Any], operation: str, params: dict[str, Any] | None = None
    ) -> UiAuthSession | None:
        """Pass if ``body["auth"]`` completes the ``m.login.dummy`` stage;
        returns the session it named, if any. A first round (no ``auth``)
        begins a session remembering ``params``."""
        return (await self.check_stage(body, DUMMY, operation, params))[1]

    async def check_stage(
        self,
        body: dict[str, Any],
        stage: str,
        operation: str,
        params: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], UiAuthSession | None]:
        """Pass if ``body["auth"]`` is of the type ``stage``; returns that
        object (for the caller to check what the stage needs, failing with
        :meth:`fail_stage`) and the session it named, if any. A first round
        (no ``auth``) begins a session remembering ``params``."""
        auth, session = await self._auth_object(body, stage, operation, params)
        if auth.get("type") != stage:
            await self._incomplete(stage, session, operation)
        return auth, session

    async def fail_stage(
        self, stage: str, session: UiAuthSession | None, operation: str, error: tuple[str, str]
    ) -> NoReturn:
        """The 401 of a failed attempt at ``stage``: the flows again, with
        ``error`` (message, errcode)."""
        await self._incomplete(stage, session, operation, error=error)

    async def check_password(self, user_id: str, body: dict[str, Any], operation: str) -> None:
        """Pass if ``body["auth"]`` proves, with ``m.login.password``, that the
        caller knows ``user_id``'s password. A wrong password is a 401
        ``M_FORBIDDEN`` carrying the flows again; naming another user is a 403."""
        auth, session = await self._auth_object(body, PASSWORD, operation, None)
        if auth.get("type") != PASSWORD:
            await self._incomplete(PASSWORD, session, operation)
        named = user_id_from_login_body(auth, self._server_name)
        if named != user_id:
            raise AuthError(403, "The user authenticated is not the one making the request")
        password = get_str(auth, "password", max_length=MAX_PASSWORD_LENGTH)
        self._password_attempts.ratelimit(user_id)
        user = await self._store.get_user(user_id)
        if user is None or not await check_password(password, user["password_hash"]):
            await self._incomplete(
                PASSWORD, session, operation, error=("Invalid password", Codes.FORBIDDEN)
            )

    async def record_result(self, session: UiAuthSession, result: dict[str, Any]) -> None:
        """What the session's operation produced, for a repeat of its last round."""
        await self._store.set_ui_auth_session_result(session.session_id, result)

    async def _auth_object(
        self, body: dict[str, Any], stage: str, operation: str, params: dict[str, Any] | None
    ) -> tuple[dict[str, Any], UiAuthSession | None]:
        """The request's ``auth`` object and its session, checked; a first
        round (no ``auth``) gets the flows and a new session."""
        session = await self.session_of(body, operation)
        auth = body.get("auth")
        if auth is None:
            await self._incomplete(stage, None, operation, params=params)
        return auth, session

    async def _incomplete(
        self,
        stage: str,
        session: UiAuthSession | None,
        operation: str,
        params: dict[str, Any] | None = None,
        error: tuple[str, str] | None = None,
    ) -> NoReturn:
        """Raise the 401 of an incomplete round: in ``session`` (already
        checked), else in a new session for ``operation`` remembering
        ``params``."""
        if session is None:
            session_id = secrets.token_urlsafe(18)
            await self._store.create_ui_auth_session(session_id, operation, params)
            await self._store.delete_old_ui_auth_sessions(
                self._clock.time_msec() - UI_AUTH_SESSION_LIFETIME_MS
            )
        else:
            session_id = session.session_id
        response: dict[str, Any] = {
            "flows": [{"stages": [stage]}],
            "params": {},
            "session": session_id,
            "completed": [],
        }
        if error is not None:
            response["error"], response["errcode"] = error
        raise InteractiveAuthIncomplete(response)
