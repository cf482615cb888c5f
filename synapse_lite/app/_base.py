"""Starting and stopping one process: logging, database, listeners, replication.

A process records its pid in ``<data_dir>/run/<name>.pid`` while it runs (for
``synapse-lite status``). Stopping (SIGTERM, SIGINT) stops accepting requests,
lets the write requests under way finish, sends CLEAR_USER_SYNC, records stream
positions and sends its last rows before closing replication.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from twisted.internet import defer
from twisted.web.resource import Resource
from twisted.web.server import Request

from synapse_lite.app.pid_files import pid_file_path, remove_pid_file, write_pid_file
from synapse_lite.http.server import JsonResource, ServingSite, make_site
from synapse_lite.metrics import OPEN_SYNC_REQUESTS  # noqa: F401  (registers the gauge)

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

logger = logging.getLogger(__name__)

#: Longest a stopping process waits for its last writes to be recorded.
SHUTDOWN_GRACE_SECONDS = 10.0


class _InstanceFilter(logging.Filter):
    def __init__(self, instance_name: str) -> None:
        super().__init__()
        self.instance_name = instance_name

    def filter(self, record: logging.LogRecord) -> bool:
        record.instance = self.instance_name
        return True


def setup_logging(instance_name: str, level: str, stream: TextIO | None = None) -> None:
    """Log to ``stream`` (stderr) with the process name on every line (the
    launcher merges the lines of all processes)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(_InstanceFilter(instance_name))
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(instance)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("synapse_lite.storage.txn").setLevel(max(logging.INFO, root.level))
    from twisted.logger import STDLibLogObserver, globalLogBeginner

    globalLogBeginner.beginLoggingTo([STDLibLogObserver()], redirectStandardIO=False)


class HealthResource(Resource):
    isLeaf = True

    def __init__(self, hs: HomeServer) -> None:
        super().__init__()
        self._hs = hs

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"Content-Type", b"application/json")
        return b'{"status":"ok","instance":"%s"}' % self._hs.instance_name.encode("utf-8")


def build_listener_resource(hs: HomeServer, resources: tuple[str, ...]) -> Resource:
    """The resource tree of one HTTP listener."""
    root = Resource()
    # /_synapse holds both the admin API (served with the client API) and the
    # internal replication endpoints; each JsonResource matches whole paths.
    synapse_root = Resource()
    # /_matrix holds the client, federation and key APIs, on one JsonResource.
    matrix: JsonResource | None = None
    if "client" in resources:
        from synapse_lite.rest.client import register_servlets

        matrix = JsonResource("client")
        register_servlets(hs, matrix)
        synapse_root.putChild(b"admin", matrix)
    if "federation" in resources or "keys" in resources:
        from synapse_lite.federation.server import register_federation_servlets

        matrix = matrix or JsonResource("federation")
        register_federation_servlets(hs, matrix, resources)
    if matrix is not None:
        root.putChild(b"_matrix", matrix)
    if "replication" in resources:
        from synapse_lite.replication.http.registry import replication_resource

        synapse_root.putChild(b"replication", replication_resource(hs))
    if synapse_root.children:
        root.putChild(b"_synapse", synapse_root)
    if "health" in resources:
        root.putChild(b"health", HealthResource(hs))
    if "metrics" in resources:
        from prometheus_client.twisted import MetricsResource

        root.putChild(b"metrics", MetricsResource())
    return root


