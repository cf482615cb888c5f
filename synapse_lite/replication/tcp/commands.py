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
a space, a JSON row nested deeper than :data:`MAX_JSON_DEPTH`. The rules for
each kind of field are in ``wire_fields.py``.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar, Self

import attr

from synapse_lite.replication.tcp.wire_fields import (
    MAX_JSON_DEPTH,
    MAX_LINE_LENGTH,
    CommandEncodeError,
    CommandParseError,
    finish_line,
    format_int,
    format_json,
    format_name,
    format_text,
    is_int64,
    parse_int,
    parse_json_list,
    parse_name,
    parse_text,
    short,
    split_fields,
)

__all__ = [
    "COMMAND_MAP",
    "CONNECTION_COMMANDS",
    "DATA_COMMANDS",
    "INTERNAL_ERROR_PREFIX",
    "MAX_JSON_DEPTH",
    "MAX_LINE_LENGTH",
    "AuthCommand",
    "CheckedCommand",
    "ClearUserSyncCommand",
    "Command",
    "CommandEncodeError",
    "CommandParseError",
    "ErrorCommand",
    "FederationAckCommand",
    "NameCommand",
    "PingCommand",
    "PositionCommand",
    "RdataCommand",
    "RemoteServerUpCommand",
    "ReplicateCommand",
    "ServerCommand",
    "SubscribeCommand",
    "UserIpCommand",
    "UserSyncCommand",
    "checked_message",
    "claim_stream",
    "command_line",
    "parse_command_from_line",
]


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
    """``SERVER <server_name> [@<deployment id>]``: the main process names itself
    (and its deployment, see :func:`parse_deployment`) on TCP connect."""

    NAME: ClassVar[str] = "SERVER"
    server_name: str
    deployment: str | None = None

    @classmethod
    def from_line(cls, line: str) -> Self:
        name, deployment = _name_and_deployment(line, "server name")
        return cls(name, deployment)

    def to_line(self) -> str:
        return finish_line(
            self.NAME,
            format_name(self.server_name, "server name") + _format_deployment(self.deployment),
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class NameCommand(Command):
    """``NAME <client_name> [@<deployment id>]``: a worker names itself (and its
    deployment) on TCP connect."""

    NAME: ClassVar[str] = "NAME"
    client_name: str
    deployment: str | None = None

    @classmethod
    def from_line(cls, line: str) -> Self:
        name, deployment = _name_and_deployment(line, "client name")
        return cls(name, deployment)

    def to_line(self) -> str:
        return finish_line(
            self.NAME,
            format_name(self.client_name, "client name") + _format_deployment(self.deployment),
        )


def _name_and_deployment(line: str, field: str) -> tuple[str, str | None]:
    """A name, optionally followed by ``@<deployment id>`` (the id of the
    database the process runs on; processes before issue 20 send none)."""
    name, _, rest = line.partition(" ")
    if not rest:
        return parse_name(line, field), None
    if not rest.startswith("@"):
        # Reported as the name it would otherwise have been.
        return parse_name(line, field), None
    return parse_name(name, field), parse_name(rest[1:], "deployment id")


def _format_deployment(deployment: str | None) -> str:
    if deployment is None:
        return ""
    return " @" + format_name(deployment, "deployment id")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SubscribeCommand(Command):
    """``SUBSCRIBE [<stream> ...]``: a worker names, after its NAME, the only
    streams whose RDATA and POSITION the main process is to send it (TCP;
    ``SUBSCRIBE`` alone: none; a worker that sends no SUBSCRIBE receives
    every stream). Another SUBSCRIBE replaces the set."""

    NAME: ClassVar[str] = "SUBSCRIBE"
    streams: tuple[str, ...]

    @classmethod
    def from_line(cls, line: str) -> Self:
        if not line:
            return cls(())
        return cls(tuple(parse_name(name, "stream name") for name in line.split(" ")))

    def to_line(self) -> str:
        return finish_line(
            self.NAME, " ".join(format_name(name, "stream name") for name in self.streams)
        )


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
        return finish_line(self.NAME, self.secret)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ReplicateCommand(Command):
    """``REPLICATE``: "I have (re)connected, tell me your positions"."""

    NAME: ClassVar[str] = "REPLICATE"

    @classmethod
    def from_line(cls, line: str) -> Self:
        if line:
            raise CommandParseError(f"REPLICATE takes no arguments, got {short(line)}")
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
        stream, instance, token, row = split_fields(
            line, "RDATA", ("stream", "instance", "token", "row")
        )
        return cls(
            parse_name(stream, "stream name"),
            parse_name(instance, "instance name"),
            None if token == "batch" else parse_int(token, "token"),
            parse_json_list(row, "row"),
        )

    def to_line(self) -> str:
        if not isinstance(self.row, list):
            raise CommandEncodeError(f"RDATA row must be a list, got {type(self.row).__name__}")
        token = "batch" if self.token is None else format_int(self.token, "token")
        return finish_line(
            self.NAME,
            " ".join(
                (
                    format_name(self.stream_name, "stream name"),
                    format_name(self.instance_name, "instance name"),
                    token,
                    format_json(self.row, "row"),
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
        stream, instance, prev, new = split_fields(
            line, "POSITION", ("stream", "instance", "prev_token", "new_token")
        )
        return cls(
            parse_name(stream, "stream name"),
            parse_name(instance, "instance name"),
            parse_int(prev, "prev_token"),
            parse_int(new, "new_token"),
        )

    def to_line(self) -> str:
        return finish_line(
            self.NAME,
            " ".join(
                (
                    format_name(self.stream_name, "stream name"),
                    format_name(self.instance_name, "instance name"),
                    format_int(self.prev_token, "prev_token"),
                    format_int(self.new_token, "new_token"),
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
        return cls(parse_text(line, "ERROR text"))

    def to_line(self) -> str:
        return finish_line(self.NAME, format_text(self.message, "ERROR text"))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PingCommand(Command):
    """``PING <text>``: keeps a TCP connection alive (text: usually a ms time)."""

    NAME: ClassVar[str] = "PING"
    data: str

    @classmethod
    def from_line(cls, line: str) -> Self:
        return cls(parse_text(line, "PING text"))

    def to_line(self) -> str:
        return finish_line(self.NAME, format_text(self.data, "PING text"))


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
        instance_id, user_id, device_id, state, last_sync_ms = split_fields(
            line, "USER_SYNC", ("instance_id", "user_id", "device_id", "state", "last_sync_ms")
        )
        if state not in ("start", "end"):
            raise CommandParseError(f"USER_SYNC state must be start or end, got {short(state)}")
        return cls(
            parse_name(instance_id, "instance id"),
            parse_name(user_id, "user id"),
            None if device_id == "None" else parse_name(device_id, "device id"),
            state == "start",
            parse_int(last_sync_ms, "last_sync_ms"),
        )

    def to_line(self) -> str:
        if self.device_id == "None":
            raise CommandEncodeError("USER_SYNC cannot carry a device called 'None'")
        device = "None" if self.device_id is None else format_name(self.device_id, "device id")
        return finish_line(
            self.NAME,
            " ".join(
                (
                    format_name(self.instance_id, "instance id"),
                    format_name(self.user_id, "user id"),
                    device,
                    "start" if self.is_syncing else "end",
                    format_int(self.last_sync_ms, "last_sync_ms"),
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
        return cls(parse_name(line, "instance id"))

    def to_line(self) -> str:
        return finish_line(self.NAME, format_name(self.instance_id, "instance id"))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class FederationAckCommand(Command):
    """``FEDERATION_ACK <instance_name> <token>``: a federation sender has
    handled the federation stream up to ``token``."""

    NAME: ClassVar[str] = "FEDERATION_ACK"
    instance_name: str
    token: int

    @classmethod
    def from_line(cls, line: str) -> Self:
        instance, token = split_fields(line, "FEDERATION_ACK", ("instance", "token"))
        return cls(parse_name(instance, "instance name"), parse_int(token, "token"))

    def to_line(self) -> str:
        return finish_line(
            self.NAME,
            f"{format_name(self.instance_name, 'instance name')} {format_int(self.token, 'token')}",
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
        user_id, data = split_fields(line, "USER_IP", ("user_id", "json"))
        values = parse_json_list(data, "USER_IP data")
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
        if not is_int64(last_seen):
            raise CommandParseError("USER_IP last_seen must be a 64-bit integer")
        return cls(
            parse_name(user_id, "user id"), access_token, ip, user_agent, device_id, last_seen
        )

    def to_line(self) -> str:
        if not all(isinstance(v, str) for v in (self.access_token, self.ip, self.user_agent)):
            raise CommandEncodeError("USER_IP access_token, ip and user_agent must be strings")
        if self.device_id is not None and not isinstance(self.device_id, str):
            raise CommandEncodeError("USER_IP device_id must be a string or None")
        format_int(self.last_seen, "last_seen")
        data = [self.access_token, self.ip, self.user_agent, self.device_id, self.last_seen]
        return finish_line(
            self.NAME,
            f"{format_name(self.user_id, 'user id')} {format_json(data, 'USER_IP data')}",
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RemoteServerUpCommand(Command):
    """``REMOTE_SERVER_UP <server_name>``: a remote homeserver is reachable
    again, so federation backoff towards it can be reset."""

    NAME: ClassVar[str] = "REMOTE_SERVER_UP"
    server_name: str

    @classmethod
    def from_line(cls, line: str) -> Self:
        return cls(parse_name(line, "server name"))

    def to_line(self) -> str:
        return finish_line(self.NAME, format_name(self.server_name, "server name"))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class CheckedCommand(Command):
    """``CHECKED <stream> <allocated> <key_id> <signature>``: the main process
    read the stream's sequence at ``allocated`` (Redis only; a signed note
    that spares every other process the same read,
    ``replication/claim_notes.py``). ``key_id`` names the main process's
    signing key; ``signature`` is unpadded base64 of its ed25519 signature
    over :func:`checked_message`."""

    NAME: ClassVar[str] = "CHECKED"
    stream_name: str
    allocated: int
    key_id: str
    signature: str

    @classmethod
    def from_line(cls, line: str) -> Self:
        stream, allocated, key_id, signature = split_fields(
            line, "CHECKED", ("stream", "allocated", "key_id", "signature")
        )
        return cls(
            parse_name(stream, "stream name"),
            parse_int(allocated, "allocated"),
            parse_name(key_id, "key id"),
            parse_name(signature, "signature"),
        )

    def to_line(self) -> str:
        return finish_line(
            self.NAME,
            " ".join(
                (
                    format_name(self.stream_name, "stream name"),
                    format_int(self.allocated, "allocated"),
                    format_name(self.key_id, "key id"),
                    format_name(self.signature, "signature"),
                )
            ),
        )


def checked_message(deployment_id: str, stream_name: str, allocated: int) -> bytes:
    """What a CHECKED note's signature covers: the deployment, so a note is
    never taken by another deployment, the stream and the value read."""
    return f"CHECKED {deployment_id} {stream_name} {allocated}".encode()


#: Commands a transport keeps to itself (handshake and keepalive).
CONNECTION_COMMANDS: frozenset[type[Command]] = frozenset(
    {ServerCommand, NameCommand, SubscribeCommand, AuthCommand, PingCommand, ErrorCommand}
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
        CheckedCommand,
    }
)

COMMAND_MAP: Mapping[str, type[Command]] = {
    cls.NAME: cls for cls in sorted(CONNECTION_COMMANDS | DATA_COMMANDS, key=lambda c: c.NAME)
}

#: Prefix of the message of a CommandParseError that comes from a bug in a
#: parser rather than from a bad line (tests check that none does).
INTERNAL_ERROR_PREFIX = "internal error while parsing"


def claim_stream(line: bytes) -> bytes | None:
    """The stream an RDATA, POSITION or CHECKED line is about, read without
    parsing the line (None: another command). Lets a process that follows a
    few streams skip the others' rows before decoding them; a line it does
    not skip is still parsed and checked in full."""
    if line.startswith(b"RDATA ") or line.startswith(b"POSITION ") or line.startswith(b"CHECKED "):
        fields = line.split(b" ", 2)
        return fields[1] if len(fields) == 3 else None
    return None


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
        raise CommandParseError(f"unknown command {short(name)}")
    if space and not rest:
        # One spelling per command: an empty argument is written "NAME".
        raise CommandParseError(f"{name} is followed by a space and nothing else")
    return cls.from_line(rest)


def command_line(cmd: Command) -> str:
    """The whole line for ``cmd`` (without ``"\\n"``); raises CommandEncodeError."""
    rest = cmd.to_line()
    return f"{cmd.NAME} {rest}" if rest else cmd.NAME
