"""Matrix identifiers (user ids, room ids, device ids): what is valid, per the spec."""

from __future__ import annotations

import re
import secrets
import string

from synapse_lite.api.errors import Codes, SynapseError

#: The spec's limit on the length of user ids, room ids and event types.
MAX_ID_LENGTH = 255
#: Characters a new user's localpart may use (the spec's historical set,
#: lowercase only).
LOCALPART_ALLOWED = re.compile(r"[a-z0-9._=\-/+]+")
_SERVER_NAME = re.compile(r"[A-Za-z0-9.\-\[\]:]+")
#: No whitespace, colon or control characters (NUL cannot even be stored in
#: PostgreSQL text).
_OPAQUE_ID = re.compile(r"[^\s:\x00-\x1f\x7f]+")


def _split(identifier: str, sigil: str) -> tuple[str, str] | None:
    if not isinstance(identifier, str) or len(identifier.encode("utf-8")) > MAX_ID_LENGTH:
        return None
    if not identifier.startswith(sigil) or ":" not in identifier:
        return None
    local, _, server = identifier[1:].partition(":")
    if not local or not _SERVER_NAME.fullmatch(server):
        return None
    return local, server


def is_valid_user_id(user_id: object) -> bool:
    """``@localpart:server``: printable, no whitespace, at most 255 bytes."""
    if not isinstance(user_id, str):
        return False
    parts = _split(user_id, "@")
    return parts is not None and bool(_OPAQUE_ID.fullmatch(parts[0]))


#: A room id of room version 12: ``!`` and its create event's reference hash
#: (URL-safe unpadded base64 of 32 bytes), no server.
_HASHED_ROOM_ID = re.compile(r"![A-Za-z0-9_-]{43}")


def is_valid_room_id(room_id: object) -> bool:
    """``!opaque:server``, at most 255 bytes; or a version 12 room's id
    (``!`` and 43 characters of URL-safe base64, no server)."""
    if not isinstance(room_id, str):
        return False
    if _HASHED_ROOM_ID.fullmatch(room_id):
        return True
    parts = _split(room_id, "!")
    return parts is not None and bool(_OPAQUE_ID.fullmatch(parts[0]))


def check_room_id(room_id: str) -> str:
    """A room id from a path or body, or a 400 ``M_INVALID_PARAM``."""
    if not is_valid_room_id(room_id):
        raise SynapseError(400, f"{room_id[:300]!r} is not a valid room id", Codes.INVALID_PARAM)
    return room_id


#: The longest room alias accepted (the spec's limit on any identifier).
MAX_ALIAS_LENGTH = 255


def check_room_alias(alias: object, server_name: str | None = None) -> str:
    """A room alias (``#localpart:server``) from a path or body, or a 400; with
    ``server_name``, also one of that server (a 400 otherwise: nobody makes
    aliases of another server here, no squatting)."""
    if (
        not isinstance(alias, str)
        or not alias.startswith("#")
        or ":" not in alias
        or len(alias.encode("utf-8")) > MAX_ALIAS_LENGTH
        or any(c in alias for c in "\x00 \t\n\r")
        or not alias[1:].split(":", 1)[0]
        or not alias.split(":", 1)[1]
    ):
        raise SynapseError(400, "Not a valid room alias", Codes.INVALID_PARAM)
    if server_name is not None and alias.split(":", 1)[1] != server_name:
        raise SynapseError(400, "Room aliases must be on this server", Codes.INVALID_PARAM)
    return alias


def check_user_id(user_id: object, what: str = "user_id") -> str:
    """A user id from a path or body, or a 400."""
    if not is_valid_user_id(user_id):
        raise SynapseError(400, f"'{what}' is not a valid user id", Codes.INVALID_PARAM)
    assert isinstance(user_id, str)
    return user_id


def check_localpart(localpart: str, reserved_allowed: bool = False) -> None:
    """A new user's localpart, or a 400 ``M_INVALID_USERNAME``. A leading
    ``_`` is kept for application services' users (``reserved_allowed``):
    the spec asks bridges to name theirs so."""
    if not localpart:
        raise SynapseError(400, "User ID cannot be empty", Codes.INVALID_USERNAME)
    if not LOCALPART_ALLOWED.fullmatch(localpart):
        raise SynapseError(
            400,
            "User ID can only contain characters a-z, 0-9, or '=_-./+'",
            Codes.INVALID_USERNAME,
        )
    if localpart.startswith("_") and not reserved_allowed:
        raise SynapseError(400, "User ID may not begin with '_'", Codes.INVALID_USERNAME)


def check_identifier_text(value: object, what: str, max_length: int = MAX_ID_LENGTH) -> str:
    """An event type, state key, transaction or device id: a string of at most
    ``max_length`` UTF-8 bytes, or a 400."""
    if not isinstance(value, str):
        raise SynapseError(400, f"'{what}' must be a string", Codes.BAD_JSON)
    if len(value.encode("utf-8")) > max_length:
        raise SynapseError(400, f"'{what}' is too long", Codes.INVALID_PARAM)
    if "\x00" in value:
        raise SynapseError(400, f"'{what}' must not contain NUL", Codes.INVALID_PARAM)
    return value


def random_string(length: int, alphabet: str = string.ascii_letters) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


def new_room_id(server_name: str) -> str:
    return f"!{random_string(18)}:{server_name}"


def new_device_id() -> str:
    return random_string(10, string.ascii_uppercase)


def is_mine_id(user_id: str, server_name: str) -> bool:
    """Whether a (syntactically valid) user id belongs to ``server_name``."""
    return user_id.startswith("@") and user_id.endswith(":" + server_name)


def server_of(identifier: str) -> str:
    """The server part of a user, room or event id ("" when it has none)."""
    return identifier.split(":", 1)[1] if ":" in identifier else ""
