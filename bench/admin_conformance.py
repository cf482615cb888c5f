"""The admin UI's calls, checked against a running server: ``python -m
bench.admin_conformance --base-url URL --user NAME --password PW``.

Makes, in one scripted run, every call the admin UI Ketesa (formerly
synapse-admin; its ``src/providers/data/synapse.ts``, ``synapse-actions.ts``,
``auth/index.ts`` and ``matrix.ts`` at commit cf66c8e, May 2026) makes on its
pages: login, users list and detail (and their tabs and actions), rooms list
and detail, media, event reports, registration tokens, server notices,
statistics, federation, scheduled tasks. Each answer's status and shape
(the keys and types the UI reads) are checked; the run prints one line a
call: ``ok``, ``shape`` (answered, but not as the UI reads it), ``status``
(an unexpected status) or ``not served`` (404 ``M_UNRECOGNIZED``: an
endpoint this server does not have), and a summary. With ``--strict`` it
exits 1 when a served endpoint answered other than expected.

The run creates what it reads (a user, a room with a message and a report,
an upload, a registration token) and cleans up after itself where the UI
would (the room is deleted, the user deactivated). The admin user must
exist (``synapse-lite register-user --admin``). Server notices need
``server_notices`` configured: otherwise their call answers 400, reported
as ``status``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attr

#: ``(status, JSON body or None)`` of one request: ``token`` None for none,
#: ``raw`` a non-JSON body (an upload) sent with ``content_type``.
Caller = Callable[..., Awaitable[tuple[int, Any]]]


class _Nullable:
    """A value of ``spec``, or null."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec


def optional(spec: Any) -> _Nullable:
    return _Nullable(spec)


NUMBER = (int, float)
FLAG = (bool, int)
ANY = object


def shape_problems(value: Any, spec: Any, where: str = "") -> list[str]:
    """What in ``value`` does not match ``spec``: a type (or a tuple of
    them), ``optional(spec)``, ``{key: spec}`` (those keys required, others
    allowed), or ``[spec]`` (a list whose items match; the first 5 read)."""
    if isinstance(spec, _Nullable):
        return [] if value is None else shape_problems(value, spec.spec, where)
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return [f"{where or 'body'}: an object expected, got {type(value).__name__}"]
        problems = []
        for key, inner in spec.items():
            if key not in value:
                problems.append(f"{where}.{key}: missing")
            else:
                problems += shape_problems(value[key], inner, f"{where}.{key}")
        return problems
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{where or 'body'}: a list expected, got {type(value).__name__}"]
        return [
            p
            for i, item in enumerate(value[:5])
            for p in shape_problems(item, spec[0], f"{where}[{i}]")
        ]
    if spec is ANY:
        return []
    types = spec if isinstance(spec, tuple) else (spec,)
    # A bool is an int in Python: only accepted where a flag may be either.
    if isinstance(value, bool) and bool not in types:
        return [f"{where}: {types[0].__name__} expected, got bool"]
    if not isinstance(value, types):
        return [f"{where}: {types[0].__name__} expected, got {type(value).__name__}"]
    return []


