"""The poke that tells the replication streamer a stream may have advanced."""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)


class ReplicationNotifier:
    """Calls every registered callback when a stream may have new data.

    ID generators poke it when ids finish; the streamer listens. Pokes are cheap
    and may be spurious: listeners compare positions themselves.
    """

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], object]] = []

    def add_replication_callback(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` (on the reactor thread) on every poke."""
        self._callbacks.append(callback)

    def notify_replication(self) -> None:
        """Poke every listener. Must be called on the reactor thread."""
        for callback in self._callbacks:
            try:
                callback()
            except Exception:
                logger.exception("replication callback %r failed", callback)
