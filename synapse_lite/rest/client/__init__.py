"""The Client-Server API (v3) servlets; the logic they call lives in handlers/.

Servlets are thin: they authenticate, parse and validate the request, call a
handler and shape the response. See docs/client-api.md for what is served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.http.server import JsonResource
from synapse_lite.rest import admin as admin_api
from synapse_lite.rest.client import (
    account,
    account_management,
    appservice,
    directory,
    keys,
    legacy_sync,
    openid,
    profile,
    push_rules,
    reports,
    room,
    search,
    sliding_sync,
    spaces,
    sync,
    user_data,
    versions,
    voip,
)

if TYPE_CHECKING:
    from synapse_lite.appservice.queries import AppServiceQueries
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import TurnConfig
    from synapse_lite.handlers.account import AccountHandler
    from synapse_lite.handlers.account_data import AccountDataHandler
    from synapse_lite.handlers.admin import AdminHandler
    from synapse_lite.handlers.admin_media import AdminMediaHandler
    from synapse_lite.handlers.admin_reports import AdminReportsHandler
    from synapse_lite.handlers.admin_room_tools import AdminRoomToolsHandler
    from synapse_lite.handlers.admin_rooms import AdminRoomsHandler
    from synapse_lite.handlers.admin_users import AdminUsersHandler
    from synapse_lite.handlers.auth import AuthHandler
    from synapse_lite.handlers.device import DeviceHandler
    from synapse_lite.handlers.devicemessage import DeviceMessageHandler
    from synapse_lite.handlers.directory import DirectoryHandler
    from synapse_lite.handlers.e2e_keys import E2eKeysHandler
    from synapse_lite.handlers.filtering import FilteringHandler
    from synapse_lite.handlers.identity import IdentityHandler
    from synapse_lite.handlers.legacy_sync import LegacySyncHandler
    from synapse_lite.handlers.login import LoginHandler
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.handlers.openid import OpenIdHandler
    from synapse_lite.handlers.pagination import PaginationHandler
    from synapse_lite.handlers.presence import PresenceHandlerBase
    from synapse_lite.handlers.profile import ProfileHandler
    from synapse_lite.handlers.purge_history import PurgeHistoryHandler
    from synapse_lite.handlers.push_rules import PushRulesHandler
    from synapse_lite.handlers.receipts import ReceiptsHandler
    from synapse_lite.handlers.redact_user import RedactUserHandler
    from synapse_lite.handlers.register import RegistrationHandler
    from synapse_lite.handlers.registration_tokens import RegistrationTokensHandler
    from synapse_lite.handlers.relations import RelationsHandler
    from synapse_lite.handlers.reports import ReportsHandler
    from synapse_lite.handlers.room import RoomCreationHandler
    from synapse_lite.handlers.room_deletion import RoomDeletionHandler
    from synapse_lite.handlers.room_keys import RoomKeysHandler
    from synapse_lite.handlers.room_member import RoomMemberHandler
    from synapse_lite.handlers.room_upgrade import RoomUpgradeHandler
    from synapse_lite.handlers.search import SearchHandler
    from synapse_lite.handlers.server_notices import ServerNoticesHandler
    from synapse_lite.handlers.sliding_sync.handler import SlidingSyncHandler
    from synapse_lite.handlers.space_hierarchy import SpaceHierarchyHandler
    from synapse_lite.handlers.sync import SyncHandler
    from synapse_lite.handlers.typing import TypingHandlerBase
    from synapse_lite.handlers.ui_auth import InteractiveAuthHandler


@attr.s(slots=True, frozen=True, auto_attribs=True, kw_only=True)
class ClientHandlers:
    """What the client API calls: the handlers behind its servlets, built by
    the composition root (``app/composition.py``)."""

    clock: Clock
    auth: AuthHandler
    registration: RegistrationHandler
    registration_tokens: RegistrationTokensHandler
    login: LoginHandler
    devices: DeviceHandler
    filtering: FilteringHandler
    sync: SyncHandler
    sliding_sync: SlidingSyncHandler
    legacy_sync: LegacySyncHandler
    events: EventCreationHandler
    room_creation: RoomCreationHandler
    room_upgrade: RoomUpgradeHandler
    members: RoomMemberHandler
    pagination: PaginationHandler
    receipts: ReceiptsHandler
    account_data: AccountDataHandler
    device_messages: DeviceMessageHandler
    e2e_keys: E2eKeysHandler
    room_keys: RoomKeysHandler
    ui_auth: InteractiveAuthHandler
    typing: TypingHandlerBase
    presence: PresenceHandlerBase
    account: AccountHandler
    reports: ReportsHandler
    admin: AdminHandler
    admin_users: AdminUsersHandler
    admin_rooms: AdminRoomsHandler
    admin_media: AdminMediaHandler
    server_notices: ServerNoticesHandler
    admin_room_tools: AdminRoomToolsHandler
    room_deletion: RoomDeletionHandler
    purge_history: PurgeHistoryHandler
    redact_user: RedactUserHandler
    admin_reports: AdminReportsHandler
    openid: OpenIdHandler
    push_rules: PushRulesHandler
    turn: TurnConfig
    profiles: ProfileHandler
    directory: DirectoryHandler
    spaces: SpaceHierarchyHandler
    relations: RelationsHandler
    search: SearchHandler
    identity: IdentityHandler
    server_name: str
    app_service_queries: AppServiceQueries


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    """Serve every client endpoint, and the admin API, on ``resource``."""
    modules: list[Any] = [
        versions,
        account,
        account_management,
        room,
        search,
        sync,
        sliding_sync,
        legacy_sync,
        user_data,
        keys,
        reports,
        openid,
        push_rules,
        profile,
        directory,
        spaces,
        voip,
        appservice,
    ]
    for module in modules:
        module.register_servlets(handlers, resource)
    admin_api.register_servlets(handlers, resource)
