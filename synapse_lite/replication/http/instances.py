"""Retiring an events writer while the other processes keep running (main process)."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.codec.kinds import Bool, Custom, DecodeContext, Int, Str, wire
from synapse_lite.http.fields import list_value
from synapse_lite.replication.http.calls import InternalCall
from synapse_lite.streams.writers import MAIN


@attr.s(slots=True, frozen=True, auto_attribs=True)
class WriterToRetire:
    """A stopped events writer that is to write events no more."""

    instance_name: str = attr.ib(metadata=wire(Str(max_length=255)))


def _decode_writers(writers: Any, context: DecodeContext) -> list[str]:
    writers = list_value(writers, "events_writers")
    if not all(isinstance(w, str) for w in writers):
        raise SynapseError(400, "'events_writers' must be names", Codes.BAD_JSON)
    return writers


@attr.s(slots=True, frozen=True, auto_attribs=True)
class WriterRetired:
    """``retired`` is false if it was not a writer (any more), in which case
    the announcement was only repeated."""

    retired: bool = attr.ib(metadata=wire(Bool(False)))
    events_writers: list[str] = attr.ib(
        metadata=wire(Custom(_decode_writers, example=lambda context: ["persister1", "persister2"]))
    )
    rooms_moved: int = attr.ib(metadata=wire(Int()))


RETIRE_EVENTS_WRITER = InternalCall(
    "retire_events_writer", WriterToRetire, WriterRetired, served_by=MAIN
)
