"""How each kind of field of a replication command is parsed and printed.

``commands.py`` builds every command from these, so the rules hold for all of
them alike:

* names (server, stream, instance, user and device ids) are non-empty and have
  no whitespace or control characters;
* integers (tokens, timestamps) are plain decimal digits with an optional
  ``-``, no leading zeros, within a signed 64-bit integer: ``"1e3"``, ``"+5"``,
  ``" 5"``, ``"0x10"``, ``"007"`` and ``"-0"`` are refused, so every value has
  exactly one spelling;
* JSON is compact on output, and on input must be finite (no ``NaN`` or
  ``Infinity``, and no ``1e999``), at most :data:`MAX_JSON_DEPTH` deep, and of
  the shape the command needs;
* free text (ERROR, PING, AUTH) is anything without a newline;
* a whole line is at most :data:`MAX_LINE_LENGTH` bytes of UTF-8.

Parsing helpers raise :class:`CommandParseError` naming the field; printing
helpers raise :class:`CommandEncodeError`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: Longest line either side accepts, in bytes of UTF-8, not counting the
#: ``"\\n"``. The same as Twisted's LineOnlyReceiver default, which frames TCP.
MAX_LINE_LENGTH = 16384

#: Deepest nesting of lists and objects accepted in a JSON field. Rows are a
#: few levels deep; the bound keeps recursive code that walks or re-encodes a
#: row (json itself, relays, handlers) far from Python's recursion limit.
MAX_JSON_DEPTH = 100

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

# A name is one or more characters that are neither whitespace nor control
# characters (\s covers Unicode spaces as well as tabs and line breaks).
_NAME_RE = re.compile(r"[^\s\x00-\x1f\x7f]+")
_INTEGER_RE = re.compile(r"-?(?:0|[1-9][0-9]{0,18})")
# A JSON escape of a UTF-16 surrogate: the only way JSON text that is valid
# UTF-8 decodes to a str that cannot be encoded back to UTF-8 (a lone one).
_SURROGATE_ESCAPE_RE = re.compile(r"\\u[dD][89a-fA-F]")


class CommandParseError(ValueError):
    """A line is not a well-formed replication command."""


class CommandEncodeError(ValueError):
    """A command cannot be put on the wire (too long, newline, bad field)."""


def short(value: str) -> str:
    """``value`` quoted and cut short, for error messages that may be sent
    back to the peer or logged."""
    if len(value) > 60:
        return repr(value[:60]) + "..."
    return repr(value)


def is_int64(value: object) -> bool:
    """Whether ``value`` is an int (not a bool) that fits a signed 64-bit integer."""
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


# Parsing helpers: each raises CommandParseError naming the field.


def split_fields(rest: str, name: str, fields: tuple[str, ...]) -> list[str]:
    """Split ``rest`` into exactly ``len(fields)`` parts at single spaces; the
    last part keeps any further spaces (it may be JSON)."""
    parts = rest.split(" ", len(fields) - 1)
    if len(parts) != len(fields):
        raise CommandParseError(
            f"{name} needs {len(fields)} fields ({', '.join(fields)}), got {len(parts)}"
        )
    return parts


def parse_name(value: str, field: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise CommandParseError(
            f"{field} must be a non-empty name without spaces or control characters,"
            f" got {short(value)}"
        )
    return value


def parse_int(value: str, field: str) -> int:
    if not _INTEGER_RE.fullmatch(value) or value == "-0":
        raise CommandParseError(f"{field} must be a decimal integer, got {short(value)}")
    result = int(value)
    if not _INT64_MIN <= result <= _INT64_MAX:
        raise CommandParseError(f"{field} is out of range: {short(value)}")
    return result


def _reject_constant(name: str) -> Any:
    raise CommandParseError(f"JSON must not contain {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise CommandParseError(f"JSON number {short(text)} is out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _json_depth_ok(value: Any) -> bool:
    """Whether ``value`` nests lists and dicts at most MAX_JSON_DEPTH deep.
    Iterative, so it cannot itself hit the recursion limit."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list | dict):
            if depth > MAX_JSON_DEPTH:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


def _might_be_deep(text: str) -> bool:
    # A cheap filter: the bracket count bounds the depth from above (brackets
    # inside strings only make it more cautious).
    return text.count("[") + text.count("{") > MAX_JSON_DEPTH


def parse_json_list(value: str, field: str) -> list[Any]:
    # json.loads would skip surrounding whitespace; the wire form has none.
    if not (value.startswith("[") and value.endswith("]")):
        raise CommandParseError(f"{field} must be a JSON array, got {short(value)}")
    try:
        result = _DECODER.decode(value)
    except RecursionError:
        raise CommandParseError(f"{field} is nested too deeply") from None
    except json.JSONDecodeError as e:
        raise CommandParseError(
            f"{field} is not valid JSON: {e.msg} at character {e.pos}"
        ) from None
    except CommandParseError as e:  # from the constant and float hooks
        raise CommandParseError(f"{field}: {e}") from None
    except ValueError:  # an integer literal too long for int()
        raise CommandParseError(f"{field} has a number too long to parse") from None
    if not isinstance(result, list):  # pragma: no cover - brackets checked above
        raise CommandParseError(f"{field} must be a JSON array")
    if _might_be_deep(value) and not _json_depth_ok(result):
        raise CommandParseError(f"{field} is nested more than {MAX_JSON_DEPTH} deep")
    if _SURROGATE_ESCAPE_RE.search(value):
        try:
            _ENCODER.encode(result).encode("utf-8")
        except UnicodeEncodeError:
            raise CommandParseError(f"{field} contains a lone UTF-16 surrogate") from None
    return result


def parse_text(value: str, field: str) -> str:
    if "\n" in value:
        raise CommandParseError(f"{field} must not contain a newline")
    return value


# Serialising helpers: each raises CommandEncodeError naming the field.


def format_name(value: str, field: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise CommandEncodeError(
            f"{field} must be a non-empty name without spaces or control characters,"
            f" got {value!r:.80}"
        )
    return value


def format_int(value: int, field: str) -> str:
    # bool is an int subclass, but True on the wire would be "True".
    if type(value) is not int or not _INT64_MIN <= value <= _INT64_MAX:
        raise CommandEncodeError(f"{field} must be a 64-bit integer, got {value!r:.80}")
    return str(value)


def format_json(value: Any, field: str) -> str:
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as e:
        raise CommandEncodeError(f"{field} cannot be encoded as JSON: {e}") from None
    if _might_be_deep(text) and not _json_depth_ok(value):
        raise CommandEncodeError(f"{field} is nested more than {MAX_JSON_DEPTH} deep")
    return text


def format_text(value: str, field: str) -> str:
    if not isinstance(value, str):
        raise CommandEncodeError(f"{field} must be a str, got {type(value).__name__}")
    return value


def finish_line(name: str, rest: str) -> str:
    """Check that ``NAME rest`` can go on the wire, and return ``rest``."""
    if "\n" in rest:
        raise CommandEncodeError(f"{name} line must not contain a newline")
    try:
        size = len(rest) if rest.isascii() else len(rest.encode("utf-8"))
    except UnicodeEncodeError:
        raise CommandEncodeError(f"{name} line is not valid Unicode (lone surrogate)") from None
    if len(name) + 1 + size > MAX_LINE_LENGTH:
        raise CommandEncodeError(
            f"{name} line is {len(name) + 1 + size} bytes, over the {MAX_LINE_LENGTH} limit"
        )
    return rest
