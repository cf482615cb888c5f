"""Reading fields of JSON request bodies (from clients or other processes),
each wrong type or size answered with a 400 naming the field."""

from __future__ import annotations

from typing import Any

from synapse_lite.api.errors import Codes, SynapseError


def _bad(name: str, what: str) -> SynapseError:
    return SynapseError(400, f"'{name}' must be {what}", Codes.BAD_JSON)


def get_str(
    body: dict[str, Any], name: str, default: str | None = None, max_length: int = 65_536
) -> str:
    """A required (or defaulted) string field."""
    value = body.get(name, default)
    if not isinstance(value, str):
        raise (
            SynapseError(400, f"Missing '{name}'", Codes.MISSING_PARAM)
            if value is None
            else _bad(name, "a string")
        )
    if len(value) > max_length:
        raise SynapseError(400, f"'{name}' is too long", Codes.INVALID_PARAM)
    if "\x00" in value:
        # PostgreSQL text cannot hold NUL: refused here rather than failing
        # in the database with a 500.
        raise SynapseError(400, f"'{name}' must not contain NUL", Codes.INVALID_PARAM)
    return value


def get_optional_str(body: dict[str, Any], name: str, max_length: int = 65_536) -> str | None:
    if body.get(name) is None:
        return None
    return get_str(body, name, max_length=max_length)


def get_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise _bad(name, "true or false")
    return value


def get_int(
    body: dict[str, Any],
    name: str,
    default: int | None = None,
    minimum: int = 0,
    maximum: int = 2**62,
) -> int:
    """A required (or defaulted) integer field within bounds (booleans refused)."""
    value = body.get(name, default)
    if value is None:
        raise SynapseError(400, f"Missing '{name}'", Codes.MISSING_PARAM)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, "an integer")
    if not minimum <= value <= maximum:
        raise SynapseError(
            400, f"'{name}' must be between {minimum} and {maximum}", Codes.INVALID_PARAM
        )
    return value


def get_optional_int(
    body: dict[str, Any], name: str, minimum: int = 0, maximum: int = 2**62
) -> int | None:
    if body.get(name) is None:
        return None
    return get_int(body, name, minimum=minimum, maximum=maximum)


def get_dict(
    body: dict[str, Any], name: str, default: dict[str, Any] | None = None
) -> dict[str, Any]:
    value = body.get(name, default)
    if not isinstance(value, dict):
        raise (
            SynapseError(400, f"Missing '{name}'", Codes.MISSING_PARAM)
            if value is None
            else _bad(name, "an object")
        )
    return value


def get_list(body: dict[str, Any], name: str, default: list[Any] | None = None) -> list[Any]:
    value = body.get(name, default)
    if not isinstance(value, list):
        raise (
            SynapseError(400, f"Missing '{name}'", Codes.MISSING_PARAM)
            if value is None
            else _bad(name, "a list")
        )
    return value
