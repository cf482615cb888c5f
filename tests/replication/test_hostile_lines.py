"""Hostile replication input against real processes: thousands of generated and
mutated lines over TCP (to the main process's listener) and through Redis (on
the processes' channel). No process dies, no stream position moves backwards,
and over TCP every connection that sent something invalid gets ERROR and is
closed.

The servers run as separate OS processes; the test talks to them with blocking
sockets, so hypothesis drives the examples directly.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial import unittest

from synapse_lite.replication.tcp.commands import (
    CommandParseError,
    NameCommand,
    parse_command_from_line,
)
from synapse_lite.replication.tcp.redis import mac_key, message_mac
from synapse_lite.storage.database import make_startup_connection
from tests.harness.databases import TestDatabase, create_test_database, test_engine_name
from tests.harness.processes import SOURCE_ROOT, free_port
from tests.harness.services import redis_address, require_redis

SECRET = "hostile-secret"

#: Well-formed lines of every command, the seeds of the mutations.
VALID_LINES = [
    b'RDATA events persister1 7 ["ev",["$e:x","!r:x","m.room.message",null,null,null,null,'
    b"false,false,true]]",
    b'RDATA events persister1 batch ["state",["!r:x","m.room.name","","$e:x"]]',
    b'RDATA caches main 3 ["get_users_in_room",["!r:x"],1]',
    b'RDATA typing main 2 ["!r:x",["@a:x"]]',
    b'RDATA receipts main 4 ["!r:x","m.read","@a:x","$e:x",null,{"ts":1}]',
    b"POSITION events persister1 3 5",
    b"POSITION typing main 10 2",
    b"REPLICATE",
    b"PING 1234",
    b"USER_SYNC abc @a:x DEV start 1234",
    b"USER_SYNC abc @a:x None end 1234",
    b"CLEAR_USER_SYNC abc",
    b"FEDERATION_ACK federation_sender 17",
    b'USER_IP @a:x ["tok","127.0.0.1","agent","DEV",1234]',
    b"REMOTE_SERVER_UP other.example",
    b"CHECKED events 5 AAAAAAAA c2lnbmF0dXJl",
    b"NAME fuzzer",
]


@st.composite
def mutated_line(draw: Any) -> bytes:
    line = bytearray(draw(st.sampled_from(VALID_LINES)))
    for _ in range(draw(st.integers(1, 4))):
        choice = draw(st.integers(0, 5))
        position = draw(st.integers(0, max(len(line) - 1, 0)))
        if choice == 0 and line:  # flip a byte
            line[position] = draw(st.integers(0, 255))
        elif choice == 1:  # cut
            del line[position:]
        elif choice == 2:  # insert junk
            line[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif choice == 3:  # replace a field with text
            fields = bytes(line).split(b" ")
            index = draw(st.integers(0, len(fields) - 1))
            fields[index] = draw(st.text(max_size=12)).encode("utf-8", "surrogatepass")
            line = bytearray(b" ".join(fields))
        elif choice == 4:  # duplicate
            line += b" " + line
        else:  # nest JSON deeply
            line += b"[" * draw(st.integers(50, 3000))
    return bytes(line).replace(b"\n", b" ")


#: Every position a lying line claims is at least this; nothing real gets there.
LIE_FLOOR = 1_000_000
#: The writers the processes have (anything else is a phantom).
REAL_WRITERS = {"main", "persister1"}


@st.composite
def lying_line(draw: Any) -> bytes:
    """A well-formed POSITION or RDATA claiming a position no sequence handed
    out, for a real, a phantom or an absurd writer."""
    stream = draw(st.sampled_from(["events", "presence", "receipts", "typing", "caches"]))
    writer = draw(st.sampled_from(["persister1", "main", "persister9", "fuzzer", "w" * 300]))
    token = draw(st.one_of(st.integers(LIE_FLOOR, 10**18 - 1), st.just(2**63 - 1)))
    if draw(st.booleans()):
        return f"POSITION {stream} {writer} 0 {token}".encode()
    row = {
        "events": '["ev",["$e:x","!r:x","m.room.message",null,null,null,null,false,false,true]]',
        "presence": '["@a:x","online",0,0,0,null,true]',
        "receipts": '["!r:x","m.read","@a:x","$e:x",null,{"ts":1}]',
        "typing": '["!r:x",["@a:x"]]',
        "caches": '["get_users_in_room",["!r:x"],1]',
    }[stream]
    return f"RDATA {stream} {writer} {token} {row}".encode()


@st.composite
def forged_note(draw: Any) -> bytes:
    """A well-formed CHECKED note vouching for a lie, signed by anything but
    the main process's key (a process holding the replication secret can
    publish it; only the signature can give it away)."""
    stream = draw(st.sampled_from(["events", "presence", "receipts", "caches", "typing"]))
    token = draw(st.integers(LIE_FLOOR, 10**18 - 1))
    key_id = draw(st.sampled_from(["AAAAAAAA", "fuzzkey0"]))
    signature = draw(st.binary(min_size=64, max_size=64)).hex()[:86]
    return f"CHECKED {stream} {token} {key_id} {signature}".encode()


hostile_line = st.one_of(
    st.sampled_from(VALID_LINES),
    mutated_line(),
    lying_line(),
    forged_note(),
    st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"")),
    st.integers(16_000, 40_000).map(lambda n: b"RDATA events persister1 9 " + b"x" * n),
)


def is_valid(line: bytes) -> bool:
    """Whether the server should accept the line (parses as a command and may
    be sent by a worker)."""
    if not line.strip():
        return True
    try:
        command = parse_command_from_line(line.decode("utf-8"))
    except (UnicodeDecodeError, CommandParseError):
        return False
    if isinstance(command, NameCommand):
        # The connection is named "fuzzer" first: renaming it is refused
        # (issue 34), and so is naming another deployment.
        return command.client_name == "fuzzer" and command.deployment is None
    # CHECKED is a Redis note: over TCP no command at all.
    return command.NAME not in ("SERVER", "AUTH", "CHECKED")


class HostileServer:
    """A main process and one events-writer worker, as OS processes."""

    def __init__(self, test_db: TestDatabase, transport: str) -> None:
        self.test_db = test_db
        self.dir = tempfile.mkdtemp(prefix="synapse_lite_hostile_")
        self.http_port = free_port()
        self.tcp_port = free_port()
        self.worker_port = free_port()
        self.channel_prefix = f"hostile-{os.getpid()}-{transport}-"
        host, port = redis_address()
        config = {
            "server_name": "hostile.local",
            "data_dir": os.path.join(self.dir, "data"),
            "database": test_db.config(),
            "worker_replication_secret": SECRET,
            "replication": {
                "transport": transport,
                "tcp": {"port": self.tcp_port},
                "redis": {"host": host, "port": port, "channel_prefix": self.channel_prefix},
            },
            "listeners": [
                {
                    "port": self.http_port,
                    "resources": ["client", "replication", "health", "metrics"],
                }
            ],
            "workers": {
                "persister1": {
                    "listeners": [
                        {"port": self.worker_port, "resources": ["replication", "health"]}
                    ]
                }
            },
            "stream_writers": {"events": ["persister1"]},
        }
        self.config_path = os.path.join(self.dir, "homeserver.yaml")
        with open(self.config_path, "w") as f:
            yaml.safe_dump(config, f)
        env = dict(os.environ, PYTHONPATH=SOURCE_ROOT)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        for name, args in (
            ("main", ["-m", "synapse_lite.app.homeserver", "-c", self.config_path]),
            (
                "persister1",
                [
                    "-m",
                    "synapse_lite.app.generic_worker",
                    "-c",
                    self.config_path,
                    "--worker-name",
                    "persister1",
                ],
            ),
        ):
            log = open(os.path.join(self.dir, f"{name}.log"), "wb")
            self.processes[name] = subprocess.Popen(
                [sys.executable, *args], stdout=log, stderr=log, env=env, cwd=self.dir
            )
            self.wait_healthy(name)

    def health_url(self, name: str) -> str:
        port = self.http_port if name == "main" else self.worker_port
        return f"http://127.0.0.1:{port}/health"

    def wait_healthy(self, name: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                raise AssertionError(f"{name} died:\n{self.log(name)}")
            try:
                with urllib.request.urlopen(self.health_url(name), timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"{name} not healthy:\n{self.log(name)}")

    def log(self, name: str) -> str:
        with open(os.path.join(self.dir, f"{name}.log"), errors="replace") as f:
            return f.read()

    def deployment_id(self) -> bytes:
        """The id every Redis message of this deployment carries."""
        conn = make_startup_connection(self.test_db.make_engine())
        try:
            with conn.transaction() as txn:
                txn.execute("SELECT deployment_id FROM deployment")
                row = txn.fetchone()
                assert row is not None
                return str(row[0]).encode()
        finally:
            conn.close()

    def stored_positions(self) -> list[tuple[str, str, int]]:
        """``stream_positions``, as the database has it now."""
        conn = make_startup_connection(self.test_db.make_engine())
        try:
            with conn.transaction() as txn:
                txn.execute("SELECT stream_name, instance_name, stream_id FROM stream_positions")
                return [(r[0], r[1], int(r[2])) for r in txn.fetchall()]
        finally:
            conn.close()

    def positions(self) -> dict[tuple[str, str], float]:
        """Stream positions main reports in /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        pattern = re.compile(
            r'^synapse_lite_stream_position\{stream="([^"]+)",writer="([^"]+)"\} (\S+)$', re.M
        )
        return {(m.group(1), m.group(2)): float(m.group(3)) for m in pattern.finditer(text)}

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()


