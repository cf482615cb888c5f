"""Registering users: open registration with ``m.login.dummy`` interactive
auth, and the admin API's shared-secret registration.

Shared-secret registration follows the shape of the larger homeserver's admin
API: ``GET /_synapse/admin/v1/register`` gives a nonce; the POST carries an
HMAC-SHA1, keyed with ``registration_shared_secret``, of
``nonce \\0 username \\0 password \\0 admin|notadmin``. Our nonces need no
storage (any process may answer either request): each is a timestamp and
random text signed with a key derived from the secret, valid for a minute.
Replaying a request within that minute can only register the same user again,
which fails.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import (
    AuthError,
    Codes,
    SynapseError,
)
from synapse_lite.api.identifiers import (
    MAX_ID_LENGTH,
    check_identifier_text,
    check_localpart,
    new_device_id,
    random_string,
)
from synapse_lite.handlers.auth import MAX_PASSWORD_LENGTH, hash_password, hash_token
from synapse_lite.handlers.ratelimit import Ratelimiter
from synapse_lite.http.fields import get_bool, get_optional_str, get_str
from synapse_lite.storage.databases.main.registration import UserExistsError

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.handlers.device import DeviceHandler
    from synapse_lite.handlers.ui_auth import InteractiveAuthHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

NONCE_LIFETIME_MS = 60_000


def _random_localpart() -> str:
    """The localpart of a user who registers without choosing one (guests too)."""
    return random_string(12, "0123456789abcdefghijklmnopqrstuvwxyz")


class RegistrationHandler:
    """``POST /register`` and the admin shared-secret registration."""

    def __init__(
        self,
        store: GenericWorkerStore,
        clock: Clock,
        config: HomeServerConfig,
        devices: DeviceHandler,
        ui_auth: InteractiveAuthHandler,
    ) -> None:
        self._store = store
        self._ui_auth = ui_auth
        self._clock = clock
        self._config = config
        self._server_name = config.server_name
        self._devices = devices
        limits = config.rate_limits
        self._ratelimiter = Ratelimiter(clock, limits.registration, limits.enabled)

    def user_id_for(self, localpart: str) -> str:
        user_id = f"@{localpart}:{self._server_name}"
        if len(user_id.encode("utf-8")) > MAX_ID_LENGTH:
            raise SynapseError(400, "User ID is too long", Codes.INVALID_USERNAME)
        return user_id

    async def check_username(self, localpart: str) -> str:
        """A free, valid user id for ``localpart`` (or 400 M_INVALID_USERNAME
        / M_USER_IN_USE)."""
        check_localpart(localpart)
        user_id = self.user_id_for(localpart)
        if await self._store.get_user(user_id) is not None:
            raise SynapseError(400, "User ID already taken.", Codes.USER_IN_USE)
        return user_id

    async def register(self, client_ip: str, body: dict[str, Any]) -> dict[str, Any]:
        """Open registration; raises :class:`InteractiveAuthIncomplete` for the
        401 round (``handlers/ui_auth.py``)."""
        self._ratelimiter.ratelimit(client_ip)
        if not self._config.enable_registration:
            raise SynapseError(403, "Registration has been disabled", Codes.FORBIDDEN)
        username = get_optional_str(body, "username", max_length=MAX_ID_LENGTH)
        password = get_optional_str(body, "password", max_length=MAX_PASSWORD_LENGTH)
        inhibit_login = get_bool(body, "inhibit_login", False)
        guest_token = get_optional_str(body, "guest_access_token", max_length=512)
        device_id, display_name = self._device_fields(body)
        if guest_token is not None:
            user_id = await self._guest_to_upgrade(guest_token, username)
        elif username is not None:
            user_id = await self.check_username(username)
        else:
            user_id = self.user_id_for(_random_localpart())
        await self._ui_auth.check_dummy(body)
        password_hash = await hash_password(password) if password else None
        if guest_token is not None:
            if not await self._store.upgrade_guest(user_id, password_hash):
                raise SynapseError(400, "User ID already taken.", Codes.USER_IN_USE)
            logger.info("Upgraded guest %s to a full account", user_id)
        else:
            try:
                await self._store.register_user(user_id, password_hash)
            except UserExistsError:
                raise SynapseError(400, "User ID already taken.", Codes.USER_IN_USE) from None
            logger.info("Registered %s", user_id)
        if inhibit_login:
            return {"user_id": user_id, "home_server": self._server_name}
        return await self._login_response(user_id, device_id, display_name)

    async def _guest_to_upgrade(self, guest_token: str, username: str | None) -> str:
        """The guest account a registration with ``guest_access_token``
        upgrades: the token's, which ``username`` must name (the spec asks
        for the guest's localpart). 403 for anything else, so nobody takes
        over another account."""
        if username is None:
            raise SynapseError(
                400, "Upgrading a guest needs its localpart as 'username'", Codes.MISSING_PARAM
            )
        owner = await self._store.get_user_by_access_token(hash_token(guest_token))
        if owner is None or not owner[2] or owner[0] != self.user_id_for(username.lower()):
            raise SynapseError(
                403, "guest_access_token is not that guest account's token", Codes.FORBIDDEN
            )
        return owner[0]

    async def register_guest(self, client_ip: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /register?kind=guest``: a new guest account, logged in. Only
        with ``allow_guest_access`` (``enable_registration`` is not needed:
        a guest has no name or password to claim)."""
        self._ratelimiter.ratelimit(client_ip)
        if not self._config.allow_guest_access:
            raise SynapseError(403, "Guest access is disabled", Codes.GUEST_ACCESS_FORBIDDEN)
        device_id, display_name = self._device_fields(body)
        for _ in range(3):
            user_id = self.user_id_for(_random_localpart())
            try:
                await self._store.register_user(user_id, None, guest=True)
            except UserExistsError:
                continue
            logger.info("Registered guest %s", user_id)
            return await self._login_response(user_id, device_id, display_name)
        raise SynapseError(500, "Could not pick a free guest user id", Codes.UNKNOWN)

    @staticmethod
    def _device_fields(body: dict[str, Any]) -> tuple[str, str | None]:
        device_id = body.get("device_id")
        if device_id is not None:
            check_identifier_text(device_id, "device_id")
        display_name = get_optional_str(body, "initial_device_display_name", max_length=512)
        return (device_id or new_device_id()), display_name

    async def _login_response(
        self, user_id: str, device_id: str, display_name: str | None
    ) -> dict[str, Any]:
        token = await self._devices.create_device_and_token(user_id, device_id, display_name)
        return {
            "user_id": user_id,
            "access_token": token,
            "device_id": device_id,
            "home_server": self._server_name,
        }

    # Shared-secret registration (admin API)

    def _nonce_key(self) -> bytes:
        secret = self._config.registration_shared_secret or ""
        return hashlib.sha256(b"synapse_lite nonce\0" + secret.encode("utf-8")).digest()

    def _require_secret(self) -> str:
        secret = self._config.registration_shared_secret
        if not secret:
            logger.warning("Refused shared-secret registration: no registration_shared_secret")
            raise SynapseError(400, "Shared secret registration is not enabled", Codes.FORBIDDEN)
        return secret

    def new_nonce(self) -> str:
        self._require_secret()
        issued = f"{self._clock.time_msec()}.{secrets.token_hex(12)}"
        signature = hmac.new(self._nonce_key(), issued.encode("ascii"), hashlib.sha256)
        return f"{issued}.{signature.hexdigest()}"

    def _check_nonce(self, nonce: str) -> None:
        parts = nonce.split(".")
        if len(parts) == 3 and parts[0].isdigit():
            issued = f"{parts[0]}.{parts[1]}"
            expected = hmac.new(self._nonce_key(), issued.encode("ascii"), hashlib.sha256)
            age = self._clock.time_msec() - int(parts[0])
            if hmac.compare_digest(expected.hexdigest(), parts[2]) and 0 <= age <= (
                NONCE_LIFETIME_MS
            ):
                return
        raise SynapseError(400, "Unrecognised nonce", Codes.UNKNOWN)

    async def register_with_shared_secret(
        self, client_ip: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        self._ratelimiter.ratelimit(client_ip)
        secret = self._require_secret()
        nonce = get_str(body, "nonce", max_length=200)
        self._check_nonce(nonce)
        username = get_str(body, "username", max_length=MAX_ID_LENGTH)
        password = get_str(body, "password", max_length=MAX_PASSWORD_LENGTH)
        admin = get_bool(body, "admin", False)
        user_type = get_optional_str(body, "user_type", max_length=64)
        mac = get_str(body, "mac", max_length=200)
        message = b"\x00".join(
            [
                nonce.encode("utf-8"),
                username.encode("utf-8"),
                password.encode("utf-8"),
                b"admin" if admin else b"notadmin",
            ]
        )
        if user_type is not None:
            message += b"\x00" + user_type.encode("utf-8")
        expected = hmac.new(secret.encode("utf-8"), message, hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected, mac.lower()):
            logger.warning("Refused shared-secret registration of %r: bad HMAC", username[:64])
            raise AuthError(403, "HMAC incorrect")
        user_id = await self.check_username(username.lower())
        try:
            await self._store.register_user(user_id, await hash_password(password), admin=admin)
        except UserExistsError:
            raise SynapseError(400, "User ID already taken.", Codes.USER_IN_USE) from None
        logger.info("Registered %s with the shared secret (admin=%s)", user_id, admin)
        return await self._login_response(user_id, new_device_id(), None)
