"""What the client benchmark measures, against a running layout, over HTTP
(aiohttp): send throughput and latency with concurrent senders, /sync wake-up
latency, typing latency and initial-sync time."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import attr

_txn = itertools.count()
WIDE_TIMELINE = urllib.parse.quote(json.dumps({"room": {"timeline": {"limit": 500}}}))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@attr.s(auto_attribs=True)
class User:
    user_id: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


class Client:
    """One aiohttp session talking to a layout's processes."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def call(
        self, method: str, base: str, path: str, user: User | None = None, body: Any = None
    ) -> Any:
        url = f"{base}/_matrix/client/v3{path}"
        headers = user.headers if user else {}
        async with self.session.request(method, url, json=body, headers=headers) as response:
            result = await response.json()
            if response.status != 200:
                raise RuntimeError(f"{method} {path}: {response.status} {result}")
            return result

    async def register(self, base: str, name: str) -> User:
        result = await self.call(
            "POST",
            base,
            "/register",
            body={"username": name, "password": "bench-pw", "auth": {"type": "m.login.dummy"}},
        )
        return User(result["user_id"], result["access_token"])

    async def send(self, base: str, user: User, room_id: str, body: str) -> str:
        txn = f"{uuid.uuid4().hex}-{next(_txn)}"
        path = f"/rooms/{room_id}/send/m.room.message/{txn}"
        result = await self.call("PUT", base, path, user, {"msgtype": "m.text", "body": body})
        return str(result["event_id"])

    async def sync(
        self,
        base: str,
        user: User,
        since: str | None,
        timeout_ms: int = 30_000,
        wide: bool = True,
    ) -> dict[str, Any]:
        # A timeline limit above any backlog here: a limited timeline would
        # leave a gap to fill with /messages, which this client does not do.
        query = f"?timeout={timeout_ms}" + (f"&filter={WIDE_TIMELINE}" if wide else "")
        query += f"&since={since}" if since else ""
        result = dict(await self.call("GET", base, "/sync" + query, user))
        if since and any(
            room["timeline"].get("limited") for room in result["rooms"]["join"].values()
        ):
            raise RuntimeError("a /sync timeline was limited: raise the filter's limit")
        return result


def event_ids(sync: dict[str, Any]) -> list[str]:
    return [
        e["event_id"]
        for room in sync.get("rooms", {}).get("join", {}).values()
        for e in room.get("timeline", {}).get("events", [])
    ]


def typing_users(sync: dict[str, Any], room_id: str) -> list[str] | None:
    room = sync.get("rooms", {}).get("join", {}).get(room_id, {})
    for event in room.get("ephemeral", {}).get("events", []):
        if event["type"] == "m.typing":
            return list(event["content"]["user_ids"])
    return None


async def setup_users_and_rooms(
    client: Client, base: str, users: int, rooms: int, people: list[User] | None = None
) -> tuple[list[User], list[str]]:
    """``users`` new users (or ``people``, already registered) in ``rooms``
    new public rooms the first one created."""
    if people is None:
        people = [await client.register(base, f"user{i}") for i in range(users)]
    room_ids = []
    for i in range(rooms):
        result = await client.call(
            "POST", base, "/createRoom", people[0], {"preset": "public_chat", "name": f"r{i}"}
        )
        room_ids.append(result["room_id"])
        for person in people[1:]:
            await client.call("POST", base, f"/join/{result['room_id']}", person, {})
    return people, room_ids


@attr.s(auto_attribs=True)
class ThroughputResult:
    sent_per_second: float
    delivered_per_second: float
    latencies_ms: list[float]
    #: /sync requests the users' long polls made until every message was seen.
    syncs: int = 0
    #: Of ``syncs``, those made while the messages were being sent.
    syncs_during_sends: int = 0


#: How the users read /sync while ``measure_throughput`` sends: ``poll``, each
#: user long-polls (the client's natural behaviour: how many requests that
#: makes depends on how soon the server answers, so it differs between
#: trees); ``paced``, each user makes one /sync with ``timeout=0`` per
#: ``sync_every`` messages sent, so every tree answers the same number of
#: /sync requests per message; ``none``, no /sync at all until the last
#: message is sent (then the users long-poll until they have them all).
SYNC_MODES = ("poll", "paced", "none")


