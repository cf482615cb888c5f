"""HTTP calls the command line and the launcher make to running processes."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from synapse_lite.config.homeserver import MAIN_PROCESS, HomeServerConfig

#: Seconds a command waits for a process to answer.
REQUEST_TIMEOUT_SECONDS = 10.0


class AdminRequestError(Exception):
    """A process could not be reached, or refused."""


async def http_request(
    reactor: Any,
    method: str,
    url: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = REQUEST_TIMEOUT_SECONDS,
) -> tuple[int, bytes]:
    """``(status code, body)``; :class:`AdminRequestError` if nothing answered."""
    import treq
    from twisted.web.client import HTTPConnectionPool

    pool = HTTPConnectionPool(reactor, persistent=False)
    all_headers: dict[bytes | str, bytes | str] = {"Content-Type": "application/json"}
    all_headers.update(headers or {})
    try:
        response = await treq.request(
            method,
            url,
            data=None if body is None else json.dumps(body).encode("utf-8"),
            headers=all_headers,
            timeout=timeout,
            pool=pool,
            reactor=reactor,
        )
        return response.code, await treq.content(response)
    except Exception as e:
        raise AdminRequestError(f"{method} {url}: no answer ({e.__class__.__name__}: {e})") from e


def _json(url: str, code: int, content: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(content)
    except ValueError:
        answer = None
    if code != 200 or not isinstance(answer, dict):
        error = (
            answer.get("error")
            if isinstance(answer, dict)
            else content[:200].decode("utf-8", "replace")
        )
        raise AdminRequestError(f"{url} answered {code}: {error}")
    return answer


async def retire_events_writer(
    reactor: Any, config: HomeServerConfig, instance_name: str
) -> dict[str, Any]:
    """Ask the main process to retire a stopped events writer (see
    :class:`synapse_lite.replication.http.instances.RetireEventsWriterEndpoint`)."""
    try:
        location = config.location_of(MAIN_PROCESS)
    except KeyError as e:
        raise AdminRequestError(str(e.args[0])) from None
    url = f"{location.base_url}/_synapse/replication/retire_events_writer"
    headers = {}
    if config.worker_replication_secret:
        headers["Authorization"] = f"Bearer {config.worker_replication_secret}"
    code, content = await http_request(
        reactor, "POST", url, {"instance_name": instance_name}, headers
    )
    return _json(url, code, content)


def registration_mac(secret: str, nonce: str, user: str, password: str, admin: bool) -> str:
    """The HMAC-SHA1 the shared-secret registration API checks."""
    mac = hmac.new(secret.encode("utf-8"), digestmod=hashlib.sha1)
    for part in (nonce, user, password):
        mac.update(part.encode("utf-8"))
        mac.update(b"\x00")
    mac.update(b"admin" if admin else b"notadmin")
    return mac.hexdigest()


async def register_user(
    reactor: Any, base_url: str, secret: str, user: str, password: str, admin: bool
) -> dict[str, Any]:
    """Create a user through ``/_synapse/admin/v1/register`` (nonce, then the
    signed request); the server's answer (``user_id``, ``access_token``, ...)."""
    url = f"{base_url}/_synapse/admin/v1/register"
    code, content = await http_request(reactor, "GET", url)
    if code == 404:
        raise AdminRequestError(f"{url} answered 404: this server has no registration API")
    nonce = _json(url, code, content).get("nonce")
    if not isinstance(nonce, str):
        raise AdminRequestError(f"{url} gave no nonce")
    body = {
        "nonce": nonce,
        "username": user,
        "password": password,
        "admin": admin,
        "mac": registration_mac(secret, nonce, user, password, admin),
    }
    code, content = await http_request(reactor, "POST", url, body)
    return _json(url, code, content)
