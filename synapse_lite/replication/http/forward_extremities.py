"""Deleting a room's extra forward extremities on its events writer:
``delete_forward_extremities`` (the admin API's ``DELETE
/v1/rooms/{roomId}/forward_extremities``). On the writer because it keeps
the room's extremities in memory and names them as the next event's
parents: it deletes them under the room's lock and forgets what it held."""

from __future__ import annotations

import attr

from synapse_lite.codec.kinds import Int, RoomId, wire
from synapse_lite.replication.http.calls import InternalCall


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RoomExtremities:
    """The room whose extra forward extremities go."""

    room_id: str = attr.ib(metadata=wire(RoomId()))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ExtremitiesDeleted:
    """How many forward extremities were deleted."""

    deleted: int = attr.ib(metadata=wire(Int(minimum=0)))


DELETE_FORWARD_EXTREMITIES = InternalCall(
    "delete_forward_extremities",
    RoomExtremities,
    ExtremitiesDeleted,
    # A second run finds one extremity left and deletes nothing.
    idempotent=True,
)