async def measure_throughput(
    client: Client,
    send_bases: list[str],
    sync_base: str,
    people: list[User],
    rooms: list[str],
    messages: int,
    senders: int,
    room_bases: dict[str, str] | None = None,
    sync_mode: str = "poll",
    sync_every: int = 25,
    on_sent: Callable[[], None] | None = None,
) -> ThroughputResult:
    """``senders`` concurrent senders (spread over the users and rooms) send
    ``messages`` in all; every user reads /sync as ``sync_mode`` says (one of
    ``SYNC_MODES``) and, once the last message is sent, long-polls until it has
    seen them all. Sends go round-robin over ``send_bases``, or with
    ``room_bases`` to the process given for each room. ``on_sent`` is called
    as soon as the last send is answered (e.g. to read the processes' CPU
    time of the sends alone)."""
    if sync_mode not in SYNC_MODES:
        raise ValueError(f"sync_mode {sync_mode!r}: one of {', '.join(SYNC_MODES)}")
    if sync_every < 1:
        raise ValueError(f"sync_every {sync_every}: at least 1")
    starts = {p.user_id: (await client.sync(sync_base, p, None, 0))["next_batch"] for p in people}
    expected: set[str] = set()
    #: user -> event id -> when their sync returned it
    seen: dict[str, dict[str, float]] = {p.user_id: {} for p in people}
    latencies: list[float] = []
    counter = itertools.count()
    syncs = 0
    answered = 0
    #: user -> one token per paced /sync still to make
    paced: dict[str, asyncio.Queue[None]] = {p.user_id: asyncio.Queue() for p in people}
    since = dict(starts)

    async def sender(index: int) -> None:
        nonlocal answered
        user = people[index % len(people)]
        base = send_bases[index % len(send_bases)]
        while (n := next(counter)) < messages:
            room = rooms[n % len(rooms)]
            start = time.perf_counter()
            target = room_bases[room] if room_bases else base
            expected.add(await client.send(target, user, room, f"bench {n}"))
            latencies.append((time.perf_counter() - start) * 1000)
            answered += 1
            if sync_mode == "paced" and answered % sync_every == 0:
                for queue in paced.values():
                    queue.put_nowait(None)

    async def one_sync(user: User, timeout_ms: int) -> None:
        nonlocal syncs
        result = await client.sync(sync_base, user, since[user.user_id], timeout_ms)
        syncs += 1
        now = time.perf_counter()
        since[user.user_id] = result["next_batch"]
        for event_id in event_ids(result):
            seen[user.user_id].setdefault(event_id, now)

    async def long_poller(user: User) -> None:
        while True:
            await one_sync(user, 5_000)

    async def paced_syncer(user: User) -> None:
        queue = paced[user.user_id]
        while True:
            await queue.get()
            await one_sync(user, 0)
            queue.task_done()

    during = {"poll": long_poller, "paced": paced_syncer, "none": None}[sync_mode]
    syncers = [asyncio.create_task(during(p)) for p in people] if during else []
    start = time.perf_counter()
    await asyncio.gather(*(sender(i) for i in range(senders)))
    sent_elapsed = time.perf_counter() - start
    if on_sent is not None:
        on_sent()
    if sync_mode == "paced":
        # Every paced /sync asked for is made, so each tree answers the same
        # number; then the long polls collect what is left.
        for queue in paced.values():
            await queue.join()
        for task in syncers:
            task.cancel()
    syncs_during_sends = syncs
    if sync_mode != "poll":
        syncers = [asyncio.create_task(long_poller(p)) for p in people]
    deadline = time.perf_counter() + 120
    while not all(expected <= seen[p.user_id].keys() for p in people):
        for task in syncers:
            if task.done():
                task.result()  # a syncer that stopped raised: show why
        if time.perf_counter() > deadline:
            missing = {p.user_id: len(expected - seen[p.user_id].keys()) for p in people}
            raise RuntimeError(f"messages never delivered, per user: {missing}")
        await asyncio.sleep(0.01)
    for task in syncers:
        task.cancel()
    delivered_elapsed = max(seen[p.user_id][e] for p in people for e in expected) - start
    return ThroughputResult(
        messages / sent_elapsed,
        messages / delivered_elapsed,
        latencies,
        syncs,
        syncs_during_sends,
    )


async def measure_wakeup(
    client: Client,
    send_base: str,
    sync_base: str,
    receiver: User,
    sender: User,
    room: str,
    rounds: int,
    typing: bool,
    send_ms: list[float] | None = None,
) -> list[float]:
    """Milliseconds from the sender's request (a message, or a typing change)
    to the receiver's parked /sync returning it; ``send_ms`` gets, per round,
    how long the sender's request itself took to be answered."""
    since = (await client.sync(sync_base, receiver, None, 0))["next_batch"]
    results = []
    for i in range(rounds):
        poll = asyncio.create_task(client.sync(sync_base, receiver, since, 30_000))
        await asyncio.sleep(0.02)  # let the long-poll park
        start = time.perf_counter()
        if typing:
            await client.call(
                "PUT",
                send_base,
                f"/rooms/{room}/typing/{sender.user_id}",
                sender,
                {"typing": i % 2 == 0, "timeout": 30_000},
            )
            want: Any = [sender.user_id] if i % 2 == 0 else []
        else:
            want = await client.send(send_base, sender, room, f"ping {i}")
        if send_ms is not None:
            send_ms.append((time.perf_counter() - start) * 1000)
        while True:
            result = await poll
            since = result["next_batch"]
            got = typing_users(result, room) == want if typing else want in event_ids(result)
            if got:
                results.append((time.perf_counter() - start) * 1000)
                break
            poll = asyncio.create_task(client.sync(sync_base, receiver, since, 30_000))
    return results


async def measure_initial_sync(client: Client, base: str, user: User, rounds: int) -> float:
    """Median milliseconds of a full /sync (no since, the default timeline
    limit of 10 events per room)."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        await client.sync(base, user, None, 0, wide=False)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)
