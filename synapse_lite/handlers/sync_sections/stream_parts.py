"""The /sync parts of streams added after the built-in ones (a stream
definition's ``sync_section``), as sections."""

from __future__ import annotations

from typing import TYPE_CHECKING

from synapse_lite.handlers.sync_sections.request import SyncRequest, SyncResponse

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore
    from synapse_lite.streams.definition import StreamCatalog, StreamSyncPart


class StreamPartSection:
    """The part ``part`` of the stream ``stream``: asked only when the
    stream moved since the client's token (always, initially)."""

    independent = False

    def __init__(self, stream: str, part: StreamSyncPart) -> None:
        self._stream = stream
        self._part = part

    async def add_to(self, request: SyncRequest, response: SyncResponse) -> None:
        since, upto = request.since, response.now.get(self._stream)
        if since is not None and since.get(self._stream) >= upto:
            return
        value = await self._part.changes(
            request.user_id, None if since is None else since.get(self._stream), upto
        )
        if value:
            response.put(self._part.key, value, news=True)


def stream_part_sections(
    catalog: StreamCatalog, store: GenericWorkerStore
) -> list[StreamPartSection]:
    """A section for each stream of ``catalog`` that declares a /sync part,
    in catalog order."""
    return [StreamPartSection(d.name, d.sync_section(store)) for d in catalog if d.sync_section]
