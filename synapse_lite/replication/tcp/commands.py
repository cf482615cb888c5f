"""Every replication command, parsed and serialised side by side.

A line on the wire is ``NAME`` or ``NAME<space>rest``, UTF-8, without the
``"\\n"`` that ends it on TCP. Each command is a small frozen class whose
``from_line(rest)`` parses what follows the name and whose ``to_line()``
produces it again, so ``Cls.from_line(cmd.to_line()) == cmd`` for every
command. :func:`parse_command_from_line` and :func:`command_line` work on whole
lines.

Parsing is strict and total: any line that is not exactly one well-formed
command raises :class:`CommandParseError`, and nothing else (no ``ValueError``,
``IndexError`` or ``RecursionError`` from deeply nested JSON). Serialising
refuses, with :class:`CommandEncodeError`, to produce what the other end would
refuse to parse: a line over :data:`MAX_LINE_LENGTH`, a ``"\\n"``, a name with
a space, a JSON row nested deeper than :data:`MAX_JSON_DEPTH`.

Field rules:

* names (server, stream, instance, user and device ids) are non-empty and have
  no whitespace or control characters;
* integers (tokens, timestamps) are plain decimal digits with an optional
  ``-``, no leading zeros, within a signed 64-bit integer: ``"1e3"``, ``"+5"``,
  ``" 5"``, ``"0x10"``, ``"007"`` and ``"-0"`` are refused, so every value has
  exactly one spelling;
* JSON is compact on output, and on input must be finite (no ``NaN`` or
  ``Infinity``, and no ``1e999``), at most :data:`MAX_JSON_DEPTH` deep, and of
  the shape the command needs.
"""

from __future__ import annotations

import abc
import json
import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Self

import attr

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


def _short(value: str) -> str:
    """``value`` quoted and cut short, for error messages that may be sent
    back to the peer or logged."""
    if len(value) > 60:
        return repr(value[:60]) + "..."
    return repr(value)


# Parsing helpers: each raises CommandParseError naming the field.


def _split(rest: str, name: str, fields: tuple[str, ...]) -> list[str]:
    """Split ``rest`` into exactly ``len(fields)`` parts at single spaces; the
    last part keeps any further spaces (it may be JSON)."""
    parts = rest.split(" ", len(fields) - 1)
    if len(parts) != len(fields):
        raise CommandParseError(
            f"{name} needs {len(fields)} fields ({', '.join(fields)}), got {len(parts)}"
        )
    return parts


def _parse_name(value: str, field: str) -> str:
    if not _NAME_RE.fullmatch(value):
        raise CommandParseError(
            f"{field} must be a non-empty name without spaces or control characters,"
            f" got {_short(value)}"
        )
    return value


def _parse_int(value: str, field: str) -> int:
    if not _INTEGER_RE.fullmatch(value) or value == "-0":
        raise CommandParseError(f"{field} must be a decimal integer, got {_short(value)}")
    result = int(value)
    if not _INT64_MIN <= result <= _INT64_MAX:
        raise CommandParseError(f"{field} is out of range: {_short(value)}")
    return result


