"""Writing to a plain TCP socket at once, when nothing waits before it.

Twisted's ``transport.write`` only queues: the bytes leave on the reactor's
next turn, after it asked epoll to watch the socket for writability and then
to stop watching it. For the router that is two extra reactor turns and four
``epoll_ctl`` calls per request (one queued write to the process, one to the
client), most of what relaying a small request costs beyond parsing its head.
:func:`write_now` sends on the spot when the transport has nothing queued
(so the order of bytes is kept), and hands what the socket did not take, or
any error, to ``transport.write`` as before: Twisted then finishes the write,
pauses producers and reports a lost connection exactly as it would have.

Only plain TCP connections (Twisted's ``tcp.Connection``, not TLS) take the
short way; any other transport, or one whose internals are not what this
expects, is written to normally.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import tcp


def write_now(transport: Any, data: bytes) -> None:
    """Write ``data`` to ``transport``, sending it at once when possible."""
    if (
        data
        and isinstance(transport, tcp.Connection)
        and not getattr(transport, "TLS", True)
        and transport.connected
        and not transport.disconnecting
        and not getattr(transport, "_writeDisconnected", True)
        and not transport.dataBuffer
        and not getattr(transport, "_tempDataLen", True)
    ):
        try:
            sent = transport.socket.send(data)
        except OSError:
            # EAGAIN, or a broken connection: Twisted's own write path deals
            # with both (it retries, or reports the loss to the protocol).
            sent = 0
        if sent >= len(data):
            return
        data = data[sent:]
    transport.write(data)