def send_over_tcp(
    server: HostileServer, lines: list[bytes], name: str = "fuzzer"
) -> tuple[bytes, bool]:
    """Authenticate as ``name``, send ``lines``, and read until the server
    closes or goes quiet: what it answered, and whether it closed the
    connection."""
    with socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5) as sock:
        sock.sendall(f"AUTH {SECRET}\nNAME {name}\n".encode())
        sock.sendall(b"".join(line + b"\n" for line in lines))
        expect_error = not all(is_valid(line) for line in lines)
        sock.settimeout(0.5 if expect_error else 0.05)
        received = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return received, True
                received += chunk
        except (TimeoutError, ConnectionResetError):
            return received, False


def in_envelope(deployment: bytes, line: bytes) -> bytes:
    """``line`` as a process of the deployment would publish it (signed with
    the secret), sent in the name of the writer it claims for (or of
    ``fuzzer``)."""
    fields = line.split(b" ", 3)
    sender = fields[2] if fields[0] in (b"RDATA", b"POSITION") and len(fields) > 2 else b""
    head = b"@" + deployment + b" " + (sender or b"fuzzer") + b" "
    return head + message_mac(mac_key(SECRET), head + line) + b" " + line


def publish_to_redis(server: HostileServer, lines: list[bytes]) -> None:
    """PUBLISH each line on the processes' channel (raw RESP, no client)."""
    host, port = redis_address()
    channel = (server.channel_prefix + "hostile.local").encode()
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(
            b"".join(
                b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
                % (len(channel), channel, len(line), line)
                for line in lines
            )
        )
        replies = b""
        while replies.count(b"\r\n") < len(lines):
            chunk = sock.recv(65536)
            if not chunk:
                raise AssertionError("Redis closed the connection")
            replies += chunk