def _reject_constant(name: str) -> Any:
    raise CommandParseError(f"JSON must not contain {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise CommandParseError(f"JSON number {_short(text)} is out of range")
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


def _parse_json_list(value: str, field: str) -> list[Any]:
    # json.loads would skip surrounding whitespace; the wire form has none.
    if not (value.startswith("[") and value.endswith("]")):
        raise CommandParseError(f"{field} must be a JSON array, got {_short(value)}")
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


def _parse_text(value: str, field: str) -> str:
    if "\n" in value:
        raise CommandParseError(f"{field} must not contain a newline")
    return value


# Serialising helpers: each raises CommandEncodeError naming the field.


def _format_name(value: str, field: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise CommandEncodeError(
            f"{field} must be a non-empty name without spaces or control characters,"
            f" got {value!r:.80}"
        )
    return value


def _format_int(value: int, field: str) -> str:
    # bool is an int subclass, but True on the wire would be "True".
    if type(value) is not int or not _INT64_MIN <= value <= _INT64_MAX:
        raise CommandEncodeError(f"{field} must be a 64-bit integer, got {value!r:.80}")
    return str(value)


def _format_json(value: Any, field: str) -> str:
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as e:
        raise CommandEncodeError(f"{field} cannot be encoded as JSON: {e}") from None
    if _might_be_deep(text) and not _json_depth_ok(value):
        raise CommandEncodeError(f"{field} is nested more than {MAX_JSON_DEPTH} deep")
    return text


def _format_text(value: str, field: str) -> str:
    if not isinstance(value, str):
        raise CommandEncodeError(f"{field} must be a str, got {type(value).__name__}")
    return value


def _finish(name: str, rest: str) -> str:
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


class Command(abc.ABC):
    """One replication command. ``NAME`` is its first word on the wire."""

    __slots__ = ()

    NAME: ClassVar[str]

    @classmethod
    @abc.abstractmethod
    def from_line(cls, line: str) -> Self:
        """Parse the part of a line after ``NAME ``; raise CommandParseError."""

    @abc.abstractmethod
    def to_line(self) -> str:
        """The part of the line after ``NAME ``; raise CommandEncodeError if
        the command cannot go on the wire."""


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ServerCommand(Command):
    """``SERVER <server_name>``: the main process names itself on TCP connect."""

    NAME: ClassVar[str] = "SERVER"
    server_name: str

    @classmethod
    def from_line(cls, line: str) -> Self:
        return cls(_parse_name(line, "server name"))

    def to_line(self) -> str:
        return _finish(self.NAME, _format_name(self.server_name, "server name"))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class NameCommand(Command):
    """``NAME <client_name>``: a worker names itself on TCP connect."""

    NAME: ClassVar[str] = "NAME"
    client_name: str

    @classmethod
    def from_line(cls, line: str) -> Self:
        return cls(_parse_name(line, "client name"))

    def to_line(self) -> str:
        return _finish(self.NAME, _format_name(self.client_name, "client name"))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AuthCommand(Command):
    """``AUTH <secret>``: the first line a worker sends when the main process's
    replication listener has a secret. The secret is the rest of the line (it
    may contain spaces) and is kept out of ``repr`` so it never reaches a log.
    """

    NAME: ClassVar[str] = "AUTH"
    secret: str = attr.ib(repr=False)

    @classmethod
    def from_line(cls, line: str) -> Self:
        # Never echo the value: the error may be logged or sent back.
        if not line or "\n" in line:
            raise CommandParseError("AUTH needs a secret on one line")
        return cls(line)

    def to_line(self) -> str:
        if not isinstance(self.secret, str) or not self.secret:
            raise CommandEncodeError("AUTH needs a non-empty secret")
        return _finish(self.NAME, self.secret)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ReplicateCommand(Command):
    """``REPLICATE``: "I have (re)connected, tell me your positions"."""

    NAME: ClassVar[str] = "REPLICATE"

    @classmethod
    def from_line(cls, line: str) -> Self:
        if line:
            raise CommandParseError(f"REPLICATE takes no arguments, got {_short(line)}")
        return cls()

    def to_line(self) -> str:
        return ""


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RdataCommand(Command):
    """``RDATA <stream> <instance> <token|batch> <row_json>``: one row of a
    stream written by ``instance_name``. ``token`` is None ("batch") for every
    row but the last of a group that shares one token.
    """

    NAME: ClassVar[str] = "RDATA"
    stream_name: str
    instance_name: str
    token: int | None
    row: list[Any]

    @classmethod
    def from_line(cls, line: str) -> Self:
        stream, instance, token, row = _split(line, "RDATA", ("stream", "instance", "token", "row"))
        return cls(
            _parse_name(stream, "stream name"),
            _parse_name(instance, "instance name"),
            None if token == "batch" else _parse_int(token, "token"),
            _parse_json_list(row, "row"),
        )

    def to_line(self) -> str:
        if not isinstance(self.row, list):
            raise CommandEncodeError(f"RDATA row must be a list, got {type(self.row).__name__}")
        token = "batch" if self.token is None else _format_int(self.token, "token")
        return _finish(
            self.NAME,
            " ".join(
                (
                    _format_name(self.stream_name, "stream name"),
                    _format_name(self.instance_name, "instance name"),
                    token,
                    _format_json(self.row, "row"),
                )
            ),
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PositionCommand(Command):
    """``POSITION <stream> <instance> <prev_token> <new_token>``: the writer
    ``instance_name`` wrote no rows of the stream in ``(prev_token, new_token]``.
    """

    NAME: ClassVar[str] = "POSITION"
    stream_name: str
    instance_name: str
    prev_token: int
    new_token: int

    @classmethod
    def from_line(cls, line: str) -> Self:
        stream, instance, prev, new = _split(
            line, "POSITION", ("stream", "instance", "prev_token", "new_token")
        )
        return cls(
            _parse_name(stream, "stream name"),
            _parse_name(instance, "instance name"),
            _parse_int(prev, "prev_token"),
            _parse_int(new, "new_token"),
        )

    def to_line(self) -> str:
        return _finish(
            self.NAME,
            " ".join(
                (
                    _format_name(self.stream_name, "stream name"),
                    _format_name(self.instance_name, "instance name"),
                    _format_int(self.prev_token, "prev_token"),
                    _format_int(self.new_token, "new_token"),
                )
            ),
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ErrorCommand(Command):
    """``ERROR <text>``: the sender is about to close the connection."""

    NAME: ClassVar[str] = "ERROR"
    message: str

    @classmethod
    def from_line(cls, line: str) -> Self:
        return cls(_parse_text(line, "ERROR text"))

    def to_line(self) -> str:
        return _finish(self.NAME, _format_text(self.message, "ERROR text"))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PingCommand(Command):
    """``PING <text>``: keeps a TCP connection alive (text: usually a ms time)."""

    NAME: ClassVar[str] = "PING"
    data: str

    @classmethod
    def from_line(cls, line: str) -> Self:
        return cls(_parse_text(line, "PING text"))

    def to_line(self) -> str:
        return _finish(self.NAME, _format_text(self.data, "PING text"))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class UserSyncCommand(Command):
    """``USER_SYNC <instance_id> <user_id> <device_id|None> <start|end> <last_sync_ms>``:
    a user started or stopped syncing on the process run ``instance_id``.

    A device literally called ``None`` cannot be sent: it would come back as
    no device, so :meth:`to_line` refuses it.
    """

    NAME: ClassVar[str] = "USER_SYNC"
    instance_id: str
    user_id: str
    device_id: str | None
    is_syncing: bool
    last_sync_ms: int

    @classmethod
    def from_line(cls, line: str) -> Self:
        instance_id, user_id, device_id, state, last_sync_ms = _split(
            line, "USER_SYNC", ("instance_id", "user_id", "device_id", "state", "last_sync_ms")
        )
        if state not in ("start", "end"):
            raise CommandParseError(f"USER_SYNC state must be start or end, got {_short(state)}")
        return cls(
            _parse_name(instance_id, "instance id"),
            _parse_name(user_id, "user id"),
            None if device_id == "None" else _parse_name(device_id, "device id"),
            state == "start",
            _parse_int(last_sync_ms, "last_sync_ms"),
        )

    def to_line(self) -> str:
        if self.device_id == "None":
            raise CommandEncodeError("USER_SYNC cannot carry a device called 'None'")
        device = "None" if self.device_id is None else _format_name(self.device_id, "device id")
        return _finish(
            self.NAME,
            " ".join(
                (
                    _format_name(self.instance_id, "instance id"),
                    _format_name(self.user_id, "user id"),
                    device,
                    "start" if self.is_syncing else "end",
                    _format_int(self.last_sync_ms, "last_sync_ms"),
                )
            ),
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ClearUserSyncCommand(Command):
    """``CLEAR_USER_SYNC <instance_id>``: forget every sync of that process run."""

    NAME: ClassVar[str] = "CLEAR_USER_SYNC"
    instance_id: str

    @classmethod
    def from_line(cls, line: str) -> Self:
        return cls(_parse_name(line, "instance id"))

    def to_line(self) -> str:
        return _finish(self.NAME, _format_name(self.instance_id, "instance id"))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class FederationAckCommand(Command):
    """``FEDERATION_ACK <instance_name> <token>``: a federation sender has
    handled the federation stream up to ``token``."""

    NAME: ClassVar[str] = "FEDERATION_ACK"
    instance_name: str
    token: int

    @classmethod
    def from_line(cls, line: str) -> Self:
        instance, token = _split(line, "FEDERATION_ACK", ("instance", "token"))
        return cls(_parse_name(instance, "instance name"), _parse_int(token, "token"))

    def to_line(self) -> str:
        return _finish(
            self.NAME,
            f"{_format_name(self.instance_name, 'instance name')}"
            f" {_format_int(self.token, 'token')}",
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class UserIpCommand(Command):
    """``USER_IP <user_id> <json>``: client activity, where the JSON is
    ``[access_token, ip, user_agent, device_id or null, last_seen_ms]``."""

    NAME: ClassVar[str] = "USER_IP"
    user_id: str
    access_token: str
    ip: str
    user_agent: str
    device_id: str | None
    last_seen: int

    @classmethod
    def from_line(cls, line: str) -> Self:
        user_id, data = _split(line, "USER_IP", ("user_id", "json"))
        values = _parse_json_list(data, "USER_IP data")
        if len(values) != 5:
            raise CommandParseError(
                "USER_IP data must be [access_token, ip, user_agent, device_id, last_seen],"
                f" got {len(values)} items"
            )
        access_token, ip, user_agent, device_id, last_seen = values
        if not all(isinstance(v, str) for v in (access_token, ip, user_agent)):
            raise CommandParseError("USER_IP access_token, ip and user_agent must be strings")
        if device_id is not None and not isinstance(device_id, str):
            raise CommandParseError("USER_IP device_id must be a string or null")
        if type(last_seen) is not int or not _INT64_MIN <= last_seen <= _INT64_MAX:
            raise CommandParseError("USER_IP last_seen must be a 64-bit integer")
        return cls(
            _parse_name(user_id, "user id"), access_token, ip, user_agent, device_id, last_seen
        )

    def to_line(self) -> str:
        if not all(isinstance(v, str) for v in (self.access_token, self.ip, self.user_agent)):
            raise CommandEncodeError("USER_IP access_token, ip and user_agent must be strings")
        if self.device_id is not None and not isinstance(self.device_id, str):
            raise CommandEncodeError("USER_IP device_id must be a string or None")
        _format_int(self.last_seen, "last_seen")
        data = [self.access_token, self.ip, self.user_agent, self.device_id, self.last_seen]
        return _finish(
            self.NAME,
            f"{_format_name(self.user_id, 'user id')} {_format_json(data, 'USER_IP data')}",
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RemoteServerUpCommand(Command):
    """``REMOTE_SERVER_UP <server_name>``: a remote homeserver is reachable
    again, so federation backoff towards it can be reset."""

    NAME: ClassVar[str] = "REMOTE_SERVER_UP"
    server_name: str

    @classmethod
    def from_line(cls, line: str) -> Self:
        return cls(_parse_name(line, "server name"))

    def to_line(self) -> str:
        return _finish(self.NAME, _format_name(self.server_name, "server name"))


#: Commands a transport keeps to itself (handshake and keepalive).
CONNECTION_COMMANDS: frozenset[type[Command]] = frozenset(
    {ServerCommand, NameCommand, AuthCommand, PingCommand, ErrorCommand}
)

#: Commands a transport hands to the handler (and the main process relays).
DATA_COMMANDS: frozenset[type[Command]] = frozenset(
    {
        RdataCommand,
        PositionCommand,
        ReplicateCommand,
        UserSyncCommand,
        ClearUserSyncCommand,
        FederationAckCommand,
        UserIpCommand,
        RemoteServerUpCommand,
    }
)

COMMAND_MAP: Mapping[str, type[Command]] = {
    cls.NAME: cls for cls in sorted(CONNECTION_COMMANDS | DATA_COMMANDS, key=lambda c: c.NAME)
}

#: Prefix of the message of a CommandParseError that comes from a bug in a
#: parser rather than from a bad line (tests check that none does).
INTERNAL_ERROR_PREFIX = "internal error while parsing"


def parse_command_from_line(line: str) -> Command:
    """Parse one whole line (without its ``"\\n"``) into a command.

    Raises CommandParseError, and only that, for anything malformed.
    """
    try:
        return _parse_line(line)
    except CommandParseError:
        raise
    except Exception as e:
        # A parser bug must still not escape as some other type: callers
        # (the TCP protocol, the Redis subscriber) treat this as a bad line.
        raise CommandParseError(f"{INTERNAL_ERROR_PREFIX}: {type(e).__name__}") from e


def _parse_line(line: str) -> Command:
    if "\n" in line:
        raise CommandParseError("line contains a newline")
    try:
        size = len(line) if line.isascii() else len(line.encode("utf-8"))
    except UnicodeEncodeError:
        raise CommandParseError("line is not valid Unicode (lone surrogate)") from None
    if size > MAX_LINE_LENGTH:
        raise CommandParseError(f"line is {size} bytes, over the {MAX_LINE_LENGTH} limit")
    name, space, rest = line.partition(" ")
    cls = COMMAND_MAP.get(name)
    if cls is None:
        raise CommandParseError(f"unknown command {_short(name)}")
    if space and not rest:
        # One spelling per command: an empty argument is written "NAME".
        raise CommandParseError(f"{name} is followed by a space and nothing else")
    return cls.from_line(rest)


def command_line(cmd: Command) -> str:
    """The whole line for ``cmd`` (without ``"\\n"``); raises CommandEncodeError."""
    rest = cmd.to_line()
    return f"{cmd.NAME} {rest}" if rest else cmd.NAME
