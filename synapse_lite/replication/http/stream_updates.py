"""Catching up on a stream whose rows only its writer holds (typing, federation)."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.codec.kinds import Bool, Custom, DecodeContext, Int, Str, wire
from synapse_lite.http.fields import int_value, list_value
from synapse_lite.replication.http.calls import InternalCall

#: Rows one answer may carry.
MAX_ROWS_PER_ANSWER = 1_000

#: A token of the stream (within what a position can carry, either side of 0).
_TOKEN = Int(minimum=-(2**62))


def _decode_limit(limit: Any, context: DecodeContext) -> int:
    """At least 1; more than :data:`MAX_ROWS_PER_ANSWER` is cut to it."""
    return min(int_value(limit, "limit", minimum=1), MAX_ROWS_PER_ANSWER)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamUpdatesWanted:
    """The serving process's rows of ``stream`` in ``(from_token, upto_token]``."""

    stream: str = attr.ib(metadata=wire(Str(max_length=100)))
    from_token: int = attr.ib(metadata=wire(_TOKEN))
    upto_token: int = attr.ib(metadata=wire(_TOKEN))
    limit: int = attr.ib(metadata=wire(Custom(_decode_limit, example=lambda context: 100)))


def _decode_updates(updates: Any, context: DecodeContext) -> list[tuple[int, Any]]:
    decoded = []
    for item in list_value(updates, "updates"):
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], int)
            and not isinstance(item[0], bool)
        ):
            raise SynapseError(400, "each update must be [token, row]", Codes.BAD_JSON)
        decoded.append((item[0], item[1]))
    return decoded


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamUpdates:
    """Rows in wire form (the receiver parses them with the stream's codec)."""

    updates: list[tuple[int, Any]] = attr.ib(
        metadata=wire(
            Custom(
                _decode_updates,
                example=lambda context: [(3, ["!r:x", ["@a:x"]]), (4, ["!r:x", []])],
                encode=lambda updates: [[t, r] for t, r in updates],
            )
        )
    )
    upto_token: int = attr.ib(metadata=wire(_TOKEN))
    limited: bool = attr.ib(metadata=wire(Bool(False)))


GET_STREAM_UPDATES = InternalCall(
    "get_repl_stream_updates",
    StreamUpdatesWanted,
    StreamUpdates,
    idempotent=True,
)
