"""Steady client load over HTTP, and what it saw: shared by ``tests/e2e/test_faults.py`` and
``bench/soak.py``.

A :class:`LoadRun` has ``senders`` loops sending messages (each retrying a
failed send with the same transaction id until it is acknowledged, as a Matrix
client does) and one /sync long-poll loop per member. Every request has a
client-side timeout, so a server that hangs shows up as an error, not as a
stuck run. ``tests/harness/delivery.py`` then compares what the database holds with
what each member's /sync returned.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections import Counter
from typing import Any

import attr
import treq
from twisted.internet import defer, reactor, task
from twisted.web.client import HTTPConnectionPool

#: Client timeouts: a request that takes longer counts as a hang the client saw.
SEND_TIMEOUT_SECONDS = 10.0
LONG_POLL_MS = 2_000
SYNC_TIMEOUT_SECONDS = LONG_POLL_MS / 1000 + 8.0
#: A client's pause before retrying after an error, so a dead server is not hammered.
RETRY_PAUSE_SECONDS = 0.25
#: Above any backlog a run builds up: a limited timeline would need /messages,
#: which these clients do not do, and would look like loss.
WIDE_FILTER = urllib.parse.quote(json.dumps({"room": {"timeline": {"limit": 2000}}}))


class ClientError(Exception):
    """A request that did not return 200; ``kind`` says how (for the tally)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind} {detail}".strip())
        self.kind = kind


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Member:
    """A registered user, the device it logged in with and its access token."""

    user_id: str
    token: str


class HttpClient:
    """JSON over HTTP with a per-request timeout. Connections are not reused:
    a reused connection to a process that was killed would turn one fault into
    a burst of errors that only this client's pooling causes."""

    def __init__(self) -> None:
        self._pool = HTTPConnectionPool(reactor, persistent=False)

    async def call(
        self,
        method: str,
        url: str,
        token: str | None = None,
        body: Any = None,
        timeout: float = SEND_TIMEOUT_SECONDS,
    ) -> Any:
        headers: dict[bytes | str, list[bytes | str]] = (
            {"Authorization": [f"Bearer {token}"]} if token else {}
        )
        data = None if body is None else json.dumps(body).encode()
        started = time.monotonic()
        try:
            response = await treq.request(
                method, url, data=data, headers=headers, timeout=timeout, pool=self._pool
            )
            content = await treq.content(response)
        except Exception as e:  # refused, reset, cancelled by the timeout
            # treq reports its own timeout as a cancelled request, wrapped or
            # not depending on the stage it cancelled: tell it by the clock.
            if time.monotonic() - started >= timeout:
                raise ClientError("timeout") from None
            raise ClientError("connection", type(e).__name__) from None
        if response.code != 200:
            raise ClientError(str(response.code), content[:200].decode(errors="replace"))
        return json.loads(content)

    async def close(self) -> None:
        """Close idle connections (there are none to keep: a test must end clean)."""
        await self._pool.closeCachedConnections()


def client_url(base: str, path: str) -> str:
    """The URL of a client API ``path`` on the process at ``base``."""
    return f"{base}/_matrix/client/v3{path}"


async def register(client: HttpClient, base: str, name: str) -> Member:
    """Register ``name`` (open registration, dummy auth) on ``base``."""
    body = {"username": name, "password": "load-pw", "auth": {"type": "m.login.dummy"}}
    result = await client.call("POST", client_url(base, "/register"), body=body)
    return Member(result["user_id"], result["access_token"])


async def create_room(client: HttpClient, base: str, members: list[Member], name: str) -> str:
    """A public room made by the first member and joined by the others."""
    url = client_url(base, "/createRoom")
    body = {"preset": "public_chat", "name": name}
    room_id = str((await client.call("POST", url, members[0].token, body))["room_id"])
    for member in members[1:]:
        await client.call("POST", client_url(base, f"/join/{room_id}"), member.token, {})
    return room_id


async def setup_members_and_rooms(
    client: HttpClient, base: str, users: int, rooms: int, prefix: str = "load"
) -> tuple[list[Member], list[str]]:
    """``users`` new users, all joined to ``rooms`` new public rooms."""
    members = [await register(client, base, f"{prefix}{i}") for i in range(users)]
    room_ids = [
        await create_room(client, base, members, f"{prefix} room {i}") for i in range(rooms)
    ]
    return members, room_ids


