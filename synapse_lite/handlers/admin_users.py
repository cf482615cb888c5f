"""The admin API's users: listing, reading, creating and changing accounts,
deactivating them and resetting passwords (``docs/admin-api.md``).

The callers have checked the requester is a server admin. Each change is
logged with the admin's id. Only local users are managed: another server's
user is a 400, an unknown local user a 404.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from synapse_lite.api.access_tokens import generate_access_token
from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import (
    check_localpart,
    check_user_id,
    is_mine_id,
    random_string,
)
from synapse_lite.handlers.admin_rooms import room_id_of
from synapse_lite.handlers.auth import MAX_PASSWORD_LENGTH, Requester, hash_password, hash_token
from synapse_lite.http.fields import get_bool, get_list, get_optional_str, get_str
from synapse_lite.storage.databases.main.admin import AdminUserRow, UserQuery

if TYPE_CHECKING:
    from synapse_lite.handlers.account import AccountHandler
    from synapse_lite.handlers.device import DeviceHandler
    from synapse_lite.handlers.profile import ProfileHandler
    from synapse_lite.handlers.room_member import RoomMemberHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Longest display name or avatar URL set through the admin API (as the
#: profile API's).
MAX_PROFILE_FIELD = 256


def user_json(row: AdminUserRow, flags_as_ints: bool) -> dict[str, Any]:
    """A user as ``GET /v2/users`` lists it: ``flags_as_ints`` gives the v2
    listing's 0/1 flags, which the reference homeserver keeps there; v3 and
    the single-user answer use booleans."""

    def flag(value: bool) -> bool | int:
        return int(value) if flags_as_ints else value

    return {
        "name": row.user_id,
        "is_guest": flag(row.is_guest),
        "admin": flag(row.admin),
        "user_type": None,
        "deactivated": flag(row.deactivated),
        "erased": row.erased,
        "shadow_banned": flag(row.shadow_banned),
        "displayname": row.displayname,
        "avatar_url": row.avatar_url,
        "creation_ts": row.creation_ts,
        "last_seen_ts": row.last_seen_ts,
        "locked": False,
        "suspended": row.suspended,
    }


def _optional_bool(body: dict[str, Any], name: str) -> bool | None:
    return None if body.get(name) is None else get_bool(body, name, False)


class AdminUsersHandler:
    """``/_synapse/admin/v{1,2,3}/users...``, ``/v1/deactivate``, ``/v1/reset_password``."""

    def __init__(
        self,
        store: GenericWorkerStore,
        server_name: str,
        devices: DeviceHandler,
        account: AccountHandler,
        profiles: ProfileHandler,
        members: RoomMemberHandler,
    ) -> None:
        self._store = store
        self._server_name = server_name
        self._devices = devices
        self._account = account
        self._profiles = profiles
        self._members = members

    def check_local(self, user_id: str) -> str:
        """A valid user id of this server, or a 400."""
        check_user_id(user_id, "userId")
        if not is_mine_id(user_id, self._server_name):
            raise SynapseError(400, "Can only manage local users", Codes.INVALID_PARAM)
        return user_id

    async def _existing(self, user_id: str) -> AdminUserRow:
        self.check_local(user_id)
        row = await self._store.get_admin_user(user_id)
        if row is None:
            raise NotFoundError("User not found")
        return row

    async def list_users(
        self, query: UserQuery, offset: int, limit: int, flags_as_ints: bool
    ) -> dict[str, Any]:
        rows, total = await self._store.list_users(query, offset, limit)
        result: dict[str, Any] = {
            "users": [user_json(r, flags_as_ints) for r in rows],
            "total": total,
        }
        if offset + len(rows) < total:
            result["next_token"] = str(offset + len(rows))
        return result

    async def get_user(self, user_id: str) -> dict[str, Any]:
        row = await self._existing(user_id)
        answer = user_json(row, flags_as_ints=False)
        answer.update(
            threepids=[],
            external_ids=[],
            appservice_id=None,
            consent_server_notice_sent=None,
            consent_version=None,
            consent_ts=None,
        )
        return answer

    async def is_admin(self, user_id: str) -> bool:
        return (await self._existing(user_id)).admin

    async def set_admin(self, admin: Requester, user_id: str, value: bool) -> None:
        await self._existing(user_id)
        if user_id == admin.user_id and not value:
            raise SynapseError(400, "You may not demote yourself.", Codes.INVALID_PARAM)
        await self._store.set_user_admin(user_id, value)
        logger.info("admin %s set admin=%s on %s", admin.user_id, value, user_id)

    async def put_user(
        self, admin: Requester, user_id: str, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        """Create the user (201) or change what ``body`` names (200); the
        answer is the user as :meth:`get_user` gives it."""
        self.check_local(user_id)
        password = get_optional_str(body, "password", max_length=MAX_PASSWORD_LENGTH)
        logout_devices = get_bool(body, "logout_devices", True)
        displayname = get_optional_str(body, "displayname", max_length=MAX_PROFILE_FIELD)
        avatar_url = get_optional_str(body, "avatar_url", max_length=MAX_PROFILE_FIELD)
        make_admin = _optional_bool(body, "admin")
        deactivate = _optional_bool(body, "deactivated")
        for field in ("threepids", "external_ids"):
            # This server holds neither; an empty list (what the admin UI
            # sends) is fine, anything else would be silently lost.
            if get_list(body, field, []):
                raise SynapseError(
                    400, f"'{field}' are not supported by this server", Codes.INVALID_PARAM
                )
        if password == "":
            raise SynapseError(400, "'password' must not be empty", Codes.INVALID_PARAM)
        existing = await self._store.get_admin_user(user_id)
        created = existing is None
        if existing is None:
            localpart = user_id[1:].split(":", 1)[0]
            check_localpart(localpart)
            if localpart != localpart.lower():
                raise SynapseError(400, "User ID must be lower case", Codes.INVALID_USERNAME)
            if deactivate:
                raise SynapseError(400, "Cannot create a deactivated user", Codes.INVALID_PARAM)
            password_hash = None if password is None else await hash_password(password)
            await self._store.register_user(user_id, password_hash, admin=bool(make_admin))
            await self._store.set_profile_field(
                user_id, "displayname", displayname or localpart, localpart
            )
            logger.info("admin %s created %s", admin.user_id, user_id)
        else:
            if make_admin is not None and make_admin != existing.admin:
                await self.set_admin(admin, user_id, make_admin)
            if deactivate is False and existing.deactivated:
                if password is None:
                    raise SynapseError(
                        400, "Reactivating a user needs a 'password'", Codes.MISSING_PARAM
                    )
                await self._store.reactivate_user(user_id)
                logger.info("admin %s reactivated %s", admin.user_id, user_id)
            if password is not None:
                await self._set_password(admin, user_id, password, logout_devices)
            if displayname is not None:
                await self._set_profile(user_id, "displayname", displayname)
            if deactivate and not existing.deactivated:
                await self.deactivate(admin, user_id, erase=False)
        if created and avatar_url is not None:
            await self._store.set_profile_field(
                user_id, "avatar_url", avatar_url, user_id[1:].split(":", 1)[0]
            )
        elif avatar_url is not None:
            await self._set_profile(user_id, "avatar_url", avatar_url)
        return (201 if created else 200), await self.get_user(user_id)

    async def _set_profile(self, user_id: str, field: str, value: str) -> None:
        # As the user: their rooms get the new member event.
        await self._profiles.set_field(Requester(user_id, "", ""), user_id, field, value)

    async def _set_password(
        self, admin: Requester, user_id: str, password: str, logout_devices: bool
    ) -> None:
        await self._store.set_password_hash(user_id, await hash_password(password))
        if logout_devices:
            await self._devices.delete_devices(user_id, None)
        logger.info("admin %s reset the password of %s", admin.user_id, user_id)

    async def set_shadow_banned(self, admin: Requester, user_id: str, banned: bool) -> None:
        """Shadow-ban ``user_id`` (``handlers/shadow_ban.py``) or lift it;
        applies to their next request on every process."""
        await self._existing(user_id)
        await self._store.set_shadow_banned(user_id, banned)
        logger.info("admin %s set shadow_banned=%s on %s", admin.user_id, banned, user_id)

    async def set_suspended(self, admin: Requester, user_id: str, suspended: bool) -> None:
        """Suspend ``user_id`` (``handlers/suspension.py``) or lift it;
        applies to their next request on every process."""
        await self._existing(user_id)
        await self._store.set_suspended(user_id, suspended)
        logger.info("admin %s set suspended=%s on %s", admin.user_id, suspended, user_id)

    async def get_ratelimit_override(self, user_id: str) -> dict[str, Any]:
        """``{"messages_per_second", "burst_count"}``, or ``{}`` without one."""
        await self._existing(user_id)
        override = (await self._store.get_user_restrictions(user_id)).ratelimit_override
        if override is None:
            return {}
        return {
            "messages_per_second": int(override.per_second),
            "burst_count": override.burst,
        }

    async def set_ratelimit_override(
        self, admin: Requester, user_id: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """``messages_per_second`` and ``burst_count`` (integers >= 0,
        default 0; 0 per second: no limit) replace the configured message
        rate limit of ``user_id``."""
        await self._existing(user_id)
        values = {}
        for key in ("messages_per_second", "burst_count"):
            value = body.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**53:
                raise SynapseError(400, f"'{key}' must be an integer >= 0", Codes.INVALID_PARAM)
            values[key] = value
        await self._store.set_ratelimit_override(
            user_id, values["messages_per_second"], values["burst_count"]
        )
        logger.info("admin %s overrode the rate limit of %s: %s", admin.user_id, user_id, values)
        return values

    async def delete_ratelimit_override(self, admin: Requester, user_id: str) -> None:
        await self._existing(user_id)
        await self._store.delete_ratelimit_override(user_id)
        logger.info("admin %s removed the rate limit override of %s", admin.user_id, user_id)

    async def login_as(self, admin: Requester, user_id: str, body: dict[str, Any]) -> str:
        """``POST /v1/users/{userId}/login``: an access token acting as
        ``user_id``, until ``valid_until_ms`` (ms since the epoch; default: no
        end) or logged out with it. It belongs to no device the user can see
        (a device id without a ``devices`` row, ``ADMIN-...``): their device
        list does not change. Not for oneself (400), nor a deactivated user."""
        user = await self._existing(user_id)
        if user_id == admin.user_id:
            raise SynapseError(400, "Cannot log in as yourself", Codes.INVALID_PARAM)
        if user.deactivated:
            raise SynapseError(400, "The user is deactivated", Codes.INVALID_PARAM)
        valid_until = body.get("valid_until_ms")
        if valid_until is not None and (
            isinstance(valid_until, bool)
            or not isinstance(valid_until, int)
            or valid_until <= self._store.clock.time_msec()
        ):
            raise SynapseError(
                400, "'valid_until_ms' must be a time in the future (ms)", Codes.INVALID_PARAM
            )
        token = generate_access_token(user_id)
        device_id = "ADMIN-" + random_string(10)
        await self._store.add_access_token(hash_token(token), user_id, device_id, valid_until)
        logger.info(
            "admin %s logged in as %s (device %s, until %s)",
            admin.user_id,
            user_id,
            device_id,
            valid_until,
        )
        return token

    async def reset_password(self, admin: Requester, user_id: str, body: dict[str, Any]) -> None:
        """``POST /v1/reset_password/{userId}``: ``new_password``, and every
        device logged out unless ``logout_devices`` is false."""
        row = await self._existing(user_id)
        if row.deactivated:
            raise SynapseError(400, "The user is deactivated", Codes.INVALID_PARAM)
        password = get_str(body, "new_password", max_length=MAX_PASSWORD_LENGTH)
        if not password:
            raise SynapseError(400, "'new_password' must not be empty", Codes.INVALID_PARAM)
        await self._set_password(admin, user_id, password, get_bool(body, "logout_devices", True))

    async def deactivate(self, admin: Requester, user_id: str, erase: bool) -> str:
        """Deactivate (and with ``erase``, erase) a user as the user could
        themself; the identity servers' unbind result."""
        await self._existing(user_id)
        result = await self._account.deactivate_account(user_id, erase, None)
        logger.info("admin %s deactivated %s (erase=%s)", admin.user_id, user_id, erase)
        return result

    # A user's rooms and devices

    async def joined_rooms(self, user_id: str) -> dict[str, Any]:
        await self._existing(user_id)
        rooms = sorted(await self._store.get_rooms_for_user(user_id))
        return {"joined_rooms": rooms, "total": len(rooms)}

    async def memberships(self, user_id: str) -> dict[str, Any]:
        """Every room the user has a membership in now, with it."""
        await self._existing(user_id)
        rows = await self._store.get_local_memberships_with_positions(user_id)
        # ``total`` is not the reference's: the admin UI reads it.
        return {"memberships": {row[0]: row[1] for row in rows}, "total": len(rows)}

    async def sent_invite_count(self, user_id: str, from_ts: int) -> dict[str, Any]:
        """``{"invite_count": n}``: the invites the user sent at or after
        ``from_ts`` (by the events' ``origin_server_ts``)."""
        await self._existing(user_id)
        return {"invite_count": await self._store.count_invites_sent(user_id, from_ts)}

    async def cumulative_joined_room_count(self, user_id: str, from_ts: int) -> dict[str, Any]:
        """``{"cumulative_joined_room_count": n}``: the rooms the user joined
        at or after ``from_ts``, left since or not."""
        await self._existing(user_id)
        joined = await self._store.count_rooms_joined(user_id, from_ts)
        return {"cumulative_joined_room_count": joined}

    async def account_data(self, user_id: str) -> dict[str, Any]:
        """``{"account_data": {"global": {type: content}, "rooms": {room:
        {type: content}}}}``."""
        await self._existing(user_id)
        return {
            "account_data": {
                "global": await self._store.get_global_account_data(user_id),
                "rooms": await self._store.get_room_account_data(user_id),
            }
        }

    async def _with_last_seen(self, user_id: str, devices: list[dict[str, Any]]) -> None:
        seen: dict[str, tuple[str | None, str | None, int | None]] = {}
        for row in await self._store.get_user_ips(user_id):
            seen.setdefault(row[0], row[1:])  # most recent first
        for device in devices:
            found = seen.get(device["device_id"], (None, None, None))
            device.update(
                user_id=user_id,
                last_seen_ip=found[0],
                last_seen_user_agent=found[1],
                last_seen_ts=found[2],
            )

    async def devices(self, user_id: str) -> dict[str, Any]:
        await self._existing(user_id)
        devices = await self._devices.get_devices(user_id)
        await self._with_last_seen(user_id, devices)
        return {"devices": devices, "total": len(devices)}

    async def device(self, user_id: str, device_id: str) -> dict[str, Any]:
        await self._existing(user_id)
        device = await self._devices.get_device(user_id, device_id)
        await self._with_last_seen(user_id, [device])
        return device

    async def rename_device(
        self, admin: Requester, user_id: str, device_id: str, display_name: str | None
    ) -> None:
        await self._existing(user_id)
        await self._devices.rename_device(user_id, device_id, display_name)
        logger.info("admin %s renamed the device %s of %s", admin.user_id, device_id, user_id)

    async def create_device(self, admin: Requester, user_id: str, device_id: str) -> None:
        """``POST /v2/users/{userId}/devices``: give the user ``device_id``
        unless it has it (then nothing changes: its tokens keep working).
        Made through the user's device_lists writer like a login's device,
        with a token nobody is told, so the device has no usable token until
        its user logs in with that device id."""
        await self._existing(user_id)
        if await self._devices.has_device(user_id, device_id):
            return
        await self._devices.create_device_and_token(user_id, device_id, None)
        logger.info("admin %s created the device %s of %s", admin.user_id, device_id, user_id)

    async def delete_devices(self, admin: Requester, user_id: str, device_ids: list[str]) -> None:
        """Log the devices out (those the user does not have are ignored)."""
        await self._existing(user_id)
        await self._devices.delete_devices(user_id, device_ids)
        logger.info("admin %s deleted the devices %s of %s", admin.user_id, device_ids, user_id)

    async def pushers(self, user_id: str) -> dict[str, Any]:
        await self._existing(user_id)
        pushers = await self._store.get_pushers_for_user(user_id)
        for pusher in pushers:
            pusher["user_name"] = user_id
        return {"pushers": pushers, "total": len(pushers)}

    async def media(
        self, user_id: str, offset: int, limit: int, order_by: str, descending: bool
    ) -> dict[str, Any]:
        """The media the user uploaded. This server keeps no access times:
        ``last_access_ts`` is null."""
        await self._existing(user_id)
        rows, total = await self._store.list_user_media(
            user_id, offset, limit, order_by, descending
        )
        media = [
            {
                "media_id": media_id,
                "media_type": media_type,
                "media_length": media_length,
                "upload_name": upload_name,
                "created_ts": int(created_ts),
                "last_access_ts": None,
                "quarantined_by": quarantined_by,
                "safe_from_quarantine": bool(protected),
            }
            for (
                media_id,
                media_type,
                media_length,
                upload_name,
                created_ts,
                quarantined_by,
                protected,
            ) in rows
        ]
        result: dict[str, Any] = {"media": media, "total": total}
        if offset + len(rows) < total:
            result["next_token"] = offset + len(rows)
        return result

    async def media_statistics(
        self, offset: int, limit: int, order_by: str, descending: bool, search_term: str | None
    ) -> dict[str, Any]:
        rows, total = await self._store.media_statistics(
            offset, limit, order_by, descending, search_term
        )
        users = [
            {
                "user_id": user_id,
                "displayname": displayname,
                "media_count": int(count),
                "media_length": int(length),
            }
            for user_id, displayname, count, length in rows
        ]
        result: dict[str, Any] = {"users": users, "total": total}
        if offset + len(rows) < total:
            result["next_token"] = offset + len(rows)
        return result

    async def join(self, admin: Requester, room: str, body: dict[str, Any]) -> str:
        """``POST /v1/join/{roomIdOrAlias}``: the local ``user_id`` joins the
        room (as they could themself: a room they may not join is a 403)."""
        user_id = get_str(body, "user_id")
        await self._existing(user_id)
        room_id = await room_id_of(self._store, room)
        await self._members.update_membership(Requester(user_id, "", ""), room_id, "join")
        logger.info("admin %s joined %s to %s", admin.user_id, user_id, room_id)
        return room_id
