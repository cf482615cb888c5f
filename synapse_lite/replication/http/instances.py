"""Retiring an events writer while the other processes keep running (main process)."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.http.fields import get_bool, get_int, get_list, get_str
from synapse_lite.replication.http.calls import InternalCall
from synapse_lite.streams.writers import MAIN


@attr.s(slots=True, frozen=True, auto_attribs=True)
class WriterToRetire:
    """A stopped events writer that is to write events no more."""

    instance_name: str

    def to_json(self) -> dict[str, Any]:
        return {"instance_name": self.instance_name}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> WriterToRetire:
        return cls(get_str(body, "instance_name", max_length=255))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class WriterRetired:
    """``retired`` is false if it was not a writer (any more), in which case
    the announcement was only repeated."""

    retired: bool
    events_writers: list[str]
    rooms_moved: int

    def to_json(self) -> dict[str, Any]:
        return attr.asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> WriterRetired:
        writers = get_list(body, "events_writers")
        if not all(isinstance(w, str) for w in writers):
            raise SynapseError(400, "'events_writers' must be names", Codes.BAD_JSON)
        return cls(get_bool(body, "retired", False), writers, get_int(body, "rooms_moved"))


RETIRE_EVENTS_WRITER = InternalCall(
    "retire_events_writer", WriterToRetire, WriterRetired, served_by=MAIN
)
