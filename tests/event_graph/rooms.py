"""Rooms made of plain :class:`Pdu` values for the event graph tests: a
linear or branching room whose events cite the right auth events."""

from __future__ import annotations

import itertools
from typing import Any

import attr

from synapse_lite.api.room_versions import SPEC_ROOM_VERSIONS, RoomVersion
from synapse_lite.event_graph.authorisation import select_auth_event_ids
from synapse_lite.event_graph.graph import state_after
from synapse_lite.event_graph.pdu import Pdu, StateKey

ALICE = "@alice:a"
BOB = "@bob:b"
CAROL = "@carol:c"
EVE = "@eve:e"


class Room:
    """A room graph being built: ``events`` by id, and the state after each."""

    def __init__(
        self,
        version: str = "10",
        creator: str = ALICE,
        named_creator: str | None = None,
        **create_content: Any,
    ) -> None:
        """``creator`` sends the create event; before version 11 its
        content names ``named_creator`` (default: ``creator``)."""
        self.version: RoomVersion = SPEC_ROOM_VERSIONS[version]
        self.events: dict[str, Pdu] = {}
        self.state_after: dict[str, dict[StateKey, str]] = {}
        self._ids = itertools.count(1)
        self.room_id = "!room:a"
        content: dict[str, Any] = {"room_version": version, **create_content}
        if self.version.creator_in_create_content:
            content.setdefault("creator", named_creator or creator)
        self.create = self.add("m.room.create", creator, content, state_key="", prev=[])
        if self.version.hashed_room_ids:
            self.room_id = "!" + self.create.event_id[1:]
            self.create = attr.evolve(self.create, room_id=self.room_id)
            self.events[self.create.event_id] = self.create

    def add(
        self,
        event_type: str,
        sender: str,
        content: dict[str, Any],
        state_key: str | None = None,
        prev: list[str] | None = None,
        ts: int | None = None,
    ) -> Pdu:
        """A new event after ``prev`` (default: the newest event), citing the
        auth events the state before it selects."""
        number = next(self._ids)
        if prev is None:
            prev = [max(self.events, key=lambda e: self.events[e].depth)] if self.events else []
        state: dict[StateKey, str] = {}
        for parent in prev:  # branches are resolved by the tests themselves
            state.update(self.state_after[parent])
        event = Pdu(
            event_id=f"${number:04d}",
            room_id=self.room_id,
            type=event_type,
            state_key=state_key,
            sender=sender,
            content=content,
            prev_event_ids=tuple(prev),
            auth_event_ids=(),
            depth=1 + max((self.events[p].depth for p in prev), default=0),
            origin_server_ts=ts if ts is not None else number,
            redacts=content.get("redacts"),
        )
        event = attr.evolve(
            event, auth_event_ids=tuple(select_auth_event_ids(self.version, event, state))
        )
        self.events[event.event_id] = event
        self.state_after[event.event_id] = state_after(event, state)
        return event

    def member(self, user: str, membership: str, sender: str | None = None, **kw: Any) -> Pdu:
        content = {"membership": membership, **kw.pop("content", {})}
        return self.add("m.room.member", sender or user, content, state_key=user, **kw)

    def state(self, event_id: str) -> dict[StateKey, Pdu]:
        """The state after ``event_id``, as events."""
        return {k: self.events[v] for k, v in self.state_after[event_id].items()}

    def standard(self, users: dict[str, int] | None = None) -> Pdu:
        """Creator joins, power levels (creator 100 unless version 12), a
        public join rule; returns the last event."""
        creator = self.create.sender
        self.member(creator, "join")
        levels = dict(users or {})
        if not self.version.hashed_room_ids:
            levels.setdefault(creator, 100)
        self.add("m.room.power_levels", creator, {"users": levels}, state_key="")
        return self.add("m.room.join_rules", creator, {"join_rule": "public"}, state_key="")
