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

import attr

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
from synapse_lite.handlers.ui_auth import DUMMY, REGISTRATION_TOKEN
from synapse_lite.http.fields import get_bool, get_optional_str, get_str
from synapse_lite.storage.databases.main.registration import UiAuthSession, UserExistsError

if TYPE_CHECKING:
    from synapse_lite.appservice.registration import ApplicationService
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.handlers.device import DeviceHandler
    from synapse_lite.handlers.registration_tokens import RegistrationTokensHandler
    from synapse_lite.handlers.ui_auth import InteractiveAuthHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

NONCE_LIFETIME_MS = 60_000
#: The operation a registration's interactive-auth session authorises.
REGISTER_OPERATION = "register"


@attr.s(slots=True, frozen=True, auto_attribs=True)
class _RegistrationParams:
    """What a ``POST /register`` asks for, validated."""

    username: str | None
    password: str | None
    #: The hash of a password given in an earlier round of the session.
    password_hash: str | None
    device_id: str | None
    display_name: str | None
    inhibit_login: bool | None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> _RegistrationParams:
        device_id = body.get("device_id")
        if device_id is not None:
            check_identifier_text(device_id, "device_id")
        inhibit_login = body.get("inhibit_login")
        if inhibit_login is not None:
            inhibit_login = get_bool(body, "inhibit_login", False)
        return cls(
            username=get_optional_str(body, "username", max_length=MAX_ID_LENGTH),
            password=get_optional_str(body, "password", max_length=MAX_PASSWORD_LENGTH),
            password_hash=None,
            device_id=device_id,
            display_name=get_optional_str(body, "initial_device_display_name", max_length=512),
            inhibit_login=inhibit_login,
        )

    def or_remembered(self, params: dict[str, Any]) -> _RegistrationParams:
        """These, with what this request leaves out taken from ``params`` (a
        session's first request, see :meth:`to_remember`)."""

        def text(key: str) -> str | None:
            value = params.get(key)
            return value if isinstance(value, str) else None

        remembered_login = params.get("inhibit_login")
        return attr.evolve(
            self,
            username=self.username if self.username is not None else text("username"),
            password_hash=None if self.password else text("password_hash"),
            device_id=self.device_id if self.device_id is not None else text("device_id"),
            display_name=(
                self.display_name if self.display_name is not None else text("display_name")
            ),
            inhibit_login=(
                self.inhibit_login if self.inhibit_login is not None else remembered_login is True
            ),
        )

    async def to_remember(self) -> dict[str, Any]:
        """What a session keeps of these: the password only as its hash."""
        return {
            "username": self.username,
            "password_hash": (
                await hash_password(self.password) if self.password else self.password_hash
            ),
            "device_id": self.device_id,
            "display_name": self.display_name,
            "inhibit_login": self.inhibit_login,
        }


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
        tokens: RegistrationTokensHandler,
    ) -> None:
        self._store = store
        self._ui_auth = ui_auth
        self._tokens = tokens
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

    async def check_username(
        self, localpart: str, app_service: ApplicationService | None = None
    ) -> str:
        """A free, valid user id for ``localpart``, downcased (or 400
        M_INVALID_USERNAME / M_USER_IN_USE; M_EXCLUSIVE inside a namespace an
        application service holds exclusively, or, for ``app_service``,
        outside its own namespaces)."""
        localpart = localpart.lower()
        check_localpart(localpart, reserved_allowed=app_service is not None)
        user_id = self.user_id_for(localpart)
        if not self._config.app_services.may_claim_user(user_id, app_service):
            why = (
                "is outside this application service's namespaces"
                if app_service is not None and not app_service.is_user_in_namespace(user_id)
                else "is reserved by an application service"
            )
            raise SynapseError(400, f"{user_id} {why}", Codes.EXCLUSIVE)
        if await self._store.get_user(user_id) is not None:
            raise SynapseError(400, "User ID already taken.", Codes.USER_IN_USE)
        return user_id

    async def register(self, client_ip: str, body: dict[str, Any]) -> dict[str, Any]:
        """Open registration; raises :class:`InteractiveAuthIncomplete` for the
        401 round (``handlers/ui_auth.py``). The session remembers the first
        request's parameters (a later round may leave them out) and, once the
        user is registered, who: repeating the last round logs that user in
        again instead of registering another."""
        self._ratelimiter.ratelimit(client_ip)
        if not self._config.enable_registration:
            raise SynapseError(403, "Registration has been disabled", Codes.FORBIDDEN)
        asked = _RegistrationParams.from_body(body)
        guest_token = get_optional_str(body, "guest_access_token", max_length=512)
        session = await self._ui_auth.session_of(body, REGISTER_OPERATION)
        if session is not None and session.params is not None:
            asked = asked.or_remembered(session.params)
        # One stage, as every flow we offer: a token when the server asks for
        # them, else the dummy stage.
        stage = REGISTRATION_TOKEN if self._config.registration_requires_token else DUMMY
        if session is not None and session.result is not None:
            # This session registered its user already: the same answer again
            # (its token was used then, it is not asked for again).
            await self._ui_auth.check_stage(body, stage, REGISTER_OPERATION)
            return await self._registered(str(session.result["user_id"]), asked)
        if guest_token is not None:
            user_id = await self._guest_to_upgrade(guest_token, asked.username)
        elif asked.username is not None:
            user_id = await self.check_username(asked.username)
        else:
            user_id = self.user_id_for(_random_localpart())
        remembered = None
        if body.get("auth") is None:
            remembered = await asked.to_remember()
        auth, session = await self._ui_auth.check_stage(body, stage, REGISTER_OPERATION, remembered)
        password_hash = asked.password_hash
        if asked.password:
            password_hash = await hash_password(asked.password)
        token = None
        if stage == REGISTRATION_TOKEN:
            token = await self._reserve_token(auth, session)
        try:
            await self._create_user(user_id, password_hash, upgrade_guest=guest_token is not None)
        except BaseException:
            if token is not None:
                await self._tokens.end_use(token, completed=False)
            raise
        if token is not None:
            await self._tokens.end_use(token, completed=True)
            logger.info("%s registered with the registration token %r", user_id, token)
        if session is not None:
            await self._ui_auth.record_result(session, {"user_id": user_id})
        return await self._registered(user_id, asked)

    async def token_validity(self, client_ip: str, token: str) -> bool:
        """``GET /v1/register/m.login.registration_token/validity``: whether
        ``token`` could register someone now. Rate limited as registrations
        are (a guessing oracle otherwise); 403 when registration is off (no
        token is any use then)."""
        self._ratelimiter.ratelimit(client_ip)
        if not self._config.enable_registration:
            raise SynapseError(403, "Registration has been disabled", Codes.FORBIDDEN)
        return await self._tokens.is_valid(token)

    async def _reserve_token(self, auth: dict[str, Any], session: UiAuthSession | None) -> str:
        """The token of an ``m.login.registration_token`` stage, one of its
        uses reserved; a token unknown, expired or used up is a 401 with the
        flows again."""
        token = auth.get("token")
        if not isinstance(token, str) or not await self._tokens.reserve(token):
            await self._ui_auth.fail_stage(
                REGISTRATION_TOKEN,
                session,
                REGISTER_OPERATION,
                ("Invalid registration token", Codes.UNAUTHORIZED),
            )
        return token

    async def _create_user(
        self, user_id: str, password_hash: str | None, upgrade_guest: bool
    ) -> None:
        if upgrade_guest:
            if not await self._store.upgrade_guest(user_id, password_hash):
                raise SynapseError(400, "User ID already taken.", Codes.USER_IN_USE)
            logger.info("Upgraded guest %s to a full account", user_id)
            return
        try:
            await self._store.register_user(user_id, password_hash)
        except UserExistsError:
            raise SynapseError(400, "User ID already taken.", Codes.USER_IN_USE) from None
        logger.info("Registered %s", user_id)

    async def register_app_service_user(
        self, app_service: ApplicationService, body: dict[str, Any]
    ) -> dict[str, Any]:
        """``type: m.login.application_service``: a passwordless user in the
        service's namespaces (or its sender), without interactive auth,
        registration switch or rate limit; logged in unless
        ``inhibit_login``."""
        asked = _RegistrationParams.from_body(body)
        if asked.username is None:
            raise SynapseError(400, "'username' is required", Codes.MISSING_PARAM)
        user_id = await self.check_username(asked.username, app_service)
        try:
            await self._store.register_user(user_id, None)
        except UserExistsError:
            raise SynapseError(400, "User ID already taken.", Codes.USER_IN_USE) from None
        logger.info("Application service %r registered %s", app_service.id, user_id)
        return await self._registered(user_id, asked)

    async def _registered(self, user_id: str, asked: _RegistrationParams) -> dict[str, Any]:
        """The answer to a registration of ``user_id``: logged in on a new
        device unless ``inhibit_login``."""
        if asked.inhibit_login:
            return {"user_id": user_id, "home_server": self._server_name}
        return await self._login_response(
            user_id, asked.device_id or new_device_id(), asked.display_name
        )

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
