"""Running a stream write on the stream's writer: here, or over internal HTTP.

A process that is not a stream's writer forwards the write and answers only
once replication has brought the writer's new position here, so the client's
next read on this process (a /sync, a GET) sees what it just wrote.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.replication.http._base import ReplicationClientError

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

logger = logging.getLogger(__name__)

#: How long a forwarded write waits for replication to bring the writer's new
#: position here before answering anyway (the write is done; only this
#: process's view lags, e.g. while Redis restarts).
FORWARDED_WRITE_WAIT_SECONDS = 5.0


async def call_writer(
    hs: HomeServer, writer: str, endpoint: str, body: dict[str, Any]
) -> dict[str, Any]:
    """Call an internal endpoint of ``writer``; an unreachable writer is a 503
    for the client (a writer's own refusal keeps its error)."""
    try:
        return await hs.replication_client.call(writer, endpoint, body)
    except ReplicationClientError as e:
        logger.warning("Forwarding %s to %s failed: %s", endpoint, writer, e)
        raise SynapseError(
            503, f"The process handling this ({writer}) is unavailable; try again", Codes.UNKNOWN
        ) from None


async def wait_for_position(hs: HomeServer, writer: str, stream_name: str, position: int) -> None:
    """Wait until this process has seen ``writer`` reach ``position``. After
    the replication timeout the write has still happened: log and go on rather
    than tell the client it failed."""
    try:
        await hs.replication.data_handler.wait_for_stream_position(
            writer, stream_name, position, timeout=FORWARDED_WRITE_WAIT_SECONDS
        )
    except defer.TimeoutError:
        logger.warning(
            "Replication did not bring %s of %s to %d in time; answering anyway",
            stream_name,
            writer,
            position,
        )


async def write_on_stream_writer(
    hs: HomeServer,
    stream_name: str,
    local: Callable[[], Awaitable[int]],
    endpoint: str,
    body: dict[str, Any],
) -> int:
    """Run ``local()`` here if this process is the (single) writer of
    ``stream_name``, else POST ``body`` to the writer's ``endpoint`` (which
    answers ``{"stream_id"}``) and wait for that position. Returns the stream
    id of the write."""
    [writer] = hs.config.stream_writers.writers_of(stream_name)
    if writer == hs.instance_name:
        return await local()
    answer = await call_writer(hs, writer, endpoint, body)
    stream_id = answer.get("stream_id")
    if isinstance(stream_id, bool) or not isinstance(stream_id, int):
        raise SynapseError(502, f"{writer} gave no stream position", Codes.UNKNOWN)
    await wait_for_position(hs, writer, stream_name, stream_id)
    return stream_id