# The shapes the UI reads (the fields its lists, pages and actions use).
USER = {"name": str, "admin": FLAG, "deactivated": FLAG, "is_guest": FLAG, "creation_ts": int}
USER_DETAIL = {
    **USER,
    "displayname": optional(str),
    "avatar_url": optional(str),
    "threepids": list,
    "external_ids": list,
    "shadow_banned": FLAG,
    "suspended": FLAG,
    "locked": FLAG,
}
ROOM = {
    "room_id": str,
    "name": optional(str),
    "canonical_alias": optional(str),
    "joined_members": int,
    "joined_local_members": int,
    "version": str,
    "creator": optional(str),
    "encryption": optional(str),
    "federatable": FLAG,
    "public": FLAG,
    "join_rules": optional(str),
    "guest_access": optional(str),
    "history_visibility": optional(str),
    "state_events": int,
}
REPORT = {
    "id": int,
    "received_ts": int,
    "room_id": str,
    "event_id": str,
    "user_id": str,
    "sender": str,
    "reason": optional(str),
    "name": optional(str),
    "canonical_alias": optional(str),
}
TOKEN = {
    "token": str,
    "uses_allowed": optional(int),
    "pending": int,
    "completed": int,
    "expiry_time": optional(int),
}
MEDIA = {
    "media_id": str,
    "media_type": optional(str),
    "media_length": optional(int),
    "upload_name": optional(str),
    "created_ts": int,
    "quarantined_by": optional(str),
    "safe_from_quarantine": FLAG,
}
DESTINATION = {
    "destination": str,
    "retry_last_ts": int,
    "retry_interval": int,
    "failure_ts": optional(int),
    "last_successful_stream_ordering": optional(int),
}
EVENT = {"event_id": str, "type": str, "sender": str, "origin_server_ts": int, "content": dict}
TASK_STATUS = {"status": str}


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Call:
    """One call the UI makes: on ``page``, ``method`` ``path`` (formatted
    with the run's context) as ``who`` (``admin``, ``user``, or ``none``:
    no token), expecting one of ``statuses`` and ``shape``; ``save`` keeps
    what later calls need."""

    page: str
    method: str
    path: str
    body: Any = None
    shape: Any = ANY
    statuses: tuple[int, ...] = (200,)
    who: str = "admin"
    save: Callable[[dict[str, Any], Any], None] | None = None
    raw: bytes | None = None
    #: Asked again (as the UI polls a job's status) until this holds of
    #: the answer, for at most :data:`POLL_SECONDS`.
    until: Callable[[Any], bool] | None = None


#: How long a job's status is polled before the run goes on.
POLL_SECONDS = 20.0


def _finished(answer: Any) -> bool:
    return isinstance(answer, dict) and answer.get("status") in ("complete", "failed")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Outcome:
    call: Call
    path: str
    status: int
    verdict: str  # "ok", "shape", "status", "not served", "skipped"
    detail: str = ""


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _context_body(body: Any, context: Mapping[str, Any]) -> Any:
    if callable(body):
        return body(context)
    return body


def _set(key: str, pick: Callable[[Any], Any]) -> Callable[[dict[str, Any], Any], None]:
    def save(context: dict[str, Any], answer: Any) -> None:
        context[key] = pick(answer)

    return save


