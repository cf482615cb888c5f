"""The Client-Server API (v3) servlets; the logic they call lives in handlers/."""

from __future__ import annotations

from typing import TYPE_CHECKING

from synapse_lite.http.server import JsonResource
from synapse_lite.rest.client import versions

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer


def register_servlets(hs: HomeServer, resource: JsonResource) -> None:
    """Serve every client endpoint on ``resource``."""
    versions.register_servlets(hs, resource)
