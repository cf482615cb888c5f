"""Reading fields of JSON request bodies (from clients or other processes),
each wrong type or size answered with a 400 naming the field.

The ``*_value`` functions check one value already taken out of a body (None:
absent or null); the ``get_*`` functions take it out of the body first. The
internal calls' field kinds (``synapse_lite/codec/kinds.py``) use the former,
servlets the latter: one wording for every refusal."""

from __future__ import annotations

from typing import Any

from synapse_lite.api.errors import Codes, SynapseError

#: The longest string field accepted unless the field says otherwise.
MAX_STRING_LENGTH = 65_536


def _bad(name: str, what: str) -> SynapseError:
    return SynapseError(400, f"'{name}' must be {what}", Codes.BAD_JSON)


def _missing(name: str) -> SynapseError:
    return SynapseError(400, f"Missing '{name}'", Codes.MISSING_PARAM)


def str_value(value: Any, name: str, max_length: int = MAX_STRING_LENGTH) -> str:
    """A required string (None: missing)."""
    if not isinstance(value, str):
        raise _missing(name) if value is None else _bad(name, "a string")
    if len(value) > max_length:
        raise SynapseError(400, f"'{name}' is too long", Codes.INVALID_PARAM)
    if "\x00" in value:
        # PostgreSQL text cannot hold NUL: refused here rather than failing
        # in the database with a 500.
        raise SynapseError(400, f"'{name}' must not contain NUL", Codes.INVALID_PARAM)
    return value


def int_value(value: Any, name: str, minimum: int = 0, maximum: int = 2**62) -> int:
    """A required integer within bounds (booleans refused; None: missing)."""
    if value is None:
        raise _missing(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, "an integer")
    if not minimum <= value <= maximum:
        raise SynapseError(
            400, f"'{name}' must be between {minimum} and {maximum}", Codes.INVALID_PARAM
        )
    return value


def bool_value(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, "true or false")
    return value


def dict_value(value: Any, name: str) -> dict[str, Any]:
    """A required JSON object (None: missing)."""
    if not isinstance(value, dict):
        raise _missing(name) if value is None else _bad(name, "an object")
    return value


def list_value(value: Any, name: str) -> list[Any]:
    """A required JSON array (None: missing)."""
    if not isinstance(value, list):
        raise _missing(name) if value is None else _bad(name, "a list")
    return value


def get_str(
    body: dict[str, Any], name: str, default: str | None = None, max_length: int = MAX_STRING_LENGTH
) -> str:
    """A required (or defaulted) string field."""
    return str_value(body.get(name, default), name, max_length)


def get_optional_str(
    body: dict[str, Any], name: str, max_length: int = MAX_STRING_LENGTH
) -> str | None:
    if body.get(name) is None:
        return None
    return get_str(body, name, max_length=max_length)


def get_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    return bool_value(body.get(name, default), name)


def get_int(
    body: dict[str, Any],
    name: str,
    default: int | None = None,
    minimum: int = 0,
    maximum: int = 2**62,
) -> int:
    """A required (or defaulted) integer field within bounds (booleans refused)."""
    return int_value(body.get(name, default), name, minimum, maximum)


def get_optional_int(
    body: dict[str, Any], name: str, minimum: int = 0, maximum: int = 2**62
) -> int | None:
    if body.get(name) is None:
        return None
    return get_int(body, name, minimum=minimum, maximum=maximum)


def get_dict(
    body: dict[str, Any], name: str, default: dict[str, Any] | None = None
) -> dict[str, Any]:
    return dict_value(body.get(name, default), name)


def get_list(body: dict[str, Any], name: str, default: list[Any] | None = None) -> list[Any]:
    return list_value(body.get(name, default), name)
