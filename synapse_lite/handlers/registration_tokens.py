"""Registration tokens: what the admin API creates and changes
(``/_synapse/admin/v1/registration_tokens``), and what the client's
``m.login.registration_token`` stage and validity query check. A token is
required to register when ``registration_requires_token`` is set (see
``handlers/register.py``)."""

from __future__ import annotations

import logging
import secrets
import string
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.handlers.auth import Requester
from synapse_lite.storage.databases.main.registration_tokens import RegistrationToken

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: The characters a token may hold (URL-safe unescaped, as the reference's).
TOKEN_ALPHABET = string.ascii_letters + string.digits + "._~-"
MAX_TOKEN_LENGTH = 64
DEFAULT_TOKEN_LENGTH = 16


def check_token_text(token: object) -> str:
    """``token`` if it is a well-formed token, else a 400 ``M_INVALID_PARAM``."""
    if (
        not isinstance(token, str)
        or not 0 < len(token) <= MAX_TOKEN_LENGTH
        or any(c not in TOKEN_ALPHABET for c in token)
    ):
        raise SynapseError(
            400,
            f"'token' must be 1 to {MAX_TOKEN_LENGTH} characters of A-Z, a-z, 0-9, '.', '_', '~'"
            " and '-'",
            Codes.INVALID_PARAM,
        )
    return token


def _optional_int(body: dict[str, Any], key: str, minimum: int) -> int | None:
    """``body[key]``: null or an integer >= ``minimum``, else a 400."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SynapseError(
            400, f"'{key}' must be null or an integer >= {minimum}", Codes.INVALID_PARAM
        )
    return value


def parse_token_limits(body: dict[str, Any], now_ms: int) -> dict[str, int | None]:
    """The ``uses_allowed`` and ``expiry_time`` a create or update body sets
    (only the keys it holds), checked: uses a non-negative integer, the
    expiry not in the past; null lifts either limit."""
    limits: dict[str, int | None] = {}
    if "uses_allowed" in body:
        limits["uses_allowed"] = _optional_int(body, "uses_allowed", 0)
    if "expiry_time" in body:
        expiry = _optional_int(body, "expiry_time", 0)
        if expiry is not None and expiry < now_ms:
            raise SynapseError(400, "'expiry_time' must not be in the past", Codes.INVALID_PARAM)
        limits["expiry_time"] = expiry
    return limits


def new_token_text(length: int) -> str:
    return "".join(secrets.choice(TOKEN_ALPHABET) for _ in range(length))


class RegistrationTokensHandler:
    """The admin API's token management and the client's checks. The admin
    calls' callers have checked the requester is a server admin."""

    def __init__(self, store: GenericWorkerStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def list_tokens(self, valid: bool | None) -> list[dict[str, Any]]:
        """Every token, or only the (in)valid ones now."""
        now = self._clock.time_msec()
        return [
            t.to_json()
            for t in await self._store.list_registration_tokens()
            if valid is None or t.is_valid(now) == valid
        ]

    async def get_token(self, token: str) -> dict[str, Any]:
        found = await self._store.get_registration_token(token)
        if found is None:
            raise NotFoundError("No such registration token")
        return found.to_json()

    async def create_token(self, admin: Requester, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /new``: ``token`` (else ``length`` random characters, 1 to
        64, default 16), ``uses_allowed``, ``expiry_time``. A name in use is
        a 400 (a generated one is drawn again)."""
        limits = parse_token_limits(body, self._clock.time_msec())
        uses_allowed, expiry = limits.get("uses_allowed"), limits.get("expiry_time")
        if "token" in body:
            if "length" in body:
                raise SynapseError(400, "Give 'token' or 'length', not both", Codes.INVALID_PARAM)
            token = check_token_text(body["token"])
            if not await self._store.create_registration_token(token, uses_allowed, expiry):
                raise SynapseError(400, f"Token {token!r} already exists", Codes.INVALID_PARAM)
        else:
            length = body.get("length", DEFAULT_TOKEN_LENGTH)
            if (
                isinstance(length, bool)
                or not isinstance(length, int)
                or not 0 < length <= MAX_TOKEN_LENGTH
            ):
                raise SynapseError(
                    400,
                    f"'length' must be an integer from 1 to {MAX_TOKEN_LENGTH}",
                    Codes.INVALID_PARAM,
                )
            # Short tokens can collide: draw again (a length of 1 has 66 names).
            for _ in range(10):
                token = new_token_text(length)
                if await self._store.create_registration_token(token, uses_allowed, expiry):
                    break
            else:
                raise SynapseError(
                    400,
                    "No unused token of that length found: ask for a longer one",
                    Codes.INVALID_PARAM,
                )
        logger.info("admin %s created the registration token %r", admin.user_id, token)
        return await self.get_token(token)

    async def update_token(
        self, admin: Requester, token: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """``PUT``: change ``uses_allowed`` and/or ``expiry_time``."""
        limits = parse_token_limits(body, self._clock.time_msec())
        updated = await self._store.update_registration_token(token, limits)
        if updated is None:
            raise NotFoundError("No such registration token")
        if limits:
            logger.info(
                "admin %s changed the registration token %r: %s", admin.user_id, token, limits
            )
        return updated.to_json()

    async def delete_token(self, admin: Requester, token: str) -> None:
        if not await self._store.delete_registration_token(token):
            raise NotFoundError("No such registration token")
        logger.info("admin %s deleted the registration token %r", admin.user_id, token)

    async def is_valid(self, token: str) -> bool:
        """Whether a registration could use ``token`` now (a point in time:
        another may take its last use first)."""
        found = await self._store.get_registration_token(token)
        return found is not None and found.is_valid(self._clock.time_msec())

    async def reserve(self, token: str) -> bool:
        """Reserve a use of ``token`` for a registration under way."""
        return await self._store.reserve_registration_token(token, self._clock.time_msec())

    async def end_use(self, token: str, completed: bool) -> None:
        await self._store.end_registration_token_use(token, completed)


__all__ = ["RegistrationToken", "RegistrationTokensHandler", "check_token_text"]
