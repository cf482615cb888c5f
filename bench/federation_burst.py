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
against the 1-sender layout of the same run. Synapse's sender is not run
(not built here: see docs/scaling.md).

    python -m bench.federation_burst [--events 4500] [--servers 20] [--senders 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
from typing import Any, cast

import treq
import yaml
from twisted.internet import defer, reactor, task
from twisted.python.failure import Failure
from twisted.web import resource, server
from twisted.web.http_headers import Headers

from bench.cluster import LAYOUTS, WRITERS, Cluster, process_cpu_seconds
from synapse_lite.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse_lite.event_graph.hashing import event_id_of, sign_event
from synapse_lite.federation.auth import parse_auth_header, sign_request
from synapse_lite.federation.crypto import SigningKey, sign_json
from tests.harness.processes import NO_KEEPALIVE

_reactor = cast(Any, reactor)
ORIGIN = "bench.local"


class Receiver(resource.Resource):
    """One remote server: its key, and the transactions it accepts."""

    isLeaf = True

    def __init__(self, name: str, key: SigningKey) -> None:
        super().__init__()
        self.name = name
        self.key = key
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
        if auth.origin != ORIGIN or auth.destination != self.name:
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
    """``count`` remote servers, one port each, in this process."""

    def __init__(self, count: int) -> None:
        self.servers: dict[str, Receiver] = {}
        self.urls: dict[str, str] = {}
        self.ports: list[Any] = []
        for i in range(count):
            name = f"r{i}.test"
            receiver = Receiver(name, SigningKey.generate())
            port = _reactor.listenTCP(0, server.Site(receiver), interface="127.0.0.1")
            self.ports.append(port)
            self.servers[name] = receiver
            self.urls[name] = f"http://127.0.0.1:{port.getHost().port}"

    def reset(self) -> None:
        for receiver in self.servers.values():
            receiver.transactions.clear()
            receiver.event_ids.clear()
            receiver.received.clear()
            receiver.replayed = 0

    async def join(self, main_url: str, room_id: str) -> None:
        """Each server joins its user ``@u:<name>`` (make_join, send_join)."""
        version = KNOWN_ROOM_VERSIONS["10"]
        for name, receiver in self.servers.items():
            user = f"@u:{name}"
            path = (
                f"/_matrix/federation/v1/make_join/{urllib.parse.quote(room_id)}/"
                f"{urllib.parse.quote(user)}?ver=10"
            )
            template = (await _signed(receiver, main_url, "GET", path))["event"]
            template["origin_server_ts"] = int(time.time() * 1000)
            template["origin"] = name
            event = sign_event(version, template, name, receiver.key)
            event_id = event_id_of(version, event)
            path = (
                f"/_matrix/federation/v2/send_join/{urllib.parse.quote(room_id)}/"
                f"{urllib.parse.quote(event_id)}"
            )
            await _signed(receiver, main_url, "PUT", path, event)

    def delivered(self, expected: set[str]) -> int:
        """How many servers have every event of ``expected``."""
        return sum(1 for r in self.servers.values() if expected <= r.event_ids)


async def _signed(
    receiver: Receiver, base: str, method: str, path: str, content: Any = None
) -> Any:
    header = sign_request(receiver.key, receiver.name, ORIGIN, method, path, content)
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


async def _client(method: str, url: str, token: str | None, body: Any = None) -> Any:
    headers = Headers({"Content-Type": ["application/json"]})
    if token:
        headers.setRawHeaders("Authorization", [f"Bearer {token}"])
    response = await treq.request(
        method, url, data=json.dumps(body or {}).encode(), headers=headers
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


async def run_layout(
    senders: int, receivers: Receivers, events: int, engine: str
) -> dict[str, float]:
    """One burst through ``senders`` sender workers; the figures."""
    receivers.reset()
    cluster = Cluster(_layout(senders), engine)
    with open(cluster.config_path) as f:
        config = yaml.safe_load(f)
    config["listeners"][0]["resources"] += ["federation", "keys"]
    config["federation_sender_instances"] = [f"sender{i + 1}" for i in range(senders)]
    config["federation"] = {"destinations": dict(receivers.urls)}
    with open(cluster.config_path, "w") as f:
        yaml.safe_dump(config, f)
    cluster.start()
    try:
        base = cluster.url("main")
        register = await _client(
            "POST",
            base + "/_matrix/client/v3/register",
            None,
            {"username": "alice", "password": "pw-alice-1", "auth": {"type": "m.login.dummy"}},
        )
        token = register["access_token"]
        room = await _client(
            "POST", base + "/_matrix/client/v3/createRoom", token, {"preset": "public_chat"}
        )
        room_id = room["room_id"]
        await receivers.join(base, room_id)
        pids = [cluster.processes[f"sender{i + 1}"].pid for i in range(senders)]
        # Let the joins' own traffic settle before measuring.
        await task.deferLater(_reactor, 1.0, lambda: None)
        cpu_before = sum(process_cpu_seconds(p) for p in pids)
        expected: set[str] = set()
        started = time.monotonic()
        semaphore = defer.DeferredSemaphore(16)
        quoted = urllib.parse.quote(room_id)

        async def send(n: int) -> None:
            answer = await _client(
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
    finally:
        cluster.stop()


async def main_async(args: argparse.Namespace) -> int:
    receivers = Receivers(args.servers)
    results: dict[int, dict[str, float]] = {}
    try:
        for senders in args.senders:
            results[senders] = await run_layout(senders, receivers, args.events, args.engine)
            print(f"{senders} sender(s): {json.dumps(results[senders])}", flush=True)
    finally:
        for port in receivers.ports:
            await port.stopListening()
    base = results[args.senders[0]]
    print()
    print(
        f"Burst: {args.events} events, one room, {args.servers} remote servers"
        f" ({args.engine}; ratios vs {args.senders[0]} sender(s) of this run)"
    )
    print(
        f"{'senders':>7} {'all delivered s':>15} {'client sent s':>13} {'lag s':>6}"
        f" {'txns':>6} {'PDUs/txn':>8} {'dup':>4} {'CPU us/PDU/dest':>15} {'ratio time':>10}"
        f" {'ratio CPU':>9}"
    )
    for senders, r in results.items():
        print(
            f"{senders:>7} {r['delivered_s']:>15.1f} {r['sent_s']:>13.1f} {r['lag_s']:>6.1f}"
            f" {int(r['transactions']):>6} {r['pdus_per_txn']:>8.1f} {int(r['duplicates']):>4}"
            f" {r['cpu_us_per_pdu_dest']:>15.1f}"
            f" {r['delivered_s'] / base['delivered_s']:>10.2f}"
            f" {r['cpu_us_per_pdu_dest'] / base['cpu_us_per_pdu_dest']:>9.2f}"
        )
    worst = max(r["delivered_s"] for r in results.values())
    print(f"target <= 60 s: {'met' if worst <= 60 else 'NOT met'} (slowest {worst:.1f} s)")
    print("Synapse's federation sender: not run in this benchmark (see docs/scaling.md).")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=4500)
    parser.add_argument("--servers", type=int, default=20)
    parser.add_argument(
        "--senders", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4]
    )
    parser.add_argument("--engine", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args(argv)
    code: list[int] = []

    async def run() -> None:
        code.append(await main_async(args))

    d = defer.ensureDeferred(run())

    def failed(failure: Failure) -> None:
        failure.printTraceback()
        code.append(1)

    d.addErrback(failed)
    d.addBoth(lambda _: _reactor.stop())
    _reactor.run()
    return code[0] if code else 1


if __name__ == "__main__":
    raise SystemExit(main())