def start(hs: HomeServer) -> None:
    """Load the database, then listen and replicate. Runs before the reactor."""
    start_time = time.monotonic()
    logger.info(
        "Starting %s (writes %s)",
        hs.instance_name,
        ", ".join(hs.config.streams_written_by(hs.instance_name)),
    )
    hs.setup()
    serves_federation = any(
        {"federation", "keys"} & set(listener.resources)
        for listener in hs.config.listeners_of(hs.instance_name)
    )
    if hs.is_main_process or serves_federation or hs.config.federation_sender == hs.instance_name:
        # The main process creates the key on its first start; the sender and
        # the federation listeners use it. A missing key fails here, clearly.
        logger.info("Signing key %s", hs.signing_key.key_id)
    replication = hs.replication
    hs.presence_handler  # noqa: B018  (built now: it counts syncs from the start)
    from synapse_lite.replication.transports import start_replication

    start_replication(hs)
    if hs.is_main_process:
        # Rooms of writers no longer configured move to configured ones (sends
        # to them fail with a retryable 503 until then).
        hs.reactor.callWhenRunning(
            lambda: defer.ensureDeferred(reassign_rooms(hs)).addErrback(
                lambda f: logger.error("Reassigning rooms failed: %s", f.getTraceback())
            )
        )
    sites: list[ServingSite] = []
    ports: list[Any] = []
    for listener in hs.config.listeners_of(hs.instance_name):
        site = make_site(
            build_listener_resource(hs, listener.resources),
            hs.config.limits.max_request_body_bytes,
        )
        port = hs.reactor.listenTCP(listener.port, site, interface=listener.bind_address)
        sites.append(site)
        ports.append(port)
        logger.info(
            "Listening on %s:%d (%s)",
            listener.bind_address,
            port.getHost().port,
            ", ".join(listener.resources),
        )
    hs.listening_ports = ports  # type: ignore[attr-defined]
    hs.sites = sites  # type: ignore[attr-defined]
    write_pid_file(pid_file_path(hs.config.data_dir, hs.instance_name))
    logger.info(
        "%s started in %.3f s: writes %s",
        hs.instance_name,
        time.monotonic() - start_time,
        ", ".join(replication.sourced_stream_names),
    )
    hs.reactor.addSystemEventTrigger("before", "shutdown", lambda: defer.ensureDeferred(stop(hs)))


async def reassign_rooms(hs: HomeServer) -> None:
    """Main process, at startup: rooms whose events writer is no longer
    configured get a new one (see ``RoomWorkerStore.reassign_rooms_of_removed_writers``)."""
    moved = await hs.datastore.reassign_rooms_of_removed_writers(
        hs.instance_directory.event_writers()
    )
    if moved:
        logger.info("Moved %d room(s) to configured events writers", moved)


async def stop(hs: HomeServer) -> None:
    """Stop serving, let writes finish, tell the others, record positions,
    release the database."""
    logger.info("Shutting down %s", hs.instance_name)
    for port in getattr(hs, "listening_ports", []):
        await port.stopListening()
    await _wait_for_writes(hs)
    try:
        hs.presence_handler.stop()
    except Exception:
        logger.exception("Stopping presence failed")
    try:
        await hs.clock.timeout(
            defer.ensureDeferred(flush_stream_positions(hs)), SHUTDOWN_GRACE_SECONDS
        )
        streamer = hs.replication.streamer
        if streamer is not None:
            await hs.clock.timeout(defer.ensureDeferred(streamer.send_pending()), 2.0)
    except Exception:
        logger.warning("Recording or sending stream positions at shutdown failed", exc_info=True)
    from synapse_lite.replication.transports import stop_replication

    await stop_replication(hs)
    hs.shutdown()
    remove_pid_file(pid_file_path(hs.config.data_dir, hs.instance_name))
    logger.info("%s stopped", hs.instance_name)


async def _wait_for_writes(hs: HomeServer) -> None:
    sites: list[ServingSite] = getattr(hs, "sites", [])
    pending = sum(site.writes_in_flight for site in sites)
    if not pending:
        return
    logger.info("Waiting for %d write request(s) to finish", pending)
    waiting = defer.gatherResults([site.wait_for_writes() for site in sites])
    try:
        await hs.clock.timeout(waiting, SHUTDOWN_GRACE_SECONDS)
    except defer.TimeoutError:
        logger.warning(
            "%d write request(s) still unfinished after %.0f s; stopping anyway",
            sum(site.writes_in_flight for site in sites),
            SHUTDOWN_GRACE_SECONDS,
        )


async def flush_stream_positions(hs: HomeServer) -> None:
    from synapse_lite.replication.tcp.streams import StreamFromIdGen

    seen = set()
    for stream in hs.replication.streams.values():
        if isinstance(stream, StreamFromIdGen) and id(stream.id_gen) not in seen:
            seen.add(id(stream.id_gen))
            await stream.id_gen.flush_stream_positions()
