"""Device lists across servers (docs/federation.md, "Device lists across
servers").

Other servers' users: we keep a copy of a remote user's devices, device
keys and cross-signing keys (delta 0150) once we fetched the whole list
(``GET /_matrix/federation/v1/user/devices/{userId}``), for users who share
a room with one of ours (the others' servers would never tell us of a
change): at their first ``m.device_list_update`` (in the background) or
the first query. Their EDUs update the copy one device at
a time when they follow on from it (a ``prev_id`` we are at); a gap marks
the copy stale and it is fetched again (in the background, and before any
query is answered from it); so does a room we join through another server
for its members who share no other room with ours (their servers told us
nothing meanwhile). ``m.signing_key_update`` replaces the
cross-signing keys. Every change, copied or not, is a row on the
device_lists stream for the remote user, so our users' /sync lists the
user under ``device_lists.changed``. The writes run on the user's
device_lists writer (``WRITE_REMOTE_DEVICE_LIST``).

``/keys/query`` for a remote user is answered from the copy, else by the
user's server (``POST /user/keys/query``); ``/keys/claim`` always asks it
(``POST /user/keys/claim``). Our users: :meth:`RemoteDeviceLists.user_devices`
is what ``GET /user/devices/{userId}`` serves.

Everything another server says is checked: a device or key naming another
user or device, or of the wrong shape, is left out; an EDU for a user not
of the origin, or sharing no room with us, is dropped.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from synapse_lite.api.errors import SynapseError
from synapse_lite.api.identifiers import server_of
from synapse_lite.federation.client import FederationRequestError
from synapse_lite.federation.inbound_edus import MAX_ID, DroppedEdu, user_of
from synapse_lite.federation.sender.edus import DEVICE_LIST_UPDATE, SIGNING_KEY_UPDATE
from synapse_lite.handlers.e2e_keys import check_cross_signing_key
from synapse_lite.keyed_locks import KeyedLocks
from synapse_lite.replication.http.e2e_keys import KeysChanged
from synapse_lite.replication.http.remote_devices import (
    CHANGED,
    REPLACE,
    SIGNING,
    UPDATE,
    WRITE_REMOTE_DEVICE_LIST,
    RemoteDeviceListWrite,
)
from synapse_lite.storage.databases.main.remote_devices import RemoteDevice

if TYPE_CHECKING:
    from synapse_lite.federation.client import FederationClient
    from synapse_lite.notifier import Notifier
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore
    from synapse_lite.streams.writers import WritersDirectory

logger = logging.getLogger(__name__)

FEDERATION_V1 = "/_matrix/federation/v1"
#: Devices kept of one remote user (a list longer is cut, with a warning).
MAX_REMOTE_DEVICES = 1_000
#: Remote users whose whole list one query fetches; the rest are asked
#: with ``/user/keys/query``.
MAX_RESYNCS_PER_QUERY = 50
#: The cross-signing keys other servers are told of, by their field.
SHARED_CROSS_SIGNING = {"master_key": "master", "self_signing_key": "self_signing"}
MAX_DISPLAY_NAME = 1_000


def device_keys_of(user_id: str, device_id: str, keys: object) -> dict[str, Any] | None:
    """A remote device's keys when they are an object for that user and
    device (their signatures are the clients' to verify), else None."""
    if (
        isinstance(keys, dict)
        and keys.get("user_id") == user_id
        and keys.get("device_id") == device_id
        and isinstance(keys.get("keys"), dict)
    ):
        return {k: v for k, v in keys.items() if k != "unsigned"}
    return None


def cross_signing_keys_of(user_id: str, fields: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{key type: key}`` of the well-formed ``master_key`` and
    ``self_signing_key`` of ``fields`` (others are left out, logged)."""
    keys: dict[str, dict[str, Any]] = {}
    for field, usage in SHARED_CROSS_SIGNING.items():
        if fields.get(field) is None:
            continue
        try:
            keys[usage] = check_cross_signing_key(fields[field], user_id, usage, field)
        except SynapseError as e:
            logger.info("Leaving out %s's %s: %s", user_id, field, e.msg)
    return keys


def parse_user_devices(
    user_id: str, answer: object
) -> tuple[int, list[RemoteDevice], dict[str, dict[str, Any]]]:
    """``(stream_id, devices, cross-signing keys)`` of a ``/user/devices``
    answer for ``user_id``; ValueError when it is not one."""
    if not isinstance(answer, dict) or answer.get("user_id") != user_id:
        raise ValueError("the answer is not for that user")
    stream_id, listed = answer.get("stream_id"), answer.get("devices")
    if isinstance(stream_id, bool) or not isinstance(stream_id, int) or stream_id < 0:
        raise ValueError("no valid stream_id")
    if not isinstance(listed, list):
        raise ValueError("no list of devices")
    if len(listed) > MAX_REMOTE_DEVICES:
        logger.warning("%s has %d devices: keeping %d", user_id, len(listed), MAX_REMOTE_DEVICES)
    devices: dict[str, RemoteDevice] = {}
    for item in listed[:MAX_REMOTE_DEVICES]:
        device = parse_device(user_id, item)
        if device is not None:
            devices[device.device_id] = device
    return stream_id, list(devices.values()), cross_signing_keys_of(user_id, answer)


def parse_device(user_id: str, item: object) -> RemoteDevice | None:
    """A device of a ``/user/devices`` answer or an EDU, None when it has
    no valid ``device_id`` (a bad display name or keys are left out)."""
    if not isinstance(item, dict):
        return None
    device_id = item.get("device_id")
    if not isinstance(device_id, str) or not 0 < len(device_id) <= MAX_ID:
        return None
    name = item.get("device_display_name")
    if not isinstance(name, str) or len(name) > MAX_DISPLAY_NAME:
        name = None
    return RemoteDevice(device_id, name, device_keys_of(user_id, device_id, item.get("keys")))


def _device_json(device: RemoteDevice) -> dict[str, Any]:
    return {"device_id": device.device_id, "display_name": device.display_name, "keys": device.keys}


def _device_from_json(value: dict[str, Any]) -> RemoteDevice:
    return RemoteDevice(value["device_id"], value.get("display_name"), value.get("keys"))


class RemoteDeviceLists:
    """Remote users' device lists, and our users' served to other servers
    (see the module docstring)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        calls: InternalCalls,
        writers: WritersDirectory,
        server_name: str,
        notifier: Notifier,
        get_client: Callable[[], FederationClient] | None,
    ) -> None:
        """``get_client``: this process's federation client (None: it asks
        no other server; remote users' keys are then failures)."""
        self._store = store
        self._calls = calls
        self._writers = writers
        self._server_name = server_name
        self._notifier = notifier
        self._get_client = get_client
        #: Users whose list is being fetched in the background.
        self._resyncing: set[str] = set()
        #: Writes of one user's list go one at a time: a REPLACE deletes the
        #: user's devices and inserts the new list, and two at once (the
        #: list fetched for a /keys/query beside an EDU's own fetch) both
        #: inserted (PostgreSQL: a duplicate key, a 500 to the client).
        self._user_locks = KeyedLocks()

    # Writes (on the user's device_lists writer)

    async def write(self, change: RemoteDeviceListWrite) -> KeysChanged:
        """Serves :data:`WRITE_REMOTE_DEVICE_LIST`."""
        async with self._user_locks.hold(change.user_id):
            stream_id = await self._write_locked(change)
        # Other processes are woken by the stream's rows; this one's /syncs here.
        rooms = await self._store.get_rooms_shared_with_local_users(change.user_id)
        self._notifier.notify(rooms=rooms)
        return KeysChanged(stream_id)

    async def _write_locked(self, change: RemoteDeviceListWrite) -> int:
        store, user_id, data = self._store, change.user_id, change.data
        if change.kind == REPLACE:
            stream_id = await store.replace_remote_device_list(
                user_id,
                data["stream_id"],
                [_device_from_json(d) for d in data["devices"]],
                data["cross_signing"],
            )
        elif change.kind == UPDATE:
            stream_id = await store.update_remote_device(
                user_id, data["stream_id"], _device_from_json(data["device"]), data["deleted"]
            )
        elif change.kind == SIGNING:
            stream_id = await store.set_remote_cross_signing_keys(user_id, data["keys"])
        else:
            stream_id = await store.note_remote_device_change(
                user_id, list(data["device_ids"]), bool(data["stale"])
            )
        return stream_id

    async def _write(self, user_id: str, kind: str, data: dict[str, Any]) -> None:
        await self._calls.call(
            WRITE_REMOTE_DEVICE_LIST,
            RemoteDeviceListWrite(user_id, kind, data),
            instance=self._writers.writer_for("device_lists", user_id),
        )

    # EDUs

    async def on_edu(self, origin: str, edu_type: str, content: dict[str, Any]) -> None:
        """An ``m.device_list_update`` or ``m.signing_key_update`` from
        ``origin``; raises :class:`DroppedEdu` for one it refuses."""
        user_id = user_of(origin, content.get("user_id"))
        if not await self._store.get_rooms_shared_with_local_users(user_id):
            raise DroppedEdu(f"{user_id} shares no room with us")
        state = await self._store.get_remote_device_list_state(user_id)
        if edu_type == SIGNING_KEY_UPDATE:
            keys = cross_signing_keys_of(user_id, content)
            if not keys:
                raise DroppedEdu("no valid cross-signing key")
            if state is None:
                await self._write(user_id, CHANGED, {"device_ids": sorted(keys), "stale": False})
            else:
                await self._write(user_id, SIGNING, {"keys": keys})
            return
        assert edu_type == DEVICE_LIST_UPDATE
        device = parse_device(user_id, content)
        stream_id, prev_ids = content.get("stream_id"), content.get("prev_id") or []
        deleted = content.get("deleted", False)
        if device is None:
            raise DroppedEdu("no valid device_id")
        if isinstance(stream_id, bool) or not isinstance(stream_id, int) or stream_id < 0:
            raise DroppedEdu("no valid stream_id")
        if not isinstance(prev_ids, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in prev_ids
        ):
            raise DroppedEdu("'prev_id' is not a list of stream ids")
        if not isinstance(deleted, bool):
            raise DroppedEdu("'deleted' is not true or false")
        if state is None:
            # A user sharing a room with ours whose list we do not keep yet:
            # fetched now, so that the next query and the next updates are
            # answered from the copy (our users' /sync hears of it at once).
            await self._write(user_id, CHANGED, {"device_ids": [device.device_id], "stale": False})
            self._resync_in_background(user_id)
            return
        if not state.stale and stream_id < state.stream_id:
            return  # already in our copy (one change may touch several devices)
        if not state.stale and prev_ids and max(prev_ids) <= state.stream_id:
            await self._write(
                user_id,
                UPDATE,
                {"stream_id": stream_id, "device": _device_json(device), "deleted": deleted},
            )
            return
        logger.info(
            "%s's device list skipped from %d to %d (prev_id %s): fetching it again",
            user_id,
            state.stream_id,
            stream_id,
            prev_ids,
        )
        await self._write(user_id, CHANGED, {"device_ids": [device.device_id], "stale": True})
        self._resync_in_background(user_id)

    async def on_room_rejoined(self, room_id: str, members: Iterable[str]) -> None:
        """Our server joined ``room_id`` through another server, so it
        shared the room with none of ``members`` (its joined users) just
        before: another server's user whose list we keep and who shares no
        other room with ours may have changed devices meanwhile, and their
        server told us nothing then. Each such copy is marked stale (a row
        on the device_lists stream: our users' /sync lists the user under
        ``changed``, and the next query fetches the list first) and fetched
        again in the background. Users we keep no copy of need nothing: a
        client learns of them from the join itself."""
        for user_id in members:
            if server_of(user_id) == self._server_name:
                continue
            state = await self._store.get_remote_device_list_state(user_id)
            if state is None or state.stale:
                continue
            shared = await self._store.get_rooms_shared_with_local_users(user_id)
            if any(room != room_id for room in shared):
                continue  # told of every change through the other room
            await self._write(user_id, CHANGED, {"device_ids": [], "stale": True})
            self._resync_in_background(user_id)

    def _resync_in_background(self, user_id: str) -> None:
        """:meth:`resync` ``user_id`` unless it is being fetched already."""
        if user_id not in self._resyncing:
            self._resyncing.add(user_id)
            d = defer.ensureDeferred(self.resync(user_id))
            d.addBoth(lambda _: self._resyncing.discard(user_id))

    async def resync(self, user_id: str) -> bool:
        """Fetch ``user_id``'s whole list from its server into our copy;
        whether that worked (a failure is logged; the copy stays stale)."""
        if self._get_client is None:
            return False
        server = server_of(user_id)
        path = f"{FEDERATION_V1}/user/devices/{urllib.parse.quote(user_id, safe='')}"
        try:
            answer = await self._get_client().get_json(server, path)
            stream_id, devices, cross = parse_user_devices(user_id, answer)
        except (FederationRequestError, SynapseError, ValueError) as e:
            logger.info("Could not fetch %s's devices from %s: %s", user_id, server, e)
            return False
        await self._write(
            user_id,
            REPLACE,
            {
                "stream_id": stream_id,
                "devices": [_device_json(d) for d in devices],
                "cross_signing": cross,
            },
        )
        return True

    # /keys/query and /keys/claim for remote users

    async def query(self, queries: dict[str, list[str]]) -> dict[str, Any]:
        """Keys of remote users (``{user: [device ids]}``, [] for all), as
        the parts of a ``/keys/query`` answer: ``device_keys``,
        ``master_keys``, ``self_signing_keys`` and ``failures`` (by server)."""
        result: dict[str, Any] = {
            "device_keys": {},
            "master_keys": {},
            "self_signing_keys": {},
            "failures": {},
        }
        by_server: dict[str, dict[str, list[str]]] = {}
        for user_id, device_ids in queries.items():
            by_server.setdefault(server_of(user_id), {})[user_id] = device_ids
        resyncs = 0
        for server, users in sorted(by_server.items()):
            ask: dict[str, list[str]] = {}
            for user_id, device_ids in users.items():
                state = await self._store.get_remote_device_list_state(user_id)
                if (
                    (state is None or state.stale)
                    and resyncs < MAX_RESYNCS_PER_QUERY
                    and await self._store.get_rooms_shared_with_local_users(user_id)
                ):
                    resyncs += 1
                    if await self.resync(user_id):
                        state = await self._store.get_remote_device_list_state(user_id)
                if state is not None and not state.stale:
                    await self._from_copy(user_id, device_ids, result)
                else:
                    ask[user_id] = device_ids
            if ask:
                await self._ask_server(server, ask, result)
        return result

    async def _from_copy(self, user_id: str, device_ids: list[str], result: dict[str, Any]) -> None:
        wanted = set(device_ids)
        devices: dict[str, Any] = {}
        for device in await self._store.get_remote_devices(user_id):
            if device.keys is None or (wanted and device.device_id not in wanted):
                continue
            keys = dict(device.keys)
            if device.display_name is not None:
                keys["unsigned"] = {"device_display_name": device.display_name}
            devices[device.device_id] = keys
        result["device_keys"][user_id] = devices
        for usage, key in (await self._store.get_remote_cross_signing_keys(user_id)).items():
            result[f"{usage}_keys"][user_id] = key

    async def _ask_server(
        self, server: str, ask: dict[str, list[str]], result: dict[str, Any]
    ) -> None:
        answer = await self._post(server, "/user/keys/query", {"device_keys": ask}, result)
        if answer is None:
            return
        answered = answer.get("device_keys")
        answered = answered if isinstance(answered, dict) else {}
        for user_id, device_ids in ask.items():
            wanted = set(device_ids)
            devices = answered.get(user_id)
            kept: dict[str, Any] = {}
            if isinstance(devices, dict):
                for device_id, keys in devices.items():
                    checked = device_keys_of(user_id, device_id, keys)
                    if checked is not None and (not wanted or device_id in wanted):
                        if isinstance(keys, dict) and isinstance(keys.get("unsigned"), dict):
                            checked["unsigned"] = keys["unsigned"]
                        kept[device_id] = checked
            result["device_keys"][user_id] = kept
            fields = {
                field: (answer.get(f"{usage}_keys") or {}).get(user_id)
                if isinstance(answer.get(f"{usage}_keys"), dict)
                else None
                for field, usage in SHARED_CROSS_SIGNING.items()
            }
            for usage, key in cross_signing_keys_of(user_id, fields).items():
                result[f"{usage}_keys"][user_id] = key

    async def claim(self, wanted: dict[str, dict[str, str]]) -> dict[str, Any]:
        """One-time keys of remote users' devices (``{user: {device:
        algorithm}}``), asked of their servers: ``{"one_time_keys",
        "failures"}``."""
        result: dict[str, Any] = {"one_time_keys": {}, "failures": {}}
        by_server: dict[str, dict[str, dict[str, str]]] = {}
        for user_id, devices in wanted.items():
            by_server.setdefault(server_of(user_id), {})[user_id] = devices
        for server, users in sorted(by_server.items()):
            answer = await self._post(server, "/user/keys/claim", {"one_time_keys": users}, result)
            if answer is None:
                continue
            claimed = answer.get("one_time_keys")
            claimed = claimed if isinstance(claimed, dict) else {}
            for user_id, devices in users.items():
                by_device = claimed.get(user_id)
                if not isinstance(by_device, dict):
                    continue
                kept = {
                    d: keys
                    for d, keys in by_device.items()
                    if d in devices and isinstance(keys, dict) and len(keys) <= 10
                }
                if kept:
                    result["one_time_keys"][user_id] = kept
        return result

    async def _post(
        self, server: str, path: str, body: dict[str, Any], result: dict[str, Any]
    ) -> dict[str, Any] | None:
        """``server``'s answer to ``path``, or None with a failure noted."""
        if self._get_client is None:
            result["failures"][server] = {"status": 503, "message": "not asking other servers"}
            return None
        try:
            answer = await self._get_client().post_json(server, FEDERATION_V1 + path, body)
        except (FederationRequestError, SynapseError) as e:
            logger.info("%s of %s failed: %s", path, server, e)
            code = getattr(e, "code", None)
            result["failures"][server] = {
                "status": code if isinstance(code, int) else 503,
                "message": str(e),
            }
            return None
        if not isinstance(answer, dict):
            result["failures"][server] = {"status": 502, "message": "the answer is not an object"}
            return None
        return answer

    # Our users, served to other servers

    async def user_devices(self, user_id: str) -> dict[str, Any]:
        """``GET /user/devices/{userId}`` for one of our users."""
        store = self._store
        listed = await store.get_devices_by_user(user_id)
        keys = (await store.get_device_keys({user_id: []}, None)).get(user_id, {})
        devices = []
        for device in listed:
            item: dict[str, Any] = {"device_id": device["device_id"]}
            if device["display_name"] is not None:
                item["device_display_name"] = device["display_name"]
            if device["device_id"] in keys:
                item["keys"] = {
                    k: v for k, v in keys[device["device_id"]].items() if k != "unsigned"
                }
            devices.append(item)
        answer: dict[str, Any] = {
            "user_id": user_id,
            "stream_id": await store.get_device_list_stream_id(user_id),
            "devices": devices,
        }
        cross = (await store.get_cross_signing_keys([user_id], None)).get(user_id, {})
        for field, usage in SHARED_CROSS_SIGNING.items():
            if usage in cross:
                answer[field] = cross[usage]
        return answer
