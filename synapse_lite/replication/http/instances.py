"""Retiring an events writer while the other processes keep running (main process)."""

from __future__ import annotations

from typing import Any, cast

from twisted.internet import error as twisted_error
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.protocol import Factory, Protocol

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.config.homeserver import InstanceLocation
from synapse_lite.replication.http._base import ReplicationEndpoint

#: How long to try reaching a writer before concluding that it has stopped.
LIVENESS_TIMEOUT_SECONDS = 2.0


class RetireEventsWriterEndpoint(ReplicationEndpoint):
    """``{"instance_name"}``: a stopped events writer writes events no more.

    The main process records it in ``instances`` and announces it on the caches
    stream: every process then reads the rest of the writer's rows and stops
    tracking its position, and new rooms go to the remaining writers. Answers
    ``{"retired", "events_writers"}``; ``retired`` is false if it was not a
    writer (any more), in which case the announcement is only repeated.
    """

    NAME = "retire_events_writer"

    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        hs = self.hs
        if not hs.is_main_process:
            raise SynapseError(400, "Only the main process retires events writers", Codes.UNKNOWN)
        name = body.get("instance_name")
        if not isinstance(name, str):
            raise SynapseError(400, "'instance_name' must be a string", Codes.BAD_JSON)
        directory = hs.instance_directory
        # A writer started a moment ago may not have been noticed yet.
        await directory.refresh()
        if not directory.is_known(name):
            raise SynapseError(404, f"There is no process called {name!r}", Codes.NOT_FOUND)
        writers = directory.event_writers()
        was_writer = name in writers
        if was_writer:
            await self._check_can_retire(name, writers)
        # Announced even when this process had already dropped it (the main
        # process restarted with a config without it): others may still track it.
        await hs.datastore.retire_events_writer(name)
        await directory.refresh()
        remaining = list(directory.event_writers())
        rooms_moved = await hs.datastore.reassign_rooms_of_removed_writers(remaining)
        return {"retired": was_writer, "events_writers": remaining, "rooms_moved": rooms_moved}

    async def _check_can_retire(self, name: str, writers: tuple[str, ...]) -> None:
        if len(writers) == 1:
            raise SynapseError(
                409, f"{name} is the only events writer; add another first", Codes.UNKNOWN
            )
        if name == self.hs.instance_name:
            raise SynapseError(
                409,
                "The main process stops writing events when it restarts with a config that"
                " no longer lists it",
                Codes.UNKNOWN,
            )
        try:
            locations = self.hs.instance_directory.locations_of(name)
        except KeyError:
            return
        for location in locations:
            if await self._answers(location):
                raise SynapseError(
                    409,
                    f"{name} still answers at {location.host}:{location.port}: stop it first,"
                    " so that it finishes the events it is persisting",
                    Codes.UNKNOWN,
                )

    async def _answers(self, location: InstanceLocation) -> bool:
        endpoint = HostnameEndpoint(
            self.hs.reactor, location.host, location.port, timeout=LIVENESS_TIMEOUT_SECONDS
        )
        try:
            connected = await endpoint.connect(Factory.forProtocol(Protocol))
        except (twisted_error.ConnectError, twisted_error.DNSLookupError):
            return False
        protocol = cast(Protocol, connected)
        if protocol.transport is not None:
            protocol.transport.loseConnection()
        return True
