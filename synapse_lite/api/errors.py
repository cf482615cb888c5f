"""Errors a client (or another process) can be told about, as Matrix errcodes."""

from __future__ import annotations

from typing import Any


class Codes:
    """Matrix error codes."""

    UNRECOGNIZED = "M_UNRECOGNIZED"
    UNKNOWN = "M_UNKNOWN"
    FORBIDDEN = "M_FORBIDDEN"
    BAD_JSON = "M_BAD_JSON"
    NOT_JSON = "M_NOT_JSON"
    NOT_FOUND = "M_NOT_FOUND"
    MISSING_TOKEN = "M_MISSING_TOKEN"
    UNKNOWN_TOKEN = "M_UNKNOWN_TOKEN"
    LIMIT_EXCEEDED = "M_LIMIT_EXCEEDED"
    USER_IN_USE = "M_USER_IN_USE"
    INVALID_USERNAME = "M_INVALID_USERNAME"
    INVALID_PARAM = "M_INVALID_PARAM"
    MISSING_PARAM = "M_MISSING_PARAM"
    TOO_LARGE = "M_TOO_LARGE"
    EXCLUSIVE = "M_EXCLUSIVE"
    UNAUTHORIZED = "M_UNAUTHORIZED"
    USER_DEACTIVATED = "M_USER_DEACTIVATED"
    USER_SUSPENDED = "M_USER_SUSPENDED"
    GUEST_ACCESS_FORBIDDEN = "M_GUEST_ACCESS_FORBIDDEN"
    THREEPID_AUTH_FAILED = "M_THREEPID_AUTH_FAILED"
    THREEPID_MEDIUM_NOT_SUPPORTED = "M_THREEPID_MEDIUM_NOT_SUPPORTED"
    SERVER_NOT_TRUSTED = "M_SERVER_NOT_TRUSTED"
    ROOM_IN_USE = "M_ROOM_IN_USE"
    UNKNOWN_DEVICE = "M_UNKNOWN_DEVICE"
    APPSERVICE_LOGIN_UNSUPPORTED = "M_APPSERVICE_LOGIN_UNSUPPORTED"
    # Pinging an application service (POST /appservice/{id}/ping).
    URL_NOT_SET = "M_URL_NOT_SET"
    BAD_STATUS = "M_BAD_STATUS"
    CONNECTION_FAILED = "M_CONNECTION_FAILED"
    CONNECTION_TIMEOUT = "M_CONNECTION_TIMEOUT"


#: Why a third-party (email) invite is refused (docs/client-api.md).
THIRD_PARTY_INVITES_REFUSED = "This server does not send third-party invites"


class SynapseError(Exception):
    """An error with an HTTP status and a Matrix errcode, safe to show a client."""

    def __init__(
        self,
        code: int,
        msg: str,
        errcode: str = Codes.UNKNOWN,
        additional: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {msg}")
        self.code = code
        self.msg = msg
        self.errcode = errcode
        self.additional = additional or {}

    def error_dict(self) -> dict[str, Any]:
        return {"errcode": self.errcode, "error": self.msg, **self.additional}


class AuthError(SynapseError):
    """Missing, unknown or insufficient credentials."""

    def __init__(self, code: int, msg: str, errcode: str = Codes.FORBIDDEN) -> None:
        super().__init__(code, msg, errcode)


class NotFoundError(SynapseError):
    def __init__(self, msg: str = "Not found", errcode: str = Codes.NOT_FOUND) -> None:
        super().__init__(404, msg, errcode)


class LimitExceededError(SynapseError):
    def __init__(self, retry_after_ms: int) -> None:
        super().__init__(
            429, "Too many requests", Codes.LIMIT_EXCEEDED, {"retry_after_ms": retry_after_ms}
        )
        self.retry_after_ms = retry_after_ms


class InteractiveAuthIncomplete(Exception):
    """A request needs another round of user-interactive auth (a 401 with
    flows; ``handlers/ui_auth.py``)."""

    def __init__(self, response: dict[str, Any]) -> None:
        super().__init__("interactive auth incomplete")
        self.response = response
