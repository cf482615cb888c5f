"""Who is asking: access tokens to requesters, and password hashing.

Access tokens (their form: ``api/access_tokens.py``) are random and returned
to the client once; only their SHA-256 is stored (``access_tokens.token_hash``),
so a copy of the database logs nobody in. Passwords are hashed with scrypt
(n=2**14, r=8, p=1, a 16-byte random salt per password, 32-byte key), the
parameters written into the stored string so they can be raised later without
invalidating old hashes. Hashing runs on a thread so the reactor keeps serving
meanwhile.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from typing import TYPE_CHECKING

import attr
from twisted.internet import threads
from twisted.web.server import Request

from synapse_lite.api.errors import AuthError, Codes
from synapse_lite.api.guest_access import guest_may_call
from synapse_lite.http.server import matched_servlet

if TYPE_CHECKING:
    from synapse_lite.appservice.registration import ApplicationService, ApplicationServices
    from synapse_lite.config.homeserver import RateLimitConfig
    from synapse_lite.handlers.client_ips import ClientIpRecorder
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
_SCRYPT_MAXMEM = 64 * 1024 * 1024
#: Longest password accepted (hashing cost grows with it).
MAX_PASSWORD_LENGTH = 512
_MAX_TOKEN_LENGTH = 512


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Requester:
    """The user and device behind an authenticated request."""

    user_id: str
    device_id: str
    token_hash: str
    #: A guest account (``POST /register?kind=guest``): limited to what
    #: ``api/guest_access.py`` allows.
    is_guest: bool = False
    #: The application service making the request with its ``as_token``
    #: (``user_id`` is then its sender or a user it masquerades as, and
    #: ``device_id`` is empty unless the request named one).
    app_service: ApplicationService | None = None
    #: An admin shadow-banned the user: their sends answer as if they
    #: succeeded and reach nobody (``handlers/shadow_ban.py``).
    shadow_banned: bool = False
    #: An admin suspended the account: what would add to rooms or profiles
    #: answers 403 ``M_USER_SUSPENDED`` (``handlers/suspension.py``).
    suspended: bool = False
    #: The user's own message rate limit (an admin's override), None for
    #: the configured one; ``per_second`` 0 lifts it.
    ratelimit_override: RateLimitConfig | None = None

    @property
    def is_rate_limited(self) -> bool:
        """Whether request rate limits apply: not to an application
        service's sender, nor to its users when it is not ``rate_limited``,
        nor to a user an admin exempted (an override of 0 per second)."""
        if self.ratelimit_override is not None and self.ratelimit_override.per_second == 0:
            return False
        service = self.app_service
        if service is None:
            return True
        return service.rate_limited and self.user_id != service.sender


def hash_token(token: str) -> str:
    """What is stored for an access token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=_SCRYPT_MAXMEM, dklen=32
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def hash_password(password: str) -> str:
    """``scrypt$n$r$p$salt$hash`` (base64 salt and hash)."""
    salt = secrets.token_bytes(16)
    digest = await threads.deferToThread(_scrypt, password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


async def check_password(password: str, stored: str | None) -> bool:
    """Whether ``password`` matches a stored hash (False for no hash or an
    unreadable one)."""
    if not stored:
        return False
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = await threads.deferToThread(
            _scrypt, password, base64.b64decode(salt), int(n), int(r), int(p)
        )
    except ValueError:
        logger.warning("Unreadable password hash")
        return False
    return hmac.compare_digest(expected, actual)


def get_access_token_from_request(request: Request) -> str:
    """The token of ``Authorization: Bearer`` or ``?access_token=``, or a 401
    ``M_MISSING_TOKEN``."""
    headers = request.requestHeaders.getRawHeaders(b"Authorization") or []
    token: bytes | None = None
    if headers:
        if len(headers) > 1:
            raise AuthError(401, "Too many Authorization headers", Codes.MISSING_TOKEN)
        parts = headers[0].split(b" ", 1)
        if len(parts) != 2 or parts[0].lower() != b"bearer":
            raise AuthError(401, "Invalid Authorization header", Codes.MISSING_TOKEN)
        token = parts[1].strip()
    elif request.args and b"access_token" in request.args:
        token = request.args[b"access_token"][0]
    if not token:
        raise AuthError(401, "Missing access token", Codes.MISSING_TOKEN)
    if len(token) > _MAX_TOKEN_LENGTH:
        raise AuthError(401, "Unrecognised access token", Codes.UNKNOWN_TOKEN)
    try:
        return token.decode("ascii")
    except UnicodeDecodeError:
        raise AuthError(401, "Unrecognised access token", Codes.UNKNOWN_TOKEN) from None


class AuthHandler:
    """Turns a request's access token into a :class:`Requester`."""

    def __init__(
        self,
        store: GenericWorkerStore,
        ip_recorder: ClientIpRecorder | None = None,
        allow_guest_access: bool = False,
        app_services: ApplicationServices | None = None,
    ) -> None:
        """``allow_guest_access``: the config switch; off, guests' tokens are
        refused everywhere. ``app_services``: whose ``as_token`` is accepted."""
        self._store = store
        self._ip_recorder = ip_recorder
        self._allow_guest_access = allow_guest_access
        #: Services by the hash of their ``as_token``: found by the same
        #: hash lookup as a user's token, never by comparing secrets.
        self._services_by_token_hash = {
            hash_token(service.as_token): service for service in app_services or ()
        }
        #: Users application services have been seen to act as, registered
        #: (an account is never removed, so the answer stays true).
        self._known_service_users: set[str] = set()

    async def get_user_by_req(self, request: Request) -> Requester:
        """The requester, or a 401 (``M_MISSING_TOKEN`` / ``M_UNKNOWN_TOKEN``);
        a 403 ``M_GUEST_ACCESS_FORBIDDEN`` for a guest calling what guests
        may not (``api/guest_access.py``)."""
        token = get_access_token_from_request(request)
        token_hash = hash_token(token)
        service = self._services_by_token_hash.get(token_hash)
        if service is not None:
            return await self._service_requester(request, service, token_hash)
        owner = await self._store.get_user_by_access_token(token_hash)
        if owner is None or (owner[3] is not None and owner[3] <= self._store.clock.time_msec()):
            raise UnknownTokenError()
        restrictions = await self._store.get_user_restrictions(owner[0])
        requester = Requester(
            owner[0],
            owner[1],
            token_hash,
            is_guest=owner[2],
            shadow_banned=restrictions.shadow_banned,
            suspended=restrictions.suspended,
            ratelimit_override=restrictions.ratelimit_override,
        )
        if requester.is_guest:
            self._check_guest(request)
        if self._ip_recorder is not None:
            address = request.getClientAddress()
            agents = request.requestHeaders.getRawHeaders(b"User-Agent") or [b""]
            self._ip_recorder.on_request(
                requester,
                str(getattr(address, "host", "unknown")),
                agents[0].decode("utf-8", "replace"),
            )
        return requester

    def app_service_of(self, request: Request) -> ApplicationService:
        """The service whose ``as_token`` the request carries (for the
        endpoints reading it themselves: ``/register`` and ``/login`` with
        ``m.login.application_service``); a 401 ``M_MISSING_TOKEN`` or
        ``M_UNKNOWN_TOKEN`` otherwise."""
        token_hash = hash_token(get_access_token_from_request(request))
        service = self._services_by_token_hash.get(token_hash)
        if service is None:
            raise UnknownTokenError()
        return service

    async def _service_requester(
        self, request: Request, service: ApplicationService, token_hash: str
    ) -> Requester:
        """Identity assertion: the service acts as ``?user_id=`` (its
        sender without one), a registered user in its namespaces (403
        ``M_EXCLUSIVE`` outside them, 403 ``M_FORBIDDEN`` for a user not
        registered), with ``?device_id=`` one of that user's devices (400
        ``M_UNKNOWN_DEVICE`` otherwise)."""
        user_id = _query_arg(request, "user_id") or service.sender
        if not service.is_user_in_namespace(user_id):
            raise AuthError(
                403,
                f"Application service {service.id!r} cannot act as {user_id}: it is not in"
                " its user namespaces",
                Codes.EXCLUSIVE,
            )
        if user_id != service.sender and user_id not in self._known_service_users:
            user = await self._store.get_user(user_id)
            if user is None or user["deactivated"]:
                raise AuthError(
                    403, "Application service has not registered this user", Codes.FORBIDDEN
                )
            self._known_service_users.add(user_id)
        device_id = _query_arg(request, "device_id") or ""
        if device_id and await self._store.get_device(user_id, device_id) is None:
            raise AuthError(400, f"{user_id} has no device {device_id}", Codes.UNKNOWN_DEVICE)
        return Requester(user_id, device_id, token_hash, app_service=service)

    def _check_guest(self, request: Request) -> None:
        if not self._allow_guest_access:
            raise AuthError(403, "Guest access is disabled", Codes.GUEST_ACCESS_FORBIDDEN)
        match = matched_servlet(request)
        method = request.method.decode("ascii", errors="replace")
        if match is None or not guest_may_call(match.name, method, match.path_args):
            raise AuthError(
                403,
                "Guest accounts may not do this: register an account",
                Codes.GUEST_ACCESS_FORBIDDEN,
            )


def _query_arg(request: Request, name: str) -> str | None:
    values = (request.args or {}).get(name.encode("ascii"))
    if not values:
        return None
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise AuthError(400, f"'{name}' is not UTF-8", Codes.INVALID_PARAM) from None


class UnknownTokenError(AuthError):
    def __init__(self) -> None:
        super().__init__(401, "Unrecognised access token", Codes.UNKNOWN_TOKEN)

    def error_dict(self) -> dict[str, object]:
        return {**super().error_dict(), "soft_logout": False}
