"""Tokens handed to clients: where a client has got to in each stream.

A :class:`RoomStreamToken` is a position in the events stream. With several
event writers it carries, beside the persisted-up-to position ``stream``, the
position of every writer that is ahead of it, so an event persisted out of order
by a slower writer is neither skipped nor repeated: event ``e`` written by
instance ``i`` at stream id ``s`` lies in ``(from, to]`` exactly when
``from.get_position(i) < s <= to.get_position(i)``.

A :class:`StreamToken` (the ``since``/``next_batch`` of /sync) is one position
per stream. Tokens name writers by small numbers from ``stream_instance_ids``
so they stay short and work on every process, across restarts.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

import attr


class InvalidToken(ValueError):
    """A client sent a token we did not hand out (or cannot read)."""


_NUMBER = "[0-9]{1,18}"  # fits a signed 64-bit column

#: The largest position a token can carry (18 digits, what :data:`_NUMBER`
#: accepts). Replication refuses claims beyond it, so a token this server hands
#: out always parses.
MAX_TOKEN_POSITION = 10**18 - 1
#: ``s-<n>``: a place among backfilled events (negative stream orderings,
#: docs/federation.md "Backfill"), handed out by ``/messages`` only.
_ROOM_TOKEN = re.compile(rf"([sm])(-?{_NUMBER})((?:~{_NUMBER}\.{_NUMBER})*)")
_KEY = re.compile(_NUMBER)


def _frozen_map(
    value: Mapping[str, int] | Iterable[tuple[str, int]],
) -> tuple[tuple[str, int], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted(items))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RoomStreamToken:
    """A position in the events stream, with per-writer positions ahead of it."""

    stream: int
    instance_map: tuple[tuple[str, int], ...] = attr.ib(default=(), converter=_frozen_map)

    def __attrs_post_init__(self) -> None:
        for _, pos in self.instance_map:
            if pos <= self.stream:
                raise ValueError("instance positions must be above the stream position")

    @classmethod
    def from_positions(cls, stream: int, positions: Mapping[str, int]) -> RoomStreamToken:
        """Build a token, keeping only writers ahead of ``stream``."""
        return cls(stream, {name: pos for name, pos in positions.items() if pos > stream})

    def get_position(self, instance_name: str) -> int:
        """The position of one writer in this token."""
        for name, pos in self.instance_map:
            if name == instance_name:
                return pos
        return self.stream

    def get_max_position(self) -> int:
        return max([self.stream, *(pos for _, pos in self.instance_map)])

    def is_before_or_eq(self, other: RoomStreamToken) -> bool:
        """True when every writer's position here is at or below ``other``'s."""
        if self.stream > other.stream:
            return False
        return all(pos <= other.get_position(name) for name, pos in self.instance_map)

    def copy_and_advance(self, other: RoomStreamToken) -> RoomStreamToken:
        """The per-writer maximum of two tokens."""
        stream = max(self.stream, other.stream)
        names = {n for n, _ in self.instance_map} | {n for n, _ in other.instance_map}
        return RoomStreamToken.from_positions(
            stream,
            {n: max(self.get_position(n), other.get_position(n)) for n in names},
        )

    def advanced_through(self, upper: RoomStreamToken, stream_id: int) -> RoomStreamToken:
        """This token moved forward over every event of the window ``(self,
        upper]`` at or below ``stream_id``, and no other: where to resume
        after reading that window in stream order up to an event at
        ``stream_id``. (Stream ids are unique across writers, so the events
        of the window below it are exactly those read.)"""
        names = {n for n, _ in self.instance_map} | {n for n, _ in upper.instance_map}

        def moved(mine: int, theirs: int) -> int:
            return max(mine, min(theirs, stream_id))

        stream = moved(self.stream, upper.stream)
        return RoomStreamToken.from_positions(
            stream, {n: moved(self.get_position(n), upper.get_position(n)) for n in names}
        )

    def contains(self, instance_name: str, stream_id: int) -> bool:
        """Whether a row (writer, id) is at or before this token."""
        return stream_id <= self.get_position(instance_name)

    async def to_string(self, instance_id_of: Callable[[str], Awaitable[int]]) -> str:
        """``s<stream>``, or ``m<stream>~<id>.<pos>...`` with writers ahead."""
        if not self.instance_map:
            return f"s{self.stream}"
        parts = [f"m{self.stream}"]
        for name, pos in self.instance_map:
            parts.append(f"{await instance_id_of(name)}.{pos}")
        return "~".join(parts)

    @classmethod
    async def parse(
        cls, string: str, instance_name_of: Callable[[int], Awaitable[str | None]]
    ) -> RoomStreamToken:
        match = _ROOM_TOKEN.fullmatch(string)
        if not match:
            raise InvalidToken(f"invalid stream token {string!r}")
        stream = int(match.group(2))
        positions: dict[str, int] = {}
        for part in filter(None, match.group(3).split("~")):
            instance_id, pos = (int(x) for x in part.split("."))
            name = await instance_name_of(instance_id)
            if name is None:
                raise InvalidToken(f"unknown writer {instance_id} in stream token {string!r}")
            positions[name] = pos
        if match.group(1) == "s" and positions:
            raise InvalidToken(f"invalid stream token {string!r}")
        return cls.from_positions(stream, positions)

    def bounds_sql(
        self, upper: RoomStreamToken | None, id_column: str, instance_column: str
    ) -> tuple[str, list[object]]:
        """A WHERE clause selecting rows after this token and (if given) at or
        before ``upper``, written with ``?`` placeholders."""
        clauses = [f"{id_column} > ?"]
        args: list[object] = [self.stream]
        for name, pos in self.instance_map:
            clauses.append(f"NOT ({instance_column} = ? AND {id_column} <= ?)")
            args.extend((name, pos))
        if upper is not None:
            if upper.instance_map:
                clauses.append(f"{id_column} <= ?")
                args.append(upper.get_max_position())
                ors = [f"{id_column} <= ?"]
                or_args: list[object] = [upper.stream]
                for name, pos in upper.instance_map:
                    ors.append(f"({instance_column} = ? AND {id_column} <= ?)")
                    or_args.extend((name, pos))
                clauses.append("(" + " OR ".join(ors) + ")")
                args.extend(or_args)
            else:
                clauses.append(f"{id_column} <= ?")
                args.append(upper.stream)
        return " AND ".join(clauses), args


#: Positions after the room key in every sync token ever handed out (presence,
#: typing, receipts, account data, to-device, device lists).
FIRST_TOKEN_POSITIONS = 6


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamToken:
    """Where a /sync client has got to in every stream.

    On the wire: the room key, then the position of each other stream whose
    definition puts it in /sync tokens, in catalog order, joined by ``_``
    (``s12_3_0_7_2_9_4``). A token with fewer positions than the catalog has
    streams was handed out before the later streams existed: they read as 0
    (but every token carries at least :data:`FIRST_TOKEN_POSITIONS`, the
    streams tokens had when this format was fixed). Positions beyond the
    catalog's streams are ignored.
    """

    room_key: RoomStreamToken
    positions: tuple[tuple[str, int], ...] = attr.ib(default=(), converter=_frozen_map)

    def get(self, stream_name: str) -> int:
        """The position of a (non-events) stream; 0 when the token has none."""
        for name, position in self.positions:
            if name == stream_name:
                return position
        return 0

    def with_positions(self, **changes: int) -> StreamToken:
        """The same token with some streams' positions replaced."""
        merged = dict(self.positions)
        merged.update(changes)
        return StreamToken(self.room_key, merged)

    async def to_string(
        self, streams: Sequence[str], instance_id_of: Callable[[str], Awaitable[int]]
    ) -> str:
        """``streams``: the token's streams after the room key, in order."""
        room = await self.room_key.to_string(instance_id_of)
        return "_".join([room, *(str(self.get(name)) for name in streams)])

    @classmethod
    async def parse(
        cls,
        string: str,
        streams: Sequence[str],
        instance_name_of: Callable[[int], Awaitable[str | None]],
    ) -> StreamToken:
        parts = string.split("_")
        least = min(len(streams), FIRST_TOKEN_POSITIONS)
        if len(parts) - 1 < least or not all(_KEY.fullmatch(p) for p in parts[1:]):
            raise InvalidToken(f"invalid sync token {string!r}")
        room = await RoomStreamToken.parse(parts[0], instance_name_of)
        if room.stream < 0:
            # A place among backfilled events is a /messages token only: a
            # /sync token is always at or after the live stream's start.
            raise InvalidToken(f"invalid sync token {string!r}")
        return cls(room, dict(zip(streams, (int(p) for p in parts[1:]), strict=False)))
