"""Every listening socket of every process, made in one place: the HTTP
listeners (``app/listeners.py``), the router's client port (``app/router.py``)
and the main process's TCP replication listener (``replication/transports.py``).

Each is a Twisted server endpoint: TCP, or TLS with the listener's
certificate and key (``http/tls.py``). Listening happens at once (a TCP or
TLS server endpoint listens before ``listen`` returns), so a port that is
taken fails the start of the process, as an operator expects, with the
reason; the listening port is returned for its address (a port of 0 is any
free port) and to stop listening.
"""

from __future__ import annotations

import logging
from typing import Any

from twisted.internet.endpoints import SSL4ServerEndpoint, TCP4ServerEndpoint
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from twisted.python.failure import Failure

from synapse_lite.config.homeserver import TlsFiles
from synapse_lite.http.tls import server_tls_options

logger = logging.getLogger(__name__)


def server_endpoint(
    reactor: Any, port: int, interface: str, tls: TlsFiles | None
) -> IStreamServerEndpoint:
    """The endpoint listening on ``interface:port`` (an IPv4 or IPv6
    address; ``0.0.0.0`` or ``::`` for every one), with TLS when ``tls``."""
    if tls is not None:
        return SSL4ServerEndpoint(reactor, port, server_tls_options(tls), interface=interface)
    return TCP4ServerEndpoint(reactor, port, interface=interface)


def listen(
    reactor: Any, port: int, interface: str, tls: TlsFiles | None, factory: Any
) -> IListeningPort:
    """Listen with ``factory`` (a protocol factory: a site, the relay's, the
    replication server's) now; raises (``CannotListenError``,
    ``TlsSetupError``) when it cannot."""
    outcome: list[Any] = []
    server_endpoint(reactor, port, interface, tls).listen(factory).addBoth(outcome.append)
    if not outcome:
        raise RuntimeError(f"listening on {interface}:{port} did not happen at once")
    result = outcome[0]
    if isinstance(result, Failure):
        result.raiseException()
    listening: IListeningPort = result
    return listening


def describe_listener(
    port: IListeningPort, interface: str, resources: tuple[str, ...], tls: TlsFiles | None
) -> str:
    """How a listener is logged: ``127.0.0.1:8008 (client, health; TLS)``."""
    bound = port.getHost().port  # type: ignore[attr-defined]
    return f"{interface}:{bound} ({', '.join(resources)}{'; TLS' if tls is not None else ''})"
