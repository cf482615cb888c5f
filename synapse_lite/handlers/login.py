"""Logging in with a password, and logging out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import AuthError, Codes, SynapseError
from synapse_lite.api.identifiers import MAX_ID_LENGTH, check_identifier_text, new_device_id
from synapse_lite.handlers.auth import MAX_PASSWORD_LENGTH, Requester, check_password
from synapse_lite.handlers.ratelimit import Ratelimiter
from synapse_lite.http.fields import get_optional_str, get_str

if TYPE_CHECKING:
    from synapse_lite.appservice.registration import ApplicationService
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import HomeServerConfig
    from synapse_lite.handlers.device import DeviceHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

#: The login type of an application service logging in as one of its users.
APP_SERVICE_LOGIN = "m.login.application_service"
LOGIN_FLOWS = [{"type": "m.login.password"}, {"type": APP_SERVICE_LOGIN}]


def user_id_from_login_body(body: dict[str, Any], server_name: str) -> str:
    """The user a ``m.login.password`` body (a login, or a user-interactive
    auth stage) names: its ``identifier`` (``m.id.user`` only) or the legacy
    ``user`` field, a localpart being taken as one of ``server_name``'s."""
    identifier = body.get("identifier")
    if identifier is not None:
        if not isinstance(identifier, dict) or identifier.get("type") != "m.id.user":
            raise SynapseError(400, "Only m.id.user identifiers are supported", Codes.UNKNOWN)
        user = get_str(identifier, "user", max_length=MAX_ID_LENGTH)
    else:
        user = get_str(body, "user", max_length=MAX_ID_LENGTH)
    if user.startswith("@"):
        return user
    return f"@{user.lower()}:{server_name}"


class LoginHandler:
    """``POST /login`` (``m.login.password``) and ``/logout[/all]``."""

    def __init__(
        self,
        store: GenericWorkerStore,
        clock: Clock,
        config: HomeServerConfig,
        devices: DeviceHandler,
    ) -> None:
        self._store = store
        self._server_name = config.server_name
        self._devices = devices
        limits = config.rate_limits
        self._per_ip = Ratelimiter(clock, limits.login, limits.enabled)
        self._per_account = Ratelimiter(clock, limits.login, limits.enabled)

    async def login(
        self,
        client_ip: str,
        body: dict[str, Any],
        app_service: ApplicationService | None = None,
    ) -> dict[str, Any]:
        """``app_service``: the service whose ``as_token`` the request
        carries, for ``m.login.application_service`` (the servlet checks the
        token: only that type reads it)."""
        if body.get("type") == APP_SERVICE_LOGIN and app_service is not None:
            user_id = user_id_from_login_body(body, self._server_name)
            if not app_service.is_user_in_namespace(user_id):
                raise AuthError(
                    403, f"{user_id} is outside the service's namespaces", Codes.EXCLUSIVE
                )
            user = await self._store.get_user(user_id)
            if user is None or user["deactivated"]:
                raise AuthError(403, "Invalid username", Codes.FORBIDDEN)
        elif body.get("type") == "m.login.password":
            self._per_ip.ratelimit(client_ip)
            user_id = user_id_from_login_body(body, self._server_name)
            password = get_str(body, "password", max_length=MAX_PASSWORD_LENGTH)
            self._per_account.ratelimit(user_id)
            user = await self._store.get_user(user_id)
            if (
                user is None
                or user["deactivated"]
                or not await check_password(password, user["password_hash"])
            ):
                raise AuthError(403, "Invalid username or password", Codes.FORBIDDEN)
        else:
            self._per_ip.ratelimit(client_ip)
            raise SynapseError(400, "Unknown login type", Codes.UNKNOWN)
        device_id = body.get("device_id")
        if device_id is not None:
            check_identifier_text(device_id, "device_id")
        display_name = get_optional_str(body, "initial_device_display_name", max_length=512)
        device_id = device_id or new_device_id()
        token = await self._devices.create_device_and_token(user_id, device_id, display_name)
        return {
            "user_id": user_id,
            "access_token": token,
            "device_id": device_id,
            "home_server": self._server_name,
        }

    async def logout(self, requester: Requester, all_devices: bool) -> None:
        await self._devices.delete_devices(
            requester.user_id, None if all_devices else [requester.device_id]
        )
