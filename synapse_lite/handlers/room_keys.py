"""Server-side key backup (``/room_keys/...``): versions and the room keys in
them, with the spec's rule for which of two keys of a session is kept
(:meth:`BackedUpKey.is_better_than`) and an ``etag`` that changes with the keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import check_identifier_text
from synapse_lite.storage.databases.main.room_keys import BackedUpKey, BackupVersion

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

#: Keys one upload may carry (more: 413).
MAX_KEYS_PER_UPLOAD = 10_000
WRONG_ROOM_KEYS_VERSION = "M_WRONG_ROOM_KEYS_VERSION"


def _bad(message: str) -> SynapseError:
    return SynapseError(400, message, Codes.BAD_JSON)


def parse_version(version: str | None) -> int:
    """A version as the client names it (a string of digits)."""
    if version is None:
        raise SynapseError(400, "'version' is required", Codes.MISSING_PARAM)
    if not version.isdigit() or len(version) > 18:
        # Versions this server hands out are numbers: anything else is none of them.
        raise NotFoundError(f"Unknown backup version {version[:40]!r}")
    return int(version)


def check_backup_room_id(room_id: object, where: str) -> str:
    """The room a backed-up key is for: ``!`` and an opaque id. The server
    never looks the room up (it need not be one it knows), and since room
    version 12 a room id may have no ``:server`` part: only the sigil is
    required."""
    text = check_identifier_text(room_id, where)
    if not text.startswith("!") or len(text) < 2:
        raise SynapseError(400, f"{where}: {text[:300]!r} is not a room id", Codes.INVALID_PARAM)
    return text


def check_key(value: object, where: str) -> BackedUpKey:
    if not isinstance(value, dict):
        raise _bad(f"{where} must be an object")
    first, forwarded = value.get("first_message_index"), value.get("forwarded_count")
    verified, data = value.get("is_verified"), value.get("session_data")
    for name, number in (("first_message_index", first), ("forwarded_count", forwarded)):
        if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number < 2**53:
            raise _bad(f"{where}.{name} must be a non-negative integer")
    if not isinstance(verified, bool):
        raise _bad(f"{where}.is_verified must be true or false")
    if data is None:
        # Algorithm-dependent: an object for the spec's algorithm (checked
        # once the version's algorithm is known), opaque otherwise.
        raise _bad(f"{where}.session_data is required")
    return BackedUpKey(first, forwarded, verified, data)  # type: ignore[arg-type]


def check_sessions(value: object, room_id: str, where: str) -> list[tuple[str, str, BackedUpKey]]:
    if not isinstance(value, dict) or not isinstance(value.get("sessions"), dict):
        raise _bad(f"{where} must be an object with 'sessions'")
    keys = []
    for session_id, key in value["sessions"].items():
        check_identifier_text(session_id, f"{where}.sessions: session id")
        keys.append((room_id, session_id, check_key(key, f"{where}.sessions.{session_id}")))
    return keys


#: The backup algorithm the spec defines (its ``auth_data`` is an object
#: with the backup's ``public_key``).
CURVE25519_BACKUP = "m.megolm_backup.v1.curve25519-aes-sha2"


def check_version_body(body: dict[str, Any]) -> tuple[str, Any]:
    """``(algorithm, auth_data)`` of a version. ``auth_data`` is
    "algorithm-dependent data": for the spec's algorithm an object with a
    ``public_key``; for any other it is opaque, any JSON value but null (it
    is required), kept as given (SyTest's backups use a string)."""
    algorithm, auth_data = body.get("algorithm"), body.get("auth_data")
    if not isinstance(algorithm, str) or not algorithm or len(algorithm) > 255:
        raise _bad("'algorithm' must be a non-empty string")
    if auth_data is None:
        raise SynapseError(400, "'auth_data' is required", Codes.MISSING_PARAM)
    if algorithm == CURVE25519_BACKUP and (
        not isinstance(auth_data, dict) or not isinstance(auth_data.get("public_key"), str)
    ):
        raise _bad(f"{CURVE25519_BACKUP}: 'auth_data' must be an object with a 'public_key' string")
    return algorithm, auth_data


class RoomKeysHandler:
    """Key backup of local users (every process, straight in the database)."""

    def __init__(self, store: GenericWorkerStore) -> None:
        self._store = store

    async def create_version(self, user_id: str, body: dict[str, Any]) -> dict[str, Any]:
        algorithm, auth_data = check_version_body(body)
        version = await self._store.create_backup_version(user_id, algorithm, auth_data)
        return {"version": str(version)}

    async def get_version(self, user_id: str, version: str | None) -> dict[str, Any]:
        """A version, or the current one for None (404 ``M_NOT_FOUND`` when
        there is none: the spec's answer for "no backup")."""
        number = None if version is None else parse_version(version)
        found = await self._store.get_backup_version(user_id, number)
        if found is None:
            raise NotFoundError(
                "No current backup version" if version is None else "Unknown backup version"
            )
        return found.to_json()

    async def update_version(self, user_id: str, version: str, body: dict[str, Any]) -> None:
        number = parse_version(version)
        algorithm, auth_data = check_version_body(body)
        # The spec's version is a string; a client sending back the number it
        # read (SyTest does) names the same version.
        named = body.get("version", version)
        if isinstance(named, bool) or not isinstance(named, (str, int)) or str(named) != version:
            raise SynapseError(
                400, "'version' in the body must match the path", Codes.INVALID_PARAM
            )
        current = await self._store.get_backup_version(user_id, number)
        if current is None:
            raise NotFoundError("Unknown backup version")
        if current.algorithm != algorithm:
            raise SynapseError(
                400, "A backup version's algorithm cannot change", Codes.INVALID_PARAM
            )
        if not await self._store.update_backup_auth_data(user_id, number, auth_data):
            raise NotFoundError("Unknown backup version")

    async def delete_version(self, user_id: str, version: str) -> None:
        if not await self._store.delete_backup_version(user_id, parse_version(version)):
            raise NotFoundError("Unknown backup version")

    async def put_keys(
        self,
        user_id: str,
        version: str | None,
        body: dict[str, Any],
        room_id: str | None,
        session_id: str | None,
    ) -> dict[str, Any]:
        """Store keys (all rooms', one room's or one session's, by the path),
        each replacing a stored key only if better. Only into the current
        version: another is ``403 M_WRONG_ROOM_KEYS_VERSION``."""
        number = parse_version(version)
        if room_id is not None:
            check_backup_room_id(room_id, "roomId")
        if session_id is not None:
            check_identifier_text(session_id, "sessionId")
            assert room_id is not None
            keys = [(room_id, session_id, check_key(body, "body"))]
        elif room_id is not None:
            keys = check_sessions(body, room_id, "body")
        else:
            rooms = body.get("rooms")
            if not isinstance(rooms, dict):
                raise _bad("'rooms' must be an object of room id to sessions")
            keys = []
            for room, sessions in rooms.items():
                check_backup_room_id(room, "rooms")
                keys += check_sessions(sessions, room, f"rooms.{room}")
                if len(keys) > MAX_KEYS_PER_UPLOAD:
                    break
        if len(keys) > MAX_KEYS_PER_UPLOAD:
            raise SynapseError(
                413, f"At most {MAX_KEYS_PER_UPLOAD} keys per upload", Codes.TOO_LARGE
            )
        if any(not isinstance(k.session_data, dict) for _, _, k in keys):
            version_row = await self._store.get_backup_version(user_id, number)
            if version_row is not None and version_row.algorithm == CURVE25519_BACKUP:
                raise _bad(f"{CURVE25519_BACKUP}: each key's 'session_data' must be an object")
        after = await self._store.put_room_keys(user_id, number, keys)
        if after is None:
            current = await self._store.get_backup_version(user_id, None)
            if current is None:
                raise NotFoundError("Unknown backup version")
            raise SynapseError(
                403,
                f"Version {number} is not the current backup version",
                WRONG_ROOM_KEYS_VERSION,
                {"current_version": str(current.version)},
            )
        return _etag_and_count(after)

    async def get_keys(
        self, user_id: str, version: str | None, room_id: str | None, session_id: str | None
    ) -> dict[str, Any]:
        number = parse_version(version)
        if await self._store.get_backup_version(user_id, number) is None:
            raise NotFoundError("Unknown backup version")
        found = await self._store.get_room_keys(user_id, number, room_id, session_id)
        if session_id is not None:
            assert room_id is not None
            key = found.get(room_id, {}).get(session_id)
            if key is None:
                raise NotFoundError("No key of that session in this backup")
            return key.to_json()
        if room_id is not None:
            sessions = found.get(room_id, {})
            return {"sessions": {s: k.to_json() for s, k in sessions.items()}}
        return {
            "rooms": {
                room: {"sessions": {s: k.to_json() for s, k in sessions.items()}}
                for room, sessions in found.items()
            }
        }

    async def delete_keys(
        self, user_id: str, version: str | None, room_id: str | None, session_id: str | None
    ) -> dict[str, Any]:
        after = await self._store.delete_room_keys(
            user_id, parse_version(version), room_id, session_id
        )
        if after is None:
            raise NotFoundError("Unknown backup version")
        return _etag_and_count(after)


def _etag_and_count(version: BackupVersion) -> dict[str, Any]:
    return {"etag": str(version.etag), "count": version.count}
