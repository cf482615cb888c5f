"""Run one synapse_lite process with a timestamp at each stage an event passes
on its way to a woken /sync (what ``bench/wakeup_stages.py`` starts instead of
the plain process).

    python bench/traced_process.py OUT.trace -m synapse_lite.app.generic_worker ARGS...

Each stage appends ``<unix time> <stage> [<detail>]`` to OUT.trace, line by
line. The stages are methods of the process's code wrapped by name before it
starts; a method missing from the checkout being run (a baseline) is simply
not traced, so the same wrapper times any version. Only the events stream
and the /sync handler are traced: one new message's path.
"""

from __future__ import annotations

import functools
import importlib
import runpy
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

#: (module, class, method, stage, when the call is traced)
Filter = Callable[..., bool]


def _always(*args: Any, **kwargs: Any) -> bool:
    return True


def _events_id_gen(self: Any, *args: Any, **kwargs: Any) -> bool:
    return getattr(self, "stream_name", None) == "events"


def _events_stream(self: Any, *args: Any, **kwargs: Any) -> bool:
    return getattr(self, "name", None) == "events"


def _events_rows(self: Any, stream_name: str, writer: str, token: int, rows: Any) -> bool:
    return stream_name == "events" and bool(rows)


def _events_line(self: Any, *args: Any) -> bool:
    line = args[-1]
    return isinstance(line, bytes) and line.startswith(b"RDATA events ")


def _allocated_line(self: Any, *args: Any) -> bool:
    line = args[-1]
    return isinstance(line, bytes) and line.startswith(b"ALLOCATED events ")


def _events_name(self: Any, stream_name: str, *args: Any) -> bool:
    return stream_name == "events"


def _events_cmd(self: Any, *args: Any) -> bool:
    cmd = args[-1]
    return getattr(cmd, "NAME", None) == "RDATA" and getattr(cmd, "stream_name", "") == "events"


def _events_relayed(self: Any, sender: Any, cmd: Any, line: bytes) -> bool:
    return getattr(cmd, "stream_name", "") == "events"


def _events_claim(self: Any, stream: Any, *args: Any, **kwargs: Any) -> bool:
    return getattr(stream, "name", None) == "events"


SYNC_WAIT = ("synapse_lite.notifier", "Notifier", "wait_for_events")
#: (module, class, method, stage, filter): synchronous methods mark their
#: entry; coroutine methods their entry (``stage:start``) and end (``stage``).
STAGES: list[tuple[str, str, str, str, Filter]] = [
    # The writer
    (
        "synapse_lite.storage.id_generators.generator",
        "MultiWriterIdGenerator",
        "_after_finish",
        "committed",
        _events_id_gen,
    ),
    (
        "synapse_lite.replication.tcp.streamer",
        "ReplicationStreamer",
        "_run_loop",
        "streamer",
        _always,
    ),
    (
        "synapse_lite.replication.streams",
        "Stream",
        "new_local_rows",
        "rows_read",
        _events_stream,
    ),
    # Any process writing or reading a line of the events stream
    (
        "synapse_lite.replication.tcp.protocol",
        "ReplicationProtocol",
        "_write",
        "sent",
        _events_line,
    ),
    (
        "synapse_lite.replication.tcp.protocol",
        "ReplicationProtocol",
        "lineReceived",
        "received",
        _events_line,
    ),
    (
        "synapse_lite.replication.tcp.protocol",
        "ReplicationProtocol",
        "_write",
        "allocated_sent",
        _allocated_line,
    ),
    (
        "synapse_lite.replication.tcp.protocol",
        "ReplicationProtocol",
        "lineReceived",
        "allocated_received",
        _allocated_line,
    ),
    # The main process: the claim's check, then the relay
    ("synapse_lite.replication.claims", "PeerClaims", "read_ahead", "read_ahead", _events_name),
    (
        "synapse_lite.replication.claims",
        "PeerClaims",
        "believe",
        "claim_checked",
        _events_claim,
    ),
    (
        "synapse_lite.replication.tcp.tcp_server",
        "ReplicationServerFactory",
        "_pass_on",
        "relayed",
        _events_relayed,
    ),
    # The follower
    (
        "synapse_lite.replication.tcp.handler",
        "ReplicationCommandHandler",
        "on_command",
        "handled",
        _events_cmd,
    ),
    (
        "synapse_lite.replication.tcp.receiver",
        "ReplicationReceiver",
        "on_rows",
        "applied",
        _events_rows,
    ),
    # The /sync
    ("synapse_lite.handlers.sync", "SyncHandler", "_compute", "computed", _always),
    ("synapse_lite.handlers.sync", "SyncHandler", "_sync", "answered", _always),
    (
        "synapse_lite.storage.database",
        "DatabasePool",
        "runInteraction",
        "db",
        _always,
    ),
    ("synapse_lite.storage.database", "DatabasePool", "_new_transaction", "txn", _always),
]


def _wrap(out: TextIO, cls: type, method: str, stage: str, wanted: Filter) -> None:
    original = getattr(cls, method, None)
    if original is None:
        return
    is_db = stage == "db"

    def mark(name: str, detail: str = "") -> None:
        out.write(f"{time.time():.6f} {name} {detail}\n")

    if hasattr(original, "__code__") and original.__code__.co_flags & 0x80:  # a coroutine

        @functools.wraps(original)
        async def traced_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not wanted(self, *args, **kwargs):
                return await original(self, *args, **kwargs)
            detail = str(args[0]) if is_db and args else ""
            mark(f"{stage}:start", detail)
            try:
                return await original(self, *args, **kwargs)
            finally:
                mark(stage, detail)

        setattr(cls, method, traced_async)
        return

    if stage == "txn":

        @functools.wraps(original)
        def bracketed(self: Any, desc: str, *args: Any, **kwargs: Any) -> Any:
            # On the database thread: from taking a connection to the commit.
            mark("txn:start", desc)
            try:
                return original(self, desc, *args, **kwargs)
            finally:
                mark("txn", desc)

        setattr(cls, method, bracketed)
        return

    @functools.wraps(original)
    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        if wanted(self, *args, **kwargs):
            # A connection's stages name its peer (main relays to several).
            mark(stage, str(getattr(self, "peer_name", "") or ""))
        return original(self, *args, **kwargs)

    setattr(cls, method, traced)


def install(out: TextIO) -> None:
    """Wrap every stage's method this checkout has."""
    for module_name, class_name, method, stage, wanted in STAGES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cls = getattr(module, class_name, None)
        if cls is not None:
            _wrap(out, cls, method, stage, wanted)


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit(__doc__)
    out_path, module = sys.argv[1], sys.argv[3]
    sys.argv = [module, *sys.argv[4:]]
    out = open(out_path, "a", buffering=1)
    install(out)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
