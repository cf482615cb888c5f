"""Burst to many servers: 4,500 events in one room with 20 remote servers
(issue 32; Synapse's #10257 took about two hours for such a burst).

The sending side is a real synapse_lite layout (``bench/cluster.py``): the
main process (client, federation and key APIs, the events writer) and 1, 2
or 4 federation sender workers (``federation_sender_instances``). The 20
receiving servers ``r0.test``..``r19.test`` are :class:`Receivers`, one
process (this one) listening on one port per server name: each serves its
signed key document, accepts signed ``PUT /send/{txnId}``, answers a
transaction id it has seen from its record (deduplication) and records
the event ids of the PDUs. Each joins its user to the room first through
``make_join``/``send_join``, as a server would.

Measured per layout: the time from the first event sent until every
destination has every event (target <= 60 s), how long the client took to
send them (the events writer's pace bounds the rest), the lag after the
last event, the transactions, and the senders' CPU per PDU per destination
(user + system CPU of the sender processes over the run, /proc). Ratios
against the 1-sender layout of the same run.

With ``--reference PYTHON`` the same burst also goes through the reference
homeserver's federation sender in the same run
(``bench/reference_federation_sender.py``: its main process and one
federation sender worker, PostgreSQL and Redis), to the same receiving
servers, after ours; and ours runs on PostgreSQL too. The receiving
servers are then named ``localhost:<port>`` and served over HTTPS with a
certificate from a CA of the run (the reference reaches no server named
otherwise on loopback, see tests/harness/synapse_peer.py), which both
sides trust; the reference fetches their keys and accepts their joins as
from any server. "Has every event" is counted alike for both: every event
id the client was answered is among the PDUs the server received in
``/send`` (neither side fetched a gap: a receiver answers no
``get_missing_events`` and would stay short of events, failing the run,
if a sender caught up by sending only the newest).

    python -m bench.federation_burst [--events 4500] [--servers 20] [--senders 1,2,4]
                                     [--engine sqlite|postgres] [--reference PYTHON]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Coroutine
from typing import Any, cast

import treq
import yaml
from twisted.internet import defer, reactor, task
from twisted.python.failure import Failure
from twisted.web import resource, server
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers

from bench.cluster import LAYOUTS, WRITERS, Cluster, free_port, process_cpu_seconds
from bench.reference_federation_sender import ReferenceSender
from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse_lite.event_graph.hashing import event_id_of, sign_event
from synapse_lite.federation.auth import parse_auth_header, sign_request
from synapse_lite.federation.crypto import SigningKey, sign_json
from tests.harness.processes import NO_KEEPALIVE
from tests.harness.tls import TestCA

_reactor = cast(Any, reactor)
ORIGIN = "bench.local"
#: The clients' kept-alive connections, closed when a measurement ends.
CLIENT_POOL = HTTPConnectionPool(_reactor)


class Receiver(resource.Resource):
    """One remote server: its key, and the transactions it accepts."""

    isLeaf = True

    def __init__(self, name: str, key: SigningKey) -> None:
        super().__init__()
        self.name = name
        self.key = key
        #: The sending server's name, which every request must come from.
        self.origin = ORIGIN
        #: txn id -> answer, for deduplication.
        self.transactions: dict[str, bytes] = {}
        self.replayed = 0
        self.event_ids: set[str] = set()
        #: Every PDU's event id, in arrival order (duplicates kept).
        self.received: list[str] = []

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"Content-Type", b"application/json")
        if request.path == b"/_matrix/key/v2/server":
            document = {
                "server_name": self.name,
                "verify_keys": {self.key.key_id: {"key": self.key.verify_key_base64}},
                "old_verify_keys": {},
                "valid_until_ts": int(time.time() * 1000) + 86_400_000,
            }
            return json.dumps(sign_json(document, self.name, self.key)).encode()
        request.setResponseCode(404)
        return b'{"errcode": "M_UNRECOGNIZED"}'

    def render_PUT(self, request: Any) -> bytes:
        request.setHeader(b"Content-Type", b"application/json")
        path = request.path.decode()
        if not path.startswith("/_matrix/federation/v1/send/"):
            request.setResponseCode(404)
            return b'{"errcode": "M_UNRECOGNIZED"}'
        auth = parse_auth_header(request.getHeader("Authorization") or "")
        if auth.origin != self.origin or auth.destination != self.name:
            request.setResponseCode(401)
            return b'{"errcode": "M_UNAUTHORIZED"}'
        txn_id = path.rsplit("/", 1)[-1]
        if txn_id in self.transactions:
            self.replayed += 1
            return self.transactions[txn_id]
        body = json.loads(request.content.read())
        answer: dict[str, Any] = {}
        for pdu in body.get("pdus", []):
            version = KNOWN_ROOM_VERSIONS["10"]
            event_id = event_id_of(version, pdu)
            self.event_ids.add(event_id)
            self.received.append(event_id)
            answer[event_id] = {}
        encoded = json.dumps({"pdus": answer}).encode()
        self.transactions[txn_id] = encoded
        return encoded


class Receivers:
    """``count`` remote servers, one port each, in this process: named
    ``r<i>.test`` over plain HTTP (the sender is told their URLs), or with
    ``ca`` named ``localhost:<port>`` over HTTPS with a certificate of
    ``ca`` (found as any server is, by a sender trusting ``ca``)."""

    def __init__(self, count: int, ca: TestCA | None = None) -> None:
        self.servers: dict[str, Receiver] = {}
        self.urls: dict[str, str] = {}
        self.ports: list[Any] = []
        options = ca.server_options("receivers", ["localhost"]) if ca is not None else None
        for i in range(count):
            if options is None:
                receiver = Receiver(f"r{i}.test", SigningKey.generate())
                port = _reactor.listenTCP(0, server.Site(receiver), interface="127.0.0.1")
                url = f"http://127.0.0.1:{port.getHost().port}"
            else:
                number = free_port()
                receiver = Receiver(f"localhost:{number}", SigningKey.generate())
                port = _reactor.listenSSL(
                    number, server.Site(receiver), options, interface="127.0.0.1"
                )
                url = f"https://localhost:{number}"
            self.ports.append(port)
            self.servers[receiver.name] = receiver
            self.urls[receiver.name] = url

    def reset(self, origin: str = ORIGIN) -> None:
        """Forget what arrived; from now on requests come from ``origin``."""
        for receiver in self.servers.values():
            receiver.origin = origin
            receiver.transactions.clear()
            receiver.event_ids.clear()
            receiver.received.clear()
            receiver.replayed = 0

    async def join(self, main_url: str, room_id: str, destination: str = ORIGIN) -> None:
        """Each server joins its user ``@u:<name>`` (make_join, send_join)
        through ``main_url``, the federation API of ``destination``."""
        version = KNOWN_ROOM_VERSIONS["10"]
        for name, receiver in self.servers.items():
            user = f"@u:{name}"
            path = (
                f"/_matrix/federation/v1/make_join/{urllib.parse.quote(room_id)}/"
                f"{urllib.parse.quote(user)}?ver=10"
            )
            template = (await signed_request(receiver, main_url, "GET", path, None, destination))[
                "event"
            ]
            template["origin_server_ts"] = int(time.time() * 1000)
            template["origin"] = name
            event = sign_event(version, template, name, receiver.key)
            event_id = event_id_of(version, event)
            path = (
                f"/_matrix/federation/v2/send_join/{urllib.parse.quote(room_id)}/"
                f"{urllib.parse.quote(event_id)}"
            )
            await signed_request(receiver, main_url, "PUT", path, event, destination)

    def delivered(self, expected: set[str]) -> int:
        """How many servers have every event of ``expected``."""
        return sum(1 for r in self.servers.values() if expected <= r.event_ids)


async def signed_request(
    receiver: Receiver,
    base: str,
    method: str,
    path: str,
    content: Any = None,
    destination: str = ORIGIN,
) -> Any:
    header = sign_request(receiver.key, receiver.name, destination, method, path, content)
    data = None if content is None else json.dumps(content).encode()
    response = await treq.request(
        method,
        base + path,
        data=data,
        headers=Headers({"Authorization": [header], "Content-Type": ["application/json"]}),
        pool=NO_KEEPALIVE,
    )
    body = await treq.content(response)
    if response.code != 200:
        raise RuntimeError(f"{method} {path}: {response.code} {body[:300]!r}")
    return json.loads(body)


async def client_request(method: str, url: str, token: str | None, body: Any = None) -> Any:
    headers = Headers({"Content-Type": ["application/json"]})
    if token:
        headers.setRawHeaders("Authorization", [f"Bearer {token}"])
    response = await treq.request(
        method, url, data=json.dumps(body or {}).encode(), headers=headers, pool=CLIENT_POOL
    )
    content = await treq.content(response)
    if response.code != 200:
        raise RuntimeError(f"{method} {url}: {response.code} {content[:300]!r}")
    return json.loads(content)


def _layout(senders: int) -> str:
    name = f"fedsend{senders}"
    LAYOUTS[name] = {f"sender{i + 1}": ["health", "metrics"] for i in range(senders)}
    WRITERS[name] = {}
    return name


async def register_user(base: str, username: str) -> str:
    """A new user's access token (a second request with the session when
    the server asks for one first, as the reference may)."""
    body: dict[str, Any] = {
        "username": username,
        "password": f"pw-{username}-1",
        "auth": {"type": "m.login.dummy"},
    }
    url = base + "/_matrix/client/v3/register"
    response = await treq.post(
        url,
        json.dumps(body).encode(),
        headers=Headers({"Content-Type": ["application/json"]}),
        pool=CLIENT_POOL,
    )
    answer = json.loads(await treq.content(response))
    if response.code == 401 and "session" in answer:
        body["auth"]["session"] = answer["session"]
        answer = await client_request("POST", url, None, body)
    elif response.code != 200:
        raise RuntimeError(f"register: {response.code} {answer}")
    return str(answer["access_token"])


async def burst(
    base: str, receivers: Receivers, events: int, destination: str, pids: list[int]
) -> dict[str, float]:
    """A room on the server at ``base`` (client and federation API of
    ``destination``), every receiver joined; ``events`` messages sent
    (16 at a time) and the time until every receiver has every one; the
    figures, the CPU being that of ``pids`` (the senders)."""
    token = await register_user(base, "alice")
    room = await client_request(
        "POST",
        base + "/_matrix/client/v3/createRoom",
        token,
        {"preset": "public_chat", "room_version": "10"},
    )
    room_id = room["room_id"]
    await receivers.join(base, room_id, destination)
    # Let the joins' own traffic settle before measuring.
    await task.deferLater(_reactor, 1.0, lambda: None)
    cpu_before = sum(process_cpu_seconds(p) for p in pids)
    expected: set[str] = set()
    started = time.monotonic()
    semaphore = defer.DeferredSemaphore(16)
    quoted = urllib.parse.quote(room_id)

    async def send(n: int) -> None:
        answer = await client_request(
            "PUT",
            f"{base}/_matrix/client/v3/rooms/{quoted}/send/m.room.message/t{n}",
            token,
            {"msgtype": "m.text", "body": f"burst {n}"},
        )
        expected.add(answer["event_id"])

    await defer.gatherResults([semaphore.run(send, n) for n in range(events)])
    sent = time.monotonic() - started
    deadline = started + 600
    while receivers.delivered(expected) < len(receivers.servers):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"not delivered after 600 s: {receivers.delivered(expected)} servers have all"
            )
        await task.deferLater(_reactor, 0.05, lambda: None)
    done = time.monotonic() - started
    cpu = sum(process_cpu_seconds(p) for p in pids) - cpu_before
    pdus = sum(1 for r in receivers.servers.values() for e in r.received if e in expected)
    replayed = sum(r.replayed for r in receivers.servers.values())
    transactions = sum(len(r.transactions) for r in receivers.servers.values())
    deliveries = events * len(receivers.servers)
    return {
        "delivered_s": done,
        "sent_s": sent,
        "lag_s": done - sent,
        "cpu_s": cpu,
        "cpu_us_per_pdu_dest": cpu / deliveries * 1e6,
        "transactions": transactions,
        "pdus_per_txn": pdus / max(transactions, 1),
        "duplicates": pdus - deliveries,
        "replayed": replayed,
    }


async def run_layout(
    senders: int, receivers: Receivers, events: int, engine: str, ca: TestCA | None = None
) -> dict[str, float]:
    """One burst through ``senders`` sender workers of ours; the figures.
    With ``ca``, the receivers are found by name over HTTPS (see
    :class:`Receivers`), that CA trusted."""
    receivers.reset()
    cluster = Cluster(_layout(senders), engine)
    with open(cluster.config_path) as f:
        config = yaml.safe_load(f)
    config["listeners"][0]["resources"] += ["federation", "keys"]
    config["federation_sender_instances"] = [f"sender{i + 1}" for i in range(senders)]
    if ca is None:
        config["federation"] = {"destinations": dict(receivers.urls)}
    else:
        config["federation"] = {
            "extra_ca_paths": [ca.ca_path],
            "ip_range_allowlist": ["127.0.0.0/8"],
        }
    with open(cluster.config_path, "w") as f:
        yaml.safe_dump(config, f)
    cluster.start()
    try:
        pids = [cluster.processes[f"sender{i + 1}"].pid for i in range(senders)]
        return await burst(cluster.url("main"), receivers, events, ORIGIN, pids)
    finally:
        cluster.stop()


async def run_reference(
    python: str, receivers: Receivers, events: int, ca: TestCA
) -> dict[str, float]:
    """The same burst through the reference's federation sender worker."""
    reference = ReferenceSender(python, ca.ca_path)
    receivers.reset(reference.server_name)
    try:
        reference.start()
        return await burst(
            reference.url(),
            receivers,
            events,
            reference.server_name,
            [reference.sender_pid()],
        )
    finally:
        reference.stop()


