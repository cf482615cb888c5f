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

#: The spec's limits, and ours for the fields it leaves open.
MAX_APP_ID = 64
MAX_PUSHKEY_BYTES = 512
MAX_URL = 2048
MAX_TEXT = 255
#: The path every push gateway URL must have (Push Gateway API).
NOTIFY_PATH = "/_matrix/push/v1/notify"


def _text(body: dict[str, Any], name: str, limit: int = MAX_TEXT) -> str:
    value = body.get(name)
    if value is None:
        raise SynapseError(400, f"Missing '{name}'", Codes.MISSING_PARAM)
    if not isinstance(value, str) or not value or len(value) > limit or "\x00" in value:
        raise SynapseError(
            400, f"'{name}' must be a string of 1 to {limit} characters", Codes.INVALID_PARAM
        )
    return value


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


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PusherSet:
    """A checked ``POST /pushers/set`` body for ``user_id`` (``kind`` None:
    remove the pusher)."""

    user_id: str
    app_id: str
    pushkey: str
    kind: str | None
    app_display_name: str = ""
    device_display_name: str = ""
    profile_tag: str | None = None
    lang: str = ""
    data: dict[str, Any] = attr.ib(factory=dict)
    append: bool = False
    #: The device whose access token set it (deleting the device deletes it).
    device_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return attr.asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> PusherSet:
        """Also the internal call's decoder: the writer checks again."""
        user_id = body.get("user_id")
        if not isinstance(user_id, str) or not user_id.endswith(":" + server_name):
            raise SynapseError(400, "'user_id' must be a local user id", Codes.BAD_JSON)
        device_id = body.get("device_id")
        if device_id is not None:
            device_id = _text(body, "device_id")
        return cls.from_client(user_id, body, device_id)

    @classmethod
    def from_client(
        cls, user_id: str, body: dict[str, Any], device_id: str | None = None
    ) -> PusherSet:
        app_id = _text(body, "app_id", MAX_APP_ID)
        pushkey = _text(body, "pushkey", MAX_PUSHKEY_BYTES)
        if len(pushkey.encode("utf-8")) > MAX_PUSHKEY_BYTES:
            raise SynapseError(
                400, f"'pushkey' is at most {MAX_PUSHKEY_BYTES} bytes", Codes.INVALID_PARAM
            )
        if "kind" not in body:
            raise SynapseError(400, "Missing 'kind'", Codes.MISSING_PARAM)
        kind = body["kind"]
        if kind is None:
            return cls(user_id, app_id, pushkey, None, device_id=device_id)
        if kind != "http":
            raise SynapseError(
                400,
                "Only pushers of kind 'http' (or null, to remove) are served",
                Codes.INVALID_PARAM,
            )
        data = body.get("data")
        if not isinstance(data, dict):
            raise SynapseError(
                400,
                "'data' must be an object",
                Codes.MISSING_PARAM if data is None else Codes.INVALID_PARAM,
            )
        check_content_size(data)
        check_gateway_url(data.get("url"))
        # The spec defines one format, event_id_only; any other string is
        # kept (a client's, or a newer spec's) and gets the full format.
        if "format" in data and not isinstance(data["format"], str):
            raise SynapseError(400, "'data.format' must be a string", Codes.INVALID_PARAM)
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
