"""What one sliding sync connection has sent, and state matching.

Pure: no store, no reactor. A :class:`ConnectionState` is saved (as JSON)
with every ``pos`` handed out, so the next request of the connection, on any
process, knows what the client already has: per room, the room token it was
sent up to, the config it was sent with, its membership and DM flag, and the
members lazy loading sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import attr

from synapse_lite.handlers.sliding_sync.body import ME, RequiredState, StatePattern

#: Members remembered per room as sent by lazy loading (then sent again: allowed).
MAX_LAZY_MEMBERS = 200


def _pattern_matches(pattern: StatePattern, event_type: str, state_key: str, user_id: str) -> bool:
    wanted_type, wanted_key = pattern
    if wanted_type is not None and wanted_type != event_type:
        return False
    if wanted_key is None:
        return True
    return state_key == (user_id if wanted_key == ME else wanted_key)


def state_matches(required: RequiredState, event_type: str, state_key: str, user_id: str) -> bool:
    """Whether ``required`` asks for the state ``(event_type, state_key)``
    (lazy members aside: they depend on the timeline)."""
    return any(
        _pattern_matches(p, event_type, state_key, user_id) for p in required.include
    ) and not any(_pattern_matches(p, event_type, state_key, user_id) for p in required.exclude)


def wanted_state_keys(
    required: RequiredState, keys: Iterable[tuple[str, str]], user_id: str
) -> list[tuple[str, str]]:
    """The state keys of ``keys`` that ``required`` asks for."""
    return [k for k in keys if state_matches(required, k[0], k[1], user_id)]


@attr.s(slots=True, auto_attribs=True)
class RoomSent:
    """What the connection has of one room."""

    #: The index (in :attr:`ConnectionState.tokens`) of the room token the
    #: room's timeline and state were sent up to.
    at: int
    timeline_limit: int
    #: ``RequiredState.as_json()`` of the config it was sent with.
    required_state: list[Any]
    membership: str
    is_dm: bool
    #: Members sent by lazy loading (capped; a forgotten one is sent again).
    lazy: list[str] = attr.Factory(list)

    def to_json(self, config_index: int) -> list[Any]:
        """The stored form, naming its ``required_state`` by its index in
        the connection's list of configs (rooms share a few configs)."""
        return [self.at, self.timeline_limit, config_index, self.membership, self.is_dm, self.lazy]

    @classmethod
    def from_json(cls, value: list[Any], configs: list[Any]) -> RoomSent:
        return cls(value[0], value[1], configs[value[2]], value[3], value[4], list(value[5]))

    def remember_lazy(self, users: Iterable[str]) -> None:
        known = set(self.lazy)
        for user in users:
            if user not in known:
                known.add(user)
                self.lazy.append(user)
        # The oldest go first: they are the likeliest to be sent again anyway.
        del self.lazy[: max(0, len(self.lazy) - MAX_LAZY_MEMBERS)]


@attr.s(slots=True, auto_attribs=True)
class ConnectionState:
    """What a connection has been sent, as of one ``pos``."""

    #: Room tokens (as strings) rooms were sent up to, by index.
    tokens: dict[int, str] = attr.Factory(dict)
    next_index: int = 0
    rooms: dict[str, RoomSent] = attr.Factory(dict)
    #: The ``count`` last sent for each list.
    list_counts: dict[str, int] = attr.Factory(dict)
    #: The extensions enabled in the last response (one newly enabled starts
    #: from nothing, as a new connection would).
    extensions: list[str] = attr.Factory(list)

    def add_token(self, room_token: str) -> int:
        """Record the room token of a response; its index."""
        index = self.next_index
        self.tokens[index] = room_token
        self.next_index += 1
        return index

    def prune_tokens(self) -> None:
        """Forget tokens no room refers to any more."""
        used = {room.at for room in self.rooms.values()}
        for index in [i for i in self.tokens if i not in used]:
            del self.tokens[index]

    def to_json(self) -> str:
        configs: dict[str, int] = {}
        rooms = {}
        for room_id, sent in self.rooms.items():
            key = json.dumps(sent.required_state)
            rooms[room_id] = sent.to_json(configs.setdefault(key, len(configs)))
        return json.dumps(
            {
                "t": {str(i): t for i, t in self.tokens.items()},
                "n": self.next_index,
                "c": [json.loads(key) for key in configs],
                "r": rooms,
                "l": self.list_counts,
                "e": self.extensions,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, value: str) -> ConnectionState:
        """Raises ``ValueError`` (or ``KeyError``/``TypeError``/
        ``IndexError``) for a row this code did not write."""
        data = json.loads(value)
        return cls(
            tokens={int(i): str(t) for i, t in data["t"].items()},
            next_index=int(data["n"]),
            rooms={r: RoomSent.from_json(v, data["c"]) for r, v in data["r"].items()},
            list_counts={k: int(v) for k, v in data["l"].items()},
            extensions=[str(e) for e in data["e"]],
        )
