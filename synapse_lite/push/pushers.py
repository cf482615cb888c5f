"""Pushers: what ``POST /pushers/set`` may say, checked once, where it enters.

A pusher is identified by ``(app_id, pushkey, user_id)``. Kind ``http`` is the
only kind served (``email`` is refused); kind ``null`` removes the pusher.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import attr

from synapse_lite.api.content import check_content_size
from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.codec.kinds import (
    ABSENT,
    Bool,
    Checked,
    Custom,
    DecodeContext,
    FieldKind,
    JsonObject,
    LocalUserId,
    Nullable,
    Str,
    wire,
)

#: The spec's limits, and ours for the fields it leaves open.
MAX_APP_ID = 64
MAX_PUSHKEY_BYTES = 512
MAX_URL = 2048
MAX_TEXT = 255
#: The path every push gateway URL must have (Push Gateway API).
NOTIFY_PATH = "/_matrix/push/v1/notify"


class PusherText(FieldKind):
    """A string of 1 to ``limit`` characters without NUL (a pusher's names)."""

    def __init__(self, limit: int = MAX_TEXT) -> None:
        self._limit = limit

    def decode(self, value: Any, key: str, context: DecodeContext) -> str:
        if value is None or value is ABSENT:
            raise SynapseError(400, f"Missing '{key}'", Codes.MISSING_PARAM)
        if not isinstance(value, str) or not value or len(value) > self._limit or "\x00" in value:
            raise SynapseError(
                400,
                f"'{key}' must be a string of 1 to {self._limit} characters",
                Codes.INVALID_PARAM,
            )
        return value

    def example(self, context: DecodeContext) -> str:
        return "text"


def _text(body: dict[str, Any], name: str, limit: int = MAX_TEXT) -> str:
    return PusherText(limit).decode(body.get(name), name, DecodeContext())


def _check_pushkey(pushkey: str, context: DecodeContext) -> None:
    if len(pushkey.encode("utf-8")) > MAX_PUSHKEY_BYTES:
        raise SynapseError(
            400, f"'pushkey' is at most {MAX_PUSHKEY_BYTES} bytes", Codes.INVALID_PARAM
        )


def _decode_kind(kind: Any, context: DecodeContext) -> str | None:
    if kind is not None and kind != "http":
        raise SynapseError(
            400,
            "Only pushers of kind 'http' (or null, to remove) are served",
            Codes.INVALID_PARAM,
        )
    return kind


def check_gateway_url(url: Any) -> str:
    """An http(s) URL whose path is the Push Gateway API's notify path."""
    if not isinstance(url, str) or len(url) > MAX_URL:
        raise SynapseError(
            400, f"'data.url' must be a URL of at most {MAX_URL} characters", Codes.INVALID_PARAM
        )
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise SynapseError(400, "'data.url' must be an http(s) URL", Codes.INVALID_PARAM)
    if parsed.path != NOTIFY_PATH:
        raise SynapseError(400, f"'data.url' must have the path {NOTIFY_PATH}", Codes.INVALID_PARAM)
    return url


def _check_http_data(data: dict[str, Any]) -> None:
    """The ``data`` of an ``http`` pusher: its size, gateway URL and format."""
    check_content_size(data)
    check_gateway_url(data.get("url"))
    # The spec defines one format, event_id_only; any other string is
    # kept (a client's, or a newer spec's) and gets the full format.
    if "format" in data and not isinstance(data["format"], str):
        raise SynapseError(400, "'data.format' must be a string", Codes.INVALID_PARAM)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PusherSet:
    """A checked ``POST /pushers/set`` body for ``user_id`` (``kind`` None:
    remove the pusher, and the fields after ``kind`` keep their defaults).

    :meth:`from_client` reads a client's body. Between processes it travels
    by its fields' kinds, and :meth:`check_decoded` applies the rules of a
    pusher being set, so the writer checks again what the client API did."""

    user_id: str = attr.ib(metadata=wire(LocalUserId()))
    app_id: str = attr.ib(metadata=wire(PusherText(MAX_APP_ID)))
    pushkey: str = attr.ib(metadata=wire(Checked(PusherText(MAX_PUSHKEY_BYTES), _check_pushkey)))
    kind: str | None = attr.ib(
        metadata=wire(Custom(_decode_kind, example=lambda context: "http", required=True))
    )
    app_display_name: str = attr.ib(default="", metadata=wire(Str(MAX_TEXT)))
    device_display_name: str = attr.ib(default="", metadata=wire(Str(MAX_TEXT)))
    profile_tag: str | None = attr.ib(default=None, metadata=wire(Nullable(PusherText())))
    lang: str = attr.ib(default="", metadata=wire(Str(64)))
    data: dict[str, Any] = attr.ib(
        default=attr.Factory(dict),
        metadata=wire(JsonObject(example={"url": f"https://push.example.org{NOTIFY_PATH}"})),
    )
    append: bool = attr.ib(default=False, metadata=wire(Bool(False)))
    #: The device whose access token set it (deleting the device deletes it).
    device_id: str | None = attr.ib(default=None, metadata=wire(Nullable(PusherText())))

    def check_decoded(self) -> None:
        if self.kind is None:
            return
        _check_http_data(self.data)
        context = DecodeContext()
        PusherText().decode(self.app_display_name, "app_display_name", context)
        PusherText().decode(self.device_display_name, "device_display_name", context)
        PusherText(64).decode(self.lang, "lang", context)

    @classmethod
    def from_client(
        cls, user_id: str, body: dict[str, Any], device_id: str | None = None
    ) -> PusherSet:
        app_id = _text(body, "app_id", MAX_APP_ID)
        pushkey = _text(body, "pushkey", MAX_PUSHKEY_BYTES)
        _check_pushkey(pushkey, DecodeContext())
        if "kind" not in body:
            raise SynapseError(400, "Missing 'kind'", Codes.MISSING_PARAM)
        kind = _decode_kind(body["kind"], DecodeContext())
        if kind is None:
            return cls(user_id, app_id, pushkey, None, device_id=device_id)
        data = body.get("data")
        if not isinstance(data, dict):
            raise SynapseError(
                400,
                "'data' must be an object",
                Codes.MISSING_PARAM if data is None else Codes.INVALID_PARAM,
            )
        _check_http_data(data)
        profile_tag = body.get("profile_tag")
        if profile_tag is not None:
            profile_tag = _text(body, "profile_tag")
        append = body.get("append", False)
        if not isinstance(append, bool):
            raise SynapseError(400, "'append' must be true or false", Codes.INVALID_PARAM)
        return cls(
            user_id=user_id,
            app_id=app_id,
            pushkey=pushkey,
            kind=kind,
            app_display_name=_text(body, "app_display_name"),
            device_display_name=_text(body, "device_display_name"),
            profile_tag=profile_tag,
            lang=_text(body, "lang", 64),
            data=data,
            append=append,
            device_id=device_id,
        )
