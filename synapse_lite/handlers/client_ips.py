"""Remembering where users connect from (``user_ips``, read by
``GET /admin/whois``): every authenticated request reports its user, device,
address and user agent; the main process records them, the others send it
``USER_IP`` over replication.

A client polling /sync every few seconds would otherwise mean a write per
request, so each (token, address, user agent) is passed on at most once per
:data:`LAST_SEEN_GRANULARITY_MS`; ``last_seen`` is that coarse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from synapse_lite.replication.tcp.commands import UserIpCommand

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.handlers.auth import Requester

LAST_SEEN_GRANULARITY_MS = 120_000
#: Entries remembered before starting afresh (bounded memory).
_MAX_REMEMBERED = 100_000
#: Longest user agent kept (characters).
MAX_USER_AGENT_LENGTH = 512


class ClientIpRecorder:
    """Passes client activity to ``record`` (throttled, see the module)."""

    def __init__(self, clock: Clock, record: Callable[[UserIpCommand], None]) -> None:
        self._clock = clock
        self._record = record
        self._last: dict[tuple[str, str, str], int] = {}

    def on_request(self, requester: Requester, ip: str, user_agent: str) -> None:
        now = self._clock.time_msec()
        # PostgreSQL text cannot hold NUL.
        user_agent = user_agent[:MAX_USER_AGENT_LENGTH].replace("\x00", "")
        key = (requester.token_hash, ip, user_agent)
        last = self._last.get(key)
        if last is not None and now - last < LAST_SEEN_GRANULARITY_MS:
            return
        if len(self._last) >= _MAX_REMEMBERED:
            self._last.clear()
        self._last[key] = now
        # The token's hash, never the token, travels over replication.
        self._record(
            UserIpCommand(
                requester.user_id, requester.token_hash, ip, user_agent, requester.device_id, now
            )
        )
