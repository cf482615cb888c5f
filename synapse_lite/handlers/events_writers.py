"""Retiring an events writer while the other processes keep running (main process).

The main process records it in ``instances`` and announces it on the caches
stream: every process then reads the rest of the writer's rows and stops
tracking its position, and new rooms go to the remaining writers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from twisted.internet import error as twisted_error
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.protocol import Factory, Protocol

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.config.homeserver import MAIN_PROCESS, InstanceLocation
from synapse_lite.replication.http.instances import WriterRetired, WriterToRetire

if TYPE_CHECKING:
    from synapse_lite.replication.instance_directory import InstanceDirectory
    from synapse_lite.storage.databases.main import GenericWorkerStore

#: How long to try reaching a writer before concluding that it has stopped.
LIVENESS_TIMEOUT_SECONDS = 2.0


class EventsWriterRetirement:
    """Serves :data:`RETIRE_EVENTS_WRITER` on the main process."""

    def __init__(
        self, store: GenericWorkerStore, directory: InstanceDirectory, reactor: Any
    ) -> None:
        self._store = store
        self._directory = directory
        self._reactor = reactor

    async def retire(self, request: WriterToRetire) -> WriterRetired:
        name = request.instance_name
        directory = self._directory
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
        await self._store.retire_events_writer(name)
        await directory.refresh()
        remaining = list(directory.event_writers())
        rooms_moved = await self._store.reassign_rooms_of_removed_writers(remaining)
        return WriterRetired(was_writer, remaining, rooms_moved)

    async def _check_can_retire(self, name: str, writers: tuple[str, ...]) -> None:
        if len(writers) == 1:
            raise SynapseError(
                409, f"{name} is the only events writer; add another first", Codes.UNKNOWN
            )
        if name == MAIN_PROCESS:
            raise SynapseError(
                409,
                "The main process stops writing events when it restarts with a config that"
                " no longer lists it",
                Codes.UNKNOWN,
            )
        try:
            locations = self._directory.locations_of(name)
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
            self._reactor, location.host, location.port, timeout=LIVENESS_TIMEOUT_SECONDS
        )
        try:
            connected = await endpoint.connect(Factory.forProtocol(Protocol))
        except (twisted_error.ConnectError, twisted_error.DNSLookupError):
            return False
        protocol = cast(Protocol, connected)
        if protocol.transport is not None:
            protocol.transport.loseConnection()
        return True
