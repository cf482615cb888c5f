"""Asking application services about users and room aliases nobody has yet,
and pinging them.

When a user or alias inside a service's namespace is looked up and not
found, the service is asked (``GET /_matrix/app/v1/users/{userId}``,
``/rooms/{roomAlias}``); a service that answers 200 has just made it (a
bridge creates the room and alias, or registers the user, *while* the
lookup waits, through the client API of this same homeserver: nothing here
holds a lock, so that request is served meanwhile), and the lookup looks
again. Services holding the namespace exclusively are asked first.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.appservice.api import NO_ANSWER, TIMED_OUT

if TYPE_CHECKING:
    from synapse_lite.appservice.api import ApplicationServiceApi
    from synapse_lite.appservice.registration import ApplicationService, ApplicationServices
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)


class AppServiceQueries:
    """Lookups that may ask a service, and the ping."""

    def __init__(
        self,
        services: ApplicationServices,
        api: ApplicationServiceApi,
        store: GenericWorkerStore,
        on_ping_answered: Callable[[str], None] | None = None,
    ) -> None:
        """``on_ping_answered``: told the id of a service that answered a
        ping (the sender, where it runs, then sends what is waiting)."""
        self._services = services
        self._api = api
        self._store = store
        self._on_ping_answered = on_ping_answered
        #: (service id, protocol) -> the last description the service gave:
        #: protocol metadata is static, so a service that fails (or answers
        #: garbage) now is described by what it said before.
        self._described: dict[tuple[str, str], dict[str, Any]] = {}

    def _asked_about(
        self,
        matches: Callable[[ApplicationService], bool],
        exclusive: Callable[[ApplicationService], bool],
    ) -> list[ApplicationService]:
        candidates = [s for s in self._services if s.url is not None and matches(s)]
        return sorted(candidates, key=lambda s: not exclusive(s))

    async def room_for_alias(self, alias: str) -> str | None:
        """The room ``alias`` names, asking the services whose namespaces
        cover it if it is unknown; None if still unknown."""
        found = await self._store.get_alias(alias)
        if found is not None:
            return found[0]
        for service in self._asked_about(
            lambda s: s.is_alias_in_namespace(alias), lambda s: s.is_exclusive_alias(alias)
        ):
            if await self._api.query_alias(service, alias):
                found = await self._store.get_alias(alias)
                if found is not None:
                    return found[0]
        return None

    def check_alias_claim(self, alias: str, service: ApplicationService | None) -> None:
        """400 ``M_EXCLUSIVE`` if ``service`` (None: an ordinary user) may
        not create ``alias``: inside another service's exclusive namespace,
        or outside the service's own."""
        if not self._services.may_claim_alias(alias, service):
            raise SynapseError(
                400, f"{alias} is reserved by an application service", Codes.EXCLUSIVE
            )

    async def user_exists(self, user_id: str) -> bool:
        """Whether the local ``user_id`` is registered, asking the services
        whose namespaces cover it if it is not. A service's sender exists
        without registering (its ``sender_localpart`` makes it)."""
        if await self._store.get_user(user_id) is not None:
            return True
        if any(s.sender == user_id for s in self._services):
            return True
        for service in self._asked_about(
            lambda s: s.is_user_in_namespace(user_id), lambda s: s.is_exclusive_user(user_id)
        ):
            if await self._api.query_user(service, user_id):
                if await self._store.get_user(user_id) is not None:
                    return True
        return False

    async def protocols(self, only: str | None = None) -> dict[str, Any]:
        """``GET /thirdparty/protocols`` (or ``/protocol/{only}``): each
        protocol the services list, described by the first service that
        answers ``GET /_matrix/app/v1/thirdparty/protocol/{protocol}`` with
        an object; the ``instances`` of every service answering are merged,
        each given its ``instance_id`` (``_name_instances``).
        A service that fails or answers garbage is described by its last
        good answer, or left out if it never gave one."""
        found: dict[str, dict[str, Any]] = {}
        for service in self._services:
            if service.url is None:
                continue
            for protocol in service.protocols:
                if only is not None and protocol != only:
                    continue
                answer = await self._api.request(
                    service, "GET", "/thirdparty/protocol/" + urllib.parse.quote(protocol, safe="")
                )
                try:
                    described = json.loads(answer.body) if answer.ok else None
                except ValueError:
                    described = None
                if isinstance(described, dict):
                    self._described[(service.id, protocol)] = described
                else:
                    described = self._described.get((service.id, protocol))
                if described is None:
                    continue
                described = json.loads(json.dumps(described))  # each answer its own copy
                instances = described.get("instances")
                if isinstance(instances, list):
                    _name_instances(service, instances)
                if protocol in found and isinstance(instances, list):
                    found[protocol].setdefault("instances", []).extend(instances)
                else:
                    found.setdefault(protocol, described)
        return found

    async def thirdparty_lookup(
        self, kind: str, protocol: str, fields: dict[str, list[str]]
    ) -> list[Any]:
        """``GET /thirdparty/{kind}/{protocol}`` (``kind``: ``user`` or
        ``location``): every service listing ``protocol`` is asked the same
        (``GET /_matrix/app/v1/thirdparty/{kind}/{protocol}`` with
        ``fields`` as the query string) and the lists they answer are
        joined; a service that fails or answers garbage adds nothing.
        404 ``M_NOT_FOUND`` if no service lists the protocol."""
        services = [s for s in self._services if s.url is not None and protocol in s.protocols]
        if not services:
            raise SynapseError(404, "No application service offers this protocol", Codes.NOT_FOUND)
        path = f"/thirdparty/{kind}/" + urllib.parse.quote(protocol, safe="")
        found: list[Any] = []
        for service in services:
            answer = await self._api.request(service, "GET", path, query=fields)
            try:
                listed = json.loads(answer.body) if answer.ok else None
            except ValueError:
                listed = None
            if isinstance(listed, list):
                found.extend(item for item in listed if isinstance(item, dict))
        return found

    async def ping(self, service: ApplicationService, transaction_id: str | None) -> dict[str, Any]:
        """``POST /_matrix/client/v1/appservice/{id}/ping``: the homeserver
        pings the service (``POST /_matrix/app/v1/ping``) and says how long
        it took, or why it failed (the spec's errcodes)."""
        if service.url is None:
            raise SynapseError(400, "The application service has no URL", Codes.URL_NOT_SET)
        body = {} if transaction_id is None else {"transaction_id": transaction_id}
        started = time.monotonic()
        answer = await self._api.request(service, "POST", "/ping", body)
        duration_ms = int((time.monotonic() - started) * 1000)
        if answer.status == TIMED_OUT:
            raise SynapseError(
                504, "The application service did not answer in time", Codes.CONNECTION_TIMEOUT
            )
        if answer.status == NO_ANSWER:
            raise SynapseError(
                502, "The application service could not be reached", Codes.CONNECTION_FAILED
            )
        if not answer.ok:
            raise SynapseError(
                502,
                "The application service answered with an error",
                Codes.BAD_STATUS,
                additional={
                    "status": answer.status,
                    "body": answer.body.decode("utf-8", "replace"),
                },
            )
        if self._on_ping_answered is not None:
            self._on_ping_answered(service.id)
        return {"duration_ms": duration_ms}


def _name_instances(service: ApplicationService, instances: list[Any]) -> None:
    """Give each instance with a ``network_id`` the ``instance_id``
    ``<as_id>|<network_id>``: the id ``/publicRooms`` takes as
    ``third_party_instance_id`` for the rooms the service published under
    that network (``PUT /directory/list/appservice/{networkId}/{roomId}``)."""
    for instance in instances:
        if isinstance(instance, dict) and isinstance(instance.get("network_id"), str):
            instance["instance_id"] = f"{service.id}|{instance['network_id']}"