async def sleep(seconds: float) -> None:
    """Let the reactor run for ``seconds``."""
    await task.deferLater(reactor, seconds, lambda: None)


@attr.s(slots=True, auto_attribs=True)
class Ack:
    """A send the server acknowledged (200)."""

    event_id: str
    room_id: str
    body: str
    acked_at: float
    #: when the first attempt to send it began (retries included in between)
    first_try_at: float


class LoadRun:
    """Senders and /sync readers against a running layout.

    Message bodies are ``<tag> s<sender> n<seq>``: the tag keeps runs on the
    same rooms apart, and the sender and sequence number let the check see
    each sender's order. Times are ``time.monotonic()``.
    """

    def __init__(
        self,
        client: HttpClient,
        members: list[Member],
        rooms: list[str],
        send_bases: list[str],
        sync_bases: list[str],
        tag: str,
        senders: int = 4,
        send_pause: float = 0.1,
    ) -> None:
        self.client = client
        self.members = members
        self.rooms = rooms
        self.send_bases = send_bases
        self.sync_bases = sync_bases
        self.tag = tag
        self.senders = senders
        self.send_pause = send_pause
        self.acks: dict[str, Ack] = {}
        #: member -> (room, event id, when its /sync returned it), in arrival order
        self.received: dict[str, list[tuple[str, str, float]]] = {m.user_id: [] for m in members}
        #: (who: "send"/"sync", kind) -> count, and when each error happened
        self.errors: Counter[tuple[str, str]] = Counter()
        self.error_times: list[float] = []
        #: "send"/"sync"/"typing" -> when each request of that kind succeeded
        self.ok_times: dict[str, list[float]] = {"send": [], "sync": [], "typing": []}
        #: the typist's state as last acknowledged, and when
        self.typing_acked: tuple[bool, float] | None = None
        #: member -> (when, is the typist typing) for each m.typing its /sync returned
        self.typing_seen: dict[str, list[tuple[float, bool]]] = {m.user_id: [] for m in members}
        self._sending = True
        self._reading = True
        self._senders: list[defer.Deferred[None]] = []
        self._readers: list[defer.Deferred[None]] = []

    def _error(self, who: str, error: ClientError) -> None:
        self.errors[(who, error.kind)] += 1
        self.error_times.append(time.monotonic())

    async def start(self) -> None:
        """Take each member's current /sync position, then start the loops."""
        starts = {}
        for i, member in enumerate(self.members):
            starts[member.user_id] = await self._initial_token(i, member)
        for i, member in enumerate(self.members):
            d = defer.ensureDeferred(self._reader(i, member, starts[member.user_id]))
            self._readers.append(d)
        for i in range(self.senders):
            self._senders.append(defer.ensureDeferred(self._sender(i)))
        self._senders.append(defer.ensureDeferred(self._typist()))

    async def _initial_token(self, index: int, member: Member) -> str:
        base = self.sync_bases[index % len(self.sync_bases)]
        url = client_url(base, "/sync?timeout=0&filter=" + WIDE_FILTER)
        deadline = time.monotonic() + 30
        while True:
            try:
                result = await self.client.call("GET", url, member.token)
                return str(result["next_batch"])
            except ClientError:
                if time.monotonic() > deadline:
                    raise
                await sleep(RETRY_PAUSE_SECONDS)

    async def _sender(self, index: int) -> None:
        member = self.members[index % len(self.members)]
        base = self.send_bases[index % len(self.send_bases)]
        seq = 0
        while self._sending:
            room = self.rooms[(index + seq) % len(self.rooms)]
            body = f"{self.tag} s{index} n{seq}"
            txn = f"{self.tag}-s{index}-n{seq}"
            path = f"/rooms/{room}/send/m.room.message/{txn}"
            # The same transaction id on every retry: the server must answer
            # a repeat with the first event, never persist a second one.
            # Retry even after the run stops sending (bounded), so a send
            # that may have been persisted is not left unresolved.
            give_up = None
            first_try_at = time.monotonic()
            while True:
                try:
                    result = await self.client.call(
                        "PUT", client_url(base, path), member.token,
                        {"msgtype": "m.text", "body": body}, SEND_TIMEOUT_SECONDS,
                    )  # fmt: skip
                except ClientError as e:
                    self._error("send", e)
                    if not self._sending:
                        give_up = give_up or time.monotonic() + 2 * SEND_TIMEOUT_SECONDS
                        if time.monotonic() > give_up:
                            return
                    await sleep(RETRY_PAUSE_SECONDS)
                    continue
                now = time.monotonic()
                self.ok_times["send"].append(now)
                self.acks[result["event_id"]] = Ack(
                    result["event_id"], room, body, now, first_try_at
                )
                break
            seq += 1
            await sleep(self.send_pause)

    async def _typist(self) -> None:
        """One member toggles typing in the first room: typing goes through
        the typing writer, so its faults show up as typing errors."""
        member = self.members[0]
        path = f"/rooms/{self.rooms[0]}/typing/{member.user_id}"
        typing = True
        while self._sending:
            body = {"typing": typing, "timeout": 30_000}
            try:
                await self.client.call(
                    "PUT", client_url(self.send_bases[0], path), member.token, body
                )
                now = time.monotonic()
                self.ok_times["typing"].append(now)
                self.typing_acked = (typing, now)
                typing = not typing
            except ClientError as e:
                self._error("typing", e)
            await sleep(0.5)

    async def _reader(self, index: int, member: Member, since: str) -> None:
        base = self.sync_bases[index % len(self.sync_bases)]
        received = self.received[member.user_id]
        while self._reading:
            query = f"/sync?timeout={LONG_POLL_MS}&filter={WIDE_FILTER}&since={since}"
            try:
                result = await self.client.call(
                    "GET", client_url(base, query), member.token, None, SYNC_TIMEOUT_SECONDS
                )
            except ClientError as e:
                self._error("sync", e)
                await sleep(RETRY_PAUSE_SECONDS)
                continue
            now = time.monotonic()
            self.ok_times["sync"].append(now)
            for room_id, room in result.get("rooms", {}).get("join", {}).items():
                timeline = room.get("timeline", {})
                if timeline.get("limited"):
                    self._error("sync", ClientError("limited timeline"))
                for event in room.get("ephemeral", {}).get("events", []):
                    if room_id == self.rooms[0] and event.get("type") == "m.typing":
                        typing = self.members[0].user_id in event["content"]["user_ids"]
                        self.typing_seen[member.user_id].append((now, typing))
                for event in timeline.get("events", []):
                    body = event.get("content", {}).get("body", "")
                    if event.get("type") == "m.room.message" and body.startswith(self.tag + " "):
                        received.append((room_id, event["event_id"], now))
            since = result["next_batch"]

    def recovered_after(self, repaired_at: float) -> float | None:
        """Seconds from ``repaired_at`` until a send, a /sync and a typing
        request had each succeeded again; None if one never did."""
        firsts = []
        for times in self.ok_times.values():
            after = [t for t in times if t >= repaired_at]
            if not after:
                return None
            firsts.append(after[0] - repaired_at)
        return max(firsts)

    async def stop_sending(self) -> None:
        self._sending = False
        await defer.gatherResults(self._senders, consumeErrors=True)

    def typing_converged(self) -> bool:
        """Has every member's /sync shown the typist's last acknowledged state?"""
        if self.typing_acked is None:
            return False
        state, _ = self.typing_acked
        return all(seen and seen[-1][1] == state for seen in self.typing_seen.values())

    def delivered_to_all(self) -> bool:
        """Has every member's /sync returned every acknowledged event, and the
        typist's last typing state?"""
        if not self.typing_converged():
            return False
        for received in self.received.values():
            seen = {event_id for _, event_id, _ in received}
            if not self.acks.keys() <= seen:
                return False
        return True

    async def wait_delivered(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.delivered_to_all():
            if time.monotonic() > deadline:
                return False
            await sleep(0.05)
        return True

    async def stop(self) -> None:
        """Stop sending, then reading (readers finish their current long-poll)."""
        await self.stop_sending()
        self._reading = False
        await defer.gatherResults(self._readers, consumeErrors=True)