def parser_share() -> int:
    """How many of the generated lines to send, as a divisor: all of them on
    SQLite; a quarter on PostgreSQL, where the parser meets the same lines
    (it never touches the database) and only the claim checks differ, which
    the lies below exercise in full on both engines."""
    return 1 if test_engine_name() == "sqlite" else 4


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


class HostileLinesTestCase(unittest.TestCase):
    """One method per transport: trial -j may run methods of one class in
    different processes, so each starts, fuzzes and checks its own server."""

    def start_server(self, transport: str) -> HostileServer:
        if transport == "redis":
            require_redis()
        test_db = create_test_database()
        self.addCleanup(test_db.drop)
        server = HostileServer(test_db, transport)
        self.addCleanup(server.stop)
        return server

    def check_survivors(self, server: HostileServer, before: dict[tuple[str, str], float]) -> None:
        for name, process in server.processes.items():
            self.assertIsNone(process.poll(), f"{name} died:\n{server.log(name)[-2000:]}")
            server.wait_healthy(name)
        after = server.positions()
        for key, position in before.items():
            self.assertGreaterEqual(after.get(key, position), position, f"{key} moved backwards")
        for name in server.processes:
            self.assertNotIn("Unhandled error", server.log(name))
            self.assertNotIn("Traceback", server.log(name))
        # No lie was believed: no phantom writer, no position a liar claimed,
        # in any process's view or in stream_positions.
        for (stream, writer), position in after.items():
            self.assertIn(writer, REAL_WRITERS, f"phantom writer {writer[:40]} of {stream}")
            self.assertLess(position, LIE_FLOOR, f"{stream} {writer}")
        for stream, writer, stored in server.stored_positions():
            self.assertIn(writer, REAL_WRITERS, f"stream_positions: {writer[:40]} of {stream}")
            self.assertLess(abs(stored), LIE_FLOOR, f"stream_positions: {stream} {writer}")
        self.assertIn("Refused a replication claim", server.log("main"))

    def test_tcp_listener_survives_hostile_lines(self) -> None:
        server = self.start_server("tcp")
        before = server.positions()
        sent = 0

        @fuzz_settings(2000 // parser_share())
        @given(lines=st.lists(hostile_line, min_size=1, max_size=10))
        def fuzz(lines: list[bytes]) -> None:
            nonlocal sent
            received, closed = send_over_tcp(server, lines)
            sent += len(lines)
            if all(is_valid(line) for line in lines):
                self.assertNotIn(b"\nERROR ", b"\n" + received, f"ERROR for valid {lines!r}")
            else:
                self.assertIn(b"\nERROR ", b"\n" + received, f"no ERROR for {lines!r}")
                self.assertTrue(closed, f"connection kept open after {lines!r}")

        fuzz()
        self.assertGreaterEqual(sent, 10_000 // parser_share())

        # The lies again, on connections naming the writers they claim for:
        # refused at NAME since issue 34 (persister1 is connected, main is
        # the listener's own name); over Redis they reach the claim checks.
        @fuzz_settings(200)
        @given(lines=st.lists(lying_line(), min_size=1, max_size=10))
        def lie(lines: list[bytes]) -> None:
            for name in ("persister1", "main"):
                send_over_tcp(server, lines, name)

        lie()
        self.check_survivors(server, before)

    def test_redis_subscribers_survive_hostile_messages(self) -> None:
        server = self.start_server("redis")
        before = server.positions()
        deployment = server.deployment_id()
        sent = 0

        @fuzz_settings(1000 // parser_share())
        @given(lines=st.lists(hostile_line, min_size=10, max_size=20))
        def fuzz(lines: list[bytes]) -> None:
            nonlocal sent
            # Half as this deployment's processes would publish (the lines
            # reach the parser and the claim checks), half bare (refused
            # for naming no sender).
            half = len(lines) // 2
            publish_to_redis(
                server, [in_envelope(deployment, line) for line in lines[:half]] + lines[half:]
            )
            sent += len(lines)

        fuzz()
        self.assertGreaterEqual(sent, 10_000 // parser_share())
        self.check_survivors(server, before)
