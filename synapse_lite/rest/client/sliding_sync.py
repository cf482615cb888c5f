"""Simplified sliding sync (MSC4186), on its unstable path: see
docs/sliding-sync.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.handlers.sliding_sync.body import parse_body
from synapse_lite.http.server import (
    JsonResource,
    parse_json_object_from_request,
    query_int,
    query_string,
)

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

#: The MSC's unstable path; the flag ``/versions`` announces it by.
PATH = "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync"
UNSTABLE_FEATURE = "org.matrix.simplified_msc3575"


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    async def sliding_sync(request: Request) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        # ``pos``, ``timeout`` and ``set_presence`` in the query are where
        # Element X puts them; the MSC's current text moves them to the body.
        body = parse_body(
            parse_json_object_from_request(request, allow_empty=True),
            pos=query_string(request, "pos"),
            timeout_ms=query_int(request, "timeout"),
            set_presence=query_string(request, "set_presence"),
        )
        return 200, await handlers.sliding_sync.sync(requester, body)

    resource.register_paths("POST", PATH, sliding_sync, "sliding_sync")
