"""One main process inside the benchmark's own Python process, on a
throwaway database made the way the tests make theirs (for benchmarks of
one component's cost, where other processes would only add noise)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from synapse_lite.app.composition import build_homeserver
from tests.harness.databases import create_test_database
from tests.harness.server import make_config


async def with_main_process(
    reactor: Any, engine: str, measure: Callable[[Any], Awaitable[None]]
) -> None:
    """Build and start the main process of a monolith (registration open,
    rate limits off) on a new ``engine`` database, run ``measure(hs)``, then
    stop it and drop the database."""
    test_db = create_test_database(engine)
    try:
        config = make_config(test_db, rate_limiting={"enabled": False}, enable_registration=True)
        hs = build_homeserver(config, "main", reactor)
        hs.loops.startService()
        try:
            await measure(hs)
        finally:
            await hs.service.stopService()
    finally:
        test_db.drop()