def ui_calls() -> list[Call]:
    """The calls, in the order a session in the UI makes them."""
    a = "/_synapse/admin"
    c = "/_matrix/client"
    user = "{user_q}"
    room = "{room_q}"
    return [
        # Login page.
        Call("login", "GET", c + "/versions", shape={"versions": [str]}, who="none"),
        Call("login", "GET", c + "/v3/login", shape={"flows": [{"type": str}]}, who="none"),
        Call("login", "GET", a + "/v1/server_version", shape={"server_version": str}, who="none"),
        Call("login", "GET", c + "/v3/account/whoami", shape={"user_id": str}),
        Call("login", "GET", c + "/v3/profile/{admin_q}", shape=dict),
        Call(
            "login",
            "GET",
            c + "/v3/user/{admin_q}/account_data/io.element.synapse.admin_client_config",
            statuses=(200, 404),
        ),
        # Users: create one, as the UI's form does, and log in as them to
        # make what the other pages list.
        Call(
            "users",
            "PUT",
            a + "/v2/users/" + user,
            body=lambda ctx: {"password": ctx["password"], "displayname": "Conformance"},
            shape=USER_DETAIL,
            statuses=(200, 201),
        ),
        Call(
            "users",
            "GET",
            a + "/v1/username_available?username={username}x",
            shape={"available": bool},
        ),
        Call(
            "users",
            "GET",
            a + "/v3/users?from=0&limit=10&guests=false&locked=false&suspended=false"
            "&order_by=name&dir=f",
            shape={"users": [USER], "total": int},
        ),
        Call(
            "users",
            "GET",
            a + "/v2/users?from=0&limit=10&name={username}&order_by=creation_ts&dir=b",
            shape={"users": [USER], "total": int},
        ),
        # Content made as the new user (not the UI's: what its pages read).
        Call(
            "setup",
            "POST",
            c + "/v3/login",
            body=lambda ctx: {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": ctx["user_id"]},
                "password": ctx["password"],
            },
            shape={"access_token": str},
            who="none",
            save=_set("user_token", lambda answer: answer["access_token"]),
        ),
        Call(
            "setup",
            "POST",
            c + "/v3/createRoom",
            body={"preset": "public_chat", "name": "Conformance room"},
            shape={"room_id": str},
            who="user",
            save=_set("room_id", lambda answer: answer["room_id"]),
        ),
        Call(
            "setup",
            "PUT",
            c + "/v3/rooms/" + room + "/send/m.room.message/{txn}",
            body={"msgtype": "m.text", "body": "reported"},
            shape={"event_id": str},
            who="user",
            save=_set("event_id", lambda answer: answer["event_id"]),
        ),
        Call(
            "setup",
            "POST",
            c + "/v3/rooms/" + room + "/report/{event_q}",
            body={"reason": "conformance", "score": -100},
            who="user",
        ),
        Call(
            "setup",
            "POST",
            "/_matrix/media/v3/upload?filename=conformance.txt",
            raw=b"conformance",
            shape={"content_uri": str},
            who="user",
            save=_set("media_id", lambda answer: answer["content_uri"].rsplit("/", 1)[1]),
        ),
        # A user's page and its tabs.
        Call("user", "GET", a + "/v2/users/" + user, shape=USER_DETAIL),
        Call(
            "user",
            "GET",
            a + "/v1/whois/" + user,
            shape={"user_id": str, "devices": dict},
        ),
        Call(
            "user",
            "GET",
            a + "/v2/users/" + user + "/devices?from=0&limit=10&order_by=id&dir=b",
            shape={"devices": [{"device_id": str, "user_id": str}], "total": int},
            save=_set("device_id", lambda answer: answer["devices"][0]["device_id"]),
        ),
        Call(
            "user",
            "GET",
            a + "/v1/users/" + user + "/pushers?from=0&limit=10&order_by=id&dir=b",
            shape={"pushers": list, "total": int},
        ),
        Call(
            "user",
            "GET",
            a + "/v1/users/" + user + "/joined_rooms?from=0&limit=10&order_by=id&dir=b",
            shape={"joined_rooms": [str], "total": int},
        ),
        Call(
            "user",
            "GET",
            a + "/v1/users/" + user + "/memberships?from=0&limit=10&order_by=id&dir=b",
            shape={"memberships": dict, "total": int},
        ),
        Call(
            "user",
            "GET",
            a + "/v1/users/" + user + "/media?from=0&limit=10&order_by=created_ts&dir=b",
            shape={"media": [MEDIA], "total": int},
        ),
        Call("user", "GET", a + "/v1/users/" + user + "/override_ratelimit", shape=dict),
        Call(
            "user",
            "GET",
            a + "/v1/experimental_features/" + user,
            shape={"features": dict},
        ),
        Call(
            "user",
            "GET",
            a + "/v1/users/" + user + "/accountdata",
            shape={"account_data": {"global": dict, "rooms": dict}},
        ),
        Call(
            "user",
            "GET",
            a + "/v1/users/" + user + "/sent_invite_count?from_ts=0",
            shape={"invite_count": int},
        ),
        Call(
            "user",
            "GET",
            a + "/v1/users/" + user + "/cumulative_joined_room_count?from_ts=0",
            shape={"cumulative_joined_room_count": int},
        ),
        # A user's actions.
        Call(
            "user actions",
            "POST",
            a + "/v1/users/" + user + "/override_ratelimit",
            body={"messages_per_second": 0, "burst_count": 0},
            shape={"messages_per_second": int, "burst_count": int},
        ),
        Call("user actions", "DELETE", a + "/v1/users/" + user + "/override_ratelimit"),
        Call("user actions", "POST", a + "/v1/users/" + user + "/shadow_ban", body={}),
        Call("user actions", "DELETE", a + "/v1/users/" + user + "/shadow_ban"),
        Call("user actions", "PUT", a + "/v1/suspend/" + user, body={"suspend": True}),
        Call("user actions", "PUT", a + "/v1/suspend/" + user, body={"suspend": False}),
        Call(
            "user actions",
            "POST",
            a + "/v1/users/" + user + "/login",
            body={},
            shape={"access_token": str},
        ),
        Call(
            "user actions",
            "PUT",
            a + "/v2/users/" + user + "/devices/{device_q}",
            body={"display_name": "renamed"},
        ),
        Call(
            "user actions",
            "POST",
            a + "/v2/users/" + user + "/devices",
            body={"device_id": "CONFORMANCE"},
            statuses=(200, 201),
        ),
        Call(
            "user actions",
            "POST",
            a + "/v2/users/" + user + "/delete_devices",
            body={"devices": ["CONFORMANCE"]},
        ),
        Call(
            "user actions",
            "POST",
            a + "/v1/users/" + user + "/_allow_cross_signing_replacement_without_uia",
            body={},
            shape={"updatable_without_uia_before_ms": optional(int)},
        ),
        Call(
            "user actions",
            "POST",
            a + "/v1/send_server_notice",
            body=lambda ctx: {
                "user_id": ctx["user_id"],
                "content": {"msgtype": "m.text", "body": "conformance"},
            },
            shape={"event_id": str},
        ),
        Call(
            "user actions",
            "GET",
            a + "/v1/threepid/email/users/nobody%40example.org",
            statuses=(404,),
        ),
        Call(
            "user actions",
            "GET",
            a + "/v1/auth_providers/oidc/users/nobody",
            statuses=(404,),
        ),
        # Rooms list and a room's page and tabs.
        Call(
            "rooms",
            "GET",
            a + "/v1/rooms?from=0&limit=10&order_by=name&dir=f",
            shape={"rooms": [ROOM], "total_rooms": int, "offset": int},
        ),
        Call(
            "rooms",
            "GET",
            a + "/v1/rooms?from=0&limit=10&order_by=joined_members&dir=b&search_term=Conformance",
            shape={"rooms": [ROOM], "total_rooms": int},
        ),
        Call("room", "GET", a + "/v1/rooms/" + room, shape={**ROOM, "topic": optional(str)}),
        Call(
            "room",
            "GET",
            a + "/v1/rooms/" + room + "/members?from=0&limit=10&order_by=id&dir=b",
            shape={"members": [str], "total": int},
        ),
        Call(
            "room",
            "GET",
            a + "/v1/rooms/" + room + "/state?from=0&limit=10&order_by=id&dir=b",
            shape={"state": [{"type": str, "event_id": str, "sender": str}]},
        ),
        Call(
            "room",
            "GET",
            a + "/v1/room/" + room + "/media?from=0&limit=10&order_by=id&dir=b",
            shape={"local": [str], "remote": [str], "total": int},
        ),
        Call(
            "room",
            "GET",
            a + "/v1/rooms/" + room + "/forward_extremities?from=0&limit=10&order_by=id&dir=b",
            shape={"count": int, "results": [{"event_id": str, "depth": int}]},
        ),
        Call("room", "GET", a + "/v1/rooms/" + room + "/block", shape={"block": bool}),
        Call(
            "room",
            "GET",
            a + "/v1/rooms/" + room + "/messages?dir=b&limit=20",
            shape={"chunk": [EVENT], "start": str},
        ),
        Call(
            "room",
            "GET",
            a + "/v1/rooms/" + room + "/timestamp_to_event?ts={now}&dir=b",
            shape={"event_id": str, "origin_server_ts": int},
        ),
        Call(
            "room",
            "GET",
            a + "/v1/rooms/" + room + "/context/{event_q}?limit=10",
            shape={"event": EVENT, "events_before": [EVENT], "events_after": list},
        ),
        Call(
            "room",
            "GET",
            a + "/v1/rooms/" + room + "/hierarchy",
            shape={"rooms": [{"room_id": str}]},
        ),
        Call("room", "GET", a + "/v1/fetch_event/{event_q}", shape={"event": EVENT}),
        Call(
            "room directory",
            "GET",
            c + "/v3/publicRooms",
            shape={"chunk": [{"room_id": str}]},
        ),
        Call(
            "room directory",
            "PUT",
            c + "/v3/directory/list/room/" + room,
            body={"visibility": "public"},
        ),
        # A room's actions.
        Call(
            "room actions",
            "POST",
            a + "/v1/join/" + room,
            body=lambda ctx: {"user_id": ctx["admin_id"]},
            shape={"room_id": str},
        ),
        Call("room actions", "POST", a + "/v1/rooms/" + room + "/make_room_admin", body={}),
        Call(
            "room actions",
            "DELETE",
            a + "/v1/rooms/" + room + "/forward_extremities",
            shape={"deleted": int},
        ),
        Call(
            "room actions",
            "POST",
            a + "/v1/purge_history/" + room,
            body=lambda ctx: {"purge_up_to_ts": ctx["now"], "delete_local_events": False},
            shape={"purge_id": str},
            save=_set("purge_id", lambda answer: answer["purge_id"]),
        ),
        Call(
            "room actions",
            "GET",
            a + "/v1/purge_history_status/{purge_id}",
            shape=TASK_STATUS,
            until=_finished,
        ),
        # Media.
        Call("media", "POST", a + "/v1/media/protect/{media_id}", body={}),
        Call("media", "POST", a + "/v1/media/unprotect/{media_id}", body={}),
        Call("media", "POST", a + "/v1/media/quarantine/{server_name}/{media_id}", body={}),
        Call("media", "POST", a + "/v1/media/unquarantine/{server_name}/{media_id}", body={}),
        Call(
            "media",
            "POST",
            a + "/v1/room/" + room + "/media/quarantine",
            body={},
            shape={"num_quarantined": int},
        ),
        Call(
            "media",
            "POST",
            a + "/v1/user/" + user + "/media/quarantine",
            body={},
            shape={"num_quarantined": int},
        ),
        Call(
            "media",
            "POST",
            a + "/v1/media/delete?before_ts=1&size_gt=0&keep_profiles=true",
            shape={"deleted_media": list, "total": int},
        ),
        Call(
            "media",
            "POST",
            a + "/v1/purge_media_cache?before_ts={now}",
            shape={"deleted": int},
        ),
        Call(
            "media",
            "DELETE",
            a + "/v1/media/{server_name}/{media_id}",
            shape={"deleted_media": [str], "total": int},
        ),
        Call(
            "media",
            "DELETE",
            a + "/v1/users/" + user + "/media",
            shape={"deleted_media": list, "total": int},
        ),
        # Event reports.
        Call(
            "reports",
            "GET",
            a + "/v1/event_reports?from=0&limit=10&order_by=received_ts&dir=b",
            shape={"event_reports": [REPORT], "total": int},
            save=_set("report_id", lambda answer: answer["event_reports"][0]["id"]),
        ),
        Call(
            "reports",
            "GET",
            a + "/v1/event_reports/{report_id}",
            shape={**REPORT, "event_json": dict},
        ),
        Call("reports", "DELETE", a + "/v1/event_reports/{report_id}"),
        # Registration tokens.
        Call(
            "registration tokens",
            "GET",
            a + "/v1/registration_tokens",
            shape={"registration_tokens": [TOKEN]},
        ),
        Call(
            "registration tokens",
            "POST",
            a + "/v1/registration_tokens/new",
            body={"length": 16, "uses_allowed": 5},
            shape=TOKEN,
            save=_set("token", lambda answer: answer["token"]),
        ),
        Call("registration tokens", "GET", a + "/v1/registration_tokens/{token}", shape=TOKEN),
        Call(
            "registration tokens",
            "PUT",
            a + "/v1/registration_tokens/{token}",
            body={"uses_allowed": 10},
            shape=TOKEN,
        ),
        Call("registration tokens", "DELETE", a + "/v1/registration_tokens/{token}"),
        # Statistics, federation, scheduled tasks.
        Call(
            "statistics",
            "GET",
            a + "/v1/statistics/users/media?from=0&limit=10&order_by=media_length&dir=b",
            shape={
                "users": [{"user_id": str, "media_count": int, "media_length": int}],
                "total": int,
            },
        ),
        Call(
            "statistics",
            "GET",
            a + "/v1/statistics/database/rooms",
            shape={"rooms": [{"room_id": str, "estimated_size": int}]},
        ),
        Call(
            "federation",
            "GET",
            a + "/v1/federation/destinations?from=0&limit=10&order_by=destination&dir=f",
            shape={"destinations": [DESTINATION], "total": int},
        ),
        Call(
            "federation",
            "GET",
            a + "/v1/federation/destinations/conformance.invalid",
            statuses=(404,),
        ),
        Call(
            "federation",
            "GET",
            a + "/v1/federation/destinations/conformance.invalid/rooms",
            statuses=(404,),
        ),
        Call(
            "scheduled tasks",
            "GET",
            a + "/v1/scheduled_tasks",
            shape={
                "scheduled_tasks": [{"id": str, "action": str, "status": str, "timestamp_ms": int}]
            },
        ),
        # The user's last actions: redact, reset the password, deactivate;
        # the room deleted.
        Call(
            "user actions",
            "POST",
            a + "/v1/user/" + user + "/redact",
            body={"rooms": []},
            shape={"redact_id": str},
            save=_set("redact_id", lambda answer: answer["redact_id"]),
        ),
        Call(
            "user actions",
            "GET",
            a + "/v1/user/redact_status/{redact_id}",
            shape={"status": str, "failed_redactions": dict},
            until=_finished,
        ),
        Call(
            "user actions",
            "POST",
            a + "/v1/reset_password/" + user,
            body={"new_password": "another-Passw0rd", "logout_devices": True},
        ),
        Call(
            "room actions",
            "DELETE",
            a + "/v2/rooms/" + room,
            body={"block": False, "purge": True},
            shape={"delete_id": str},
            save=_set("delete_id", lambda answer: answer["delete_id"]),
        ),
        Call(
            "room actions",
            "GET",
            a + "/v2/rooms/delete_status/{delete_id}",
            shape={"delete_id": str, "status": str},
            until=_finished,
        ),
        Call(
            "users",
            "POST",
            a + "/v1/deactivate/" + user,
            body={"erase": True},
            shape={"id_server_unbind_result": str},
        ),
    ]


