"""Catching up on a stream whose rows only its writer holds (typing, federation)."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.http.fields import get_bool, get_int, get_list, get_str
from synapse_lite.replication.http.calls import InternalCall

#: Rows one answer may carry.
MAX_ROWS_PER_ANSWER = 1_000


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamUpdatesWanted:
    """The serving process's rows of ``stream`` in ``(from_token, upto_token]``."""

    stream: str
    from_token: int
    upto_token: int
    limit: int

    def to_json(self) -> dict[str, Any]:
        return attr.asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> StreamUpdatesWanted:
        return cls(
            stream=get_str(body, "stream", max_length=100),
            from_token=get_int(body, "from_token", minimum=-(2**62)),
            upto_token=get_int(body, "upto_token", minimum=-(2**62)),
            limit=min(get_int(body, "limit", minimum=1), MAX_ROWS_PER_ANSWER),
        )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StreamUpdates:
    """Rows in wire form (the receiver parses them with the stream's codec)."""

    updates: list[tuple[int, Any]]
    upto_token: int
    limited: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "updates": [[t, r] for t, r in self.updates],
            "upto_token": self.upto_token,
            "limited": self.limited,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> StreamUpdates:
        updates = []
        for item in get_list(body, "updates"):
            if not (
                isinstance(item, list)
                and len(item) == 2
                and isinstance(item[0], int)
                and not isinstance(item[0], bool)
            ):
                raise SynapseError(400, "each update must be [token, row]", Codes.BAD_JSON)
            updates.append((item[0], item[1]))
        return cls(
            updates,
            get_int(body, "upto_token", minimum=-(2**62)),
            get_bool(body, "limited", False),
        )


GET_STREAM_UPDATES = InternalCall(
    "get_repl_stream_updates",
    StreamUpdatesWanted,
    StreamUpdates,
    idempotent=True,
)
