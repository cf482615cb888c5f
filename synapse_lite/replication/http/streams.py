"""Catching up on a stream whose rows only its writer holds (typing, federation)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.replication.http._base import ReplicationClient, ReplicationEndpoint
from synapse_lite.replication.tcp.streams._base import UpdateFunction, Updates

if TYPE_CHECKING:
    pass


class GetStreamUpdates(ReplicationEndpoint):
    """``{"stream", "from_token", "upto_token", "limit"}`` -> this process's rows."""

    NAME = "get_repl_stream_updates"

    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        stream_name = body.get("stream")
        streams = self.hs.replication.streams
        stream = streams.get(stream_name) if isinstance(stream_name, str) else None
        if stream is None:
            raise SynapseError(400, f"Unknown stream {stream_name!r}", Codes.INVALID_PARAM)
        values: list[int] = []
        for key in ("from_token", "upto_token", "limit"):
            value = body.get(key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SynapseError(400, f"{key} must be an integer", Codes.BAD_JSON)
            values.append(value)
        from_token, upto_token, limit = values
        updates, upto, limited = await stream.get_updates_since(
            self.hs.instance_name, from_token, upto_token, min(max(limit, 1), 1000)
        )
        return {"updates": [[t, r] for t, r in updates], "upto_token": upto, "limited": limited}


def http_update_function(
    client: ReplicationClient, stream_name: str, writer: str
) -> UpdateFunction:
    """An update function that asks the stream's writer over HTTP."""

    async def update_function(
        instance_name: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[Updates, int, bool]:
        answer = await client.call(
            writer,
            GetStreamUpdates.NAME,
            {
                "stream": stream_name,
                "from_token": from_token,
                "upto_token": upto_token,
                "limit": limit,
            },
        )
        updates = [(int(t), r) for t, r in answer["updates"]]
        return updates, int(answer["upto_token"]), bool(answer["limited"])

    return update_function