class _Missing(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        raise KeyError(key)


async def run(
    caller: Caller,
    admin_token: str,
    admin_id: str,
    server_name: str,
    sleep: Callable[[float], Awaitable[None]],
) -> list[Outcome]:
    """Make every call of :func:`ui_calls` (see the module docstring);
    ``sleep(seconds)`` waits between two polls of a job's status."""
    username = "conformance" + uuid.uuid4().hex[:8]
    user_id = f"@{username}:{server_name}"
    context: dict[str, Any] = {
        "admin_id": admin_id,
        "admin_q": q(admin_id),
        "username": username,
        "user_id": user_id,
        "user_q": q(user_id),
        "password": "Conformance-" + uuid.uuid4().hex,
        "server_name": server_name,
        "now": int(time.time() * 1000),
        "txn": uuid.uuid4().hex,
    }
    outcomes = []
    for call in ui_calls():
        context["now"] = int(time.time() * 1000)
        # Ids saved by earlier calls, quoted for paths.
        for key in ("room_id", "event_id", "device_id"):
            if key in context:
                context[key.split("_")[0] + "_q"] = q(str(context[key]))
        try:
            path = call.path.format_map(_Missing(context))
        except KeyError as e:
            outcomes.append(Outcome(call, call.path, 0, "skipped", f"needs {e.args[0]}"))
            continue
        token = {"admin": admin_token, "user": context.get("user_token"), "none": None}[call.who]
        body = _context_body(call.body, context)
        status, answer = await caller(call.method, path, body=body, token=token, raw=call.raw)
        deadline = time.monotonic() + POLL_SECONDS
        while call.until is not None and status == 200 and not call.until(answer):
            if time.monotonic() > deadline:
                break
            await sleep(0.05)
            status, answer = await caller(call.method, path, body=body, token=token)
        outcomes.append(judge(call, path, status, answer))
        if call.save is not None and outcomes[-1].verdict == "ok":
            call.save(context, answer)
    return outcomes


def judge(call: Call, path: str, status: int, answer: Any) -> Outcome:
    if status not in call.statuses:
        errcode = answer.get("errcode") if isinstance(answer, dict) else None
        if (
            status in (404, 405)
            and errcode in ("M_UNRECOGNIZED", None)
            and 404 not in call.statuses
        ):
            return Outcome(call, path, status, "not served")
        return Outcome(call, path, status, "status", json.dumps(answer)[:200])
    if status >= 400:
        return Outcome(call, path, status, "ok")
    problems = shape_problems(answer, call.shape)
    if problems:
        return Outcome(call, path, status, "shape", "; ".join(problems[:4]))
    return Outcome(call, path, status, "ok")


def report(outcomes: list[Outcome]) -> str:
    """One line a call, then the summary."""
    lines = []
    for o in outcomes:
        method_path = f"{o.call.method} {o.path.split('?')[0]}"
        detail = f"  ({o.detail})" if o.detail else ""
        lines.append(f"{o.verdict:<10} {o.status:>3} {o.call.page:<20} {method_path}{detail}")
    counts = {
        v: sum(o.verdict == v for o in outcomes)
        for v in ("ok", "shape", "status", "not served", "skipped")
    }
    lines.append(
        "conformance: "
        + ", ".join(f"{n} {verdict}" for verdict, n in counts.items())
        + f" of {len(outcomes)} calls"
    )
    return "\n".join(lines)


def aiohttp_caller(session: Any, base_url: str) -> Caller:
    """A :data:`Caller` over an ``aiohttp.ClientSession``."""

    async def call(
        method: str, path: str, body: Any = None, token: str | None = None, raw: bytes | None = None
    ) -> tuple[int, Any]:
        headers = {"Content-Type": "text/plain" if raw is not None else "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        async with session.request(method, base_url + path, data=data, headers=headers) as response:
            text = await response.read()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, None

    return call


async def _main(args: argparse.Namespace) -> int:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        caller = aiohttp_caller(session, args.base_url.rstrip("/"))
        token = args.token
        if token is None:
            status, login = await caller(
                "POST",
                "/_matrix/client/v3/login",
                body={
                    "type": "m.login.password",
                    "identifier": {"type": "m.id.user", "user": args.user},
                    "password": args.password,
                },
            )
            if status != 200:
                print(f"login failed: {status} {login}", file=sys.stderr)
                return 2
            token = login["access_token"]
        status, whoami = await caller("GET", "/_matrix/client/v3/account/whoami", token=token)
        if status != 200:
            print(f"whoami failed: {status} {whoami}", file=sys.stderr)
            return 2
        admin_id = whoami["user_id"]
        outcomes = await run(caller, token, admin_id, admin_id.split(":", 1)[1], asyncio.sleep)
    print(report(outcomes))
    bad = [o for o in outcomes if o.verdict in ("shape", "status")]
    return 1 if args.strict and bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8008")
    parser.add_argument("--user", help="an admin's user name or id (with --password)")
    parser.add_argument("--password")
    parser.add_argument("--token", help="an admin's access token (instead of logging in)")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when a served endpoint answers other than the UI expects",
    )
    args = parser.parse_args(argv)
    if args.token is None and (args.user is None or args.password is None):
        parser.error("give --token, or --user and --password")
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
