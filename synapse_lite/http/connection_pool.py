"""The pool of kept-alive connections of this process's clients to other
servers and processes (federation, internal calls)."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.web.client import HTTPConnectionPool


class KeepAlivePool(HTTPConnectionPool):
    """Persistent connections, until :meth:`close`.

    Closing a pool closes the connections it keeps at that moment; a
    request still in flight hands its connection back later. Twisted's pool
    would keep that one, open, for its idle timeout (four minutes), after
    the process meant to stop talking. Once closed, this pool closes every
    connection handed back instead."""

    def __init__(self, reactor: Any) -> None:
        super().__init__(reactor, persistent=True)
        self.closed = False

    def close(self) -> defer.Deferred[None]:
        """Close the kept connections, and from now on every connection
        handed back."""
        self.closed = True
        return self.closeCachedConnections()

    def _putConnection(self, key: Any, connection: Any) -> None:
        if self.closed:
            connection.transport.loseConnection()
            return
        super()._putConnection(key, connection)