HEADER = (
    f"{'sender':>16} {'all delivered s':>15} {'client sent s':>13} {'lag s':>6}"
    f" {'txns':>6} {'PDUs/txn':>8} {'dup':>4} {'CPU us/PDU/dest':>15} {'ratio time':>10}"
    f" {'ratio CPU':>9}"
)


def row(label: str, r: dict[str, float], base: dict[str, float]) -> str:
    return (
        f"{label:>16} {r['delivered_s']:>15.1f} {r['sent_s']:>13.1f} {r['lag_s']:>6.1f}"
        f" {int(r['transactions']):>6} {r['pdus_per_txn']:>8.1f} {int(r['duplicates']):>4}"
        f" {r['cpu_us_per_pdu_dest']:>15.1f}"
        f" {r['delivered_s'] / base['delivered_s']:>10.2f}"
        f" {r['cpu_us_per_pdu_dest'] / base['cpu_us_per_pdu_dest']:>9.2f}"
    )


async def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The figures of each sender measured (``ours, <n>``, ``Synapse, 1``),
    in the order run."""
    ca = None
    if args.reference:
        ca = TestCA(tempfile.mkdtemp(prefix="synapse_lite_bench_ca_"))
    receivers = Receivers(args.servers, ca)
    results: dict[str, dict[str, float]] = {}
    try:
        for senders in args.senders:
            label = f"ours, {senders}"
            results[label] = await run_layout(senders, receivers, args.events, args.engine, ca)
            print(f"{label} sender(s): {json.dumps(results[label])}", flush=True)
        if ca is not None:
            label = "Synapse, 1"
            results[label] = await run_reference(args.reference, receivers, args.events, ca)
            print(f"{label} sender: {json.dumps(results[label])}", flush=True)
    finally:
        for port in receivers.ports:
            await port.stopListening()
        await CLIENT_POOL.closeCachedConnections()
    return results


def report(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> str:
    """The table and the ratios."""
    lines: list[str] = []
    first = next(iter(results))
    base = results[first]
    transport = "HTTPS by name" if args.reference else "HTTP"
    lines.append("")
    lines.append(
        f"Burst: {args.events} events, one room, {args.servers} remote servers"
        f" ({args.engine}, receivers over {transport}; ratios vs {first} sender(s) of this run)"
    )
    lines.append(HEADER)
    for label, r in results.items():
        lines.append(row(label, r, base))
    worst = max(r["delivered_s"] for label, r in results.items() if label.startswith("ours"))
    lines.append(
        f"target <= 60 s (ours): {'met' if worst <= 60 else 'NOT met'} (slowest {worst:.1f} s)"
    )
    if args.reference:
        reference = results["Synapse, 1"]
        lines.append(
            f"Synapse's sender / ours ({first}): all delivered"
            f" {reference['delivered_s'] / base['delivered_s']:.2f}x, lag after the last send"
            f" {reference['lag_s']:.1f} s vs {base['lag_s']:.1f} s, sender CPU per PDU per"
            f" destination {reference['cpu_us_per_pdu_dest'] / base['cpu_us_per_pdu_dest']:.2f}x"
        )
    else:
        lines.append("Synapse's federation sender: not run (--reference PYTHON runs it).")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    print(report(args, await measure(args)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=4500)
    parser.add_argument("--servers", type=int, default=20)
    parser.add_argument(
        "--senders", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4]
    )
    parser.add_argument("--engine", choices=["sqlite", "postgres"], default=None)
    parser.add_argument(
        "--reference",
        metavar="PYTHON",
        help="also the reference's federation sender worker, from this Python's install",
    )
    args = parser.parse_args(argv)
    # The reference runs workers on PostgreSQL only: ours on it too, alike.
    args.engine = args.engine or ("postgres" if args.reference else "sqlite")
    return run_reactor(main_async(args))


def run_reactor(work: Coroutine[Any, Any, Any]) -> int:
    """Run ``work`` on the reactor until it ends; 0, or 1 with its
    traceback printed when it failed."""
    code: list[int] = []

    def failed(failure: Failure) -> None:
        print(failure.getTraceback(), file=sys.stderr, flush=True)
        code.append(1)

    d = defer.ensureDeferred(work)
    d.addCallbacks(lambda _: code.append(0), failed)
    d.addBoth(lambda _: _reactor.stop())
    _reactor.run()
    return code[0] if code else 1


if __name__ == "__main__":
    raise SystemExit(main())
