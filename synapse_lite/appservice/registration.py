"""What an application service registered: its tokens and namespaces, and the
pure questions asked of them (is this user, alias or room the service's? is
it held exclusively?).

Registrations are read from the files named by ``app_service_config_files``
(``config/appservices.py``) and never change while a process runs. Regexes
match the whole id (``fullmatch``), as the reference homeserver and the
bridges' own checks do: ``@_irc_.*`` does not claim ``@x@_irc_y``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import attr

#: Namespace kinds of a registration, in the order the spec lists them.
NAMESPACE_KINDS = ("users", "aliases", "rooms")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Namespace:
    """One entry of a namespace list: ids matching ``regex``, held by the
    service alone when ``exclusive``."""

    exclusive: bool
    #: Compared by its pattern (compiled patterns compare by identity), so a
    #: changed registration is seen as changed.
    regex: re.Pattern[str] = attr.ib(eq=attr.cmp_using(eq=lambda a, b: a.pattern == b.pattern))

    def matches(self, value: str) -> bool:
        return self.regex.fullmatch(value) is not None


def _any(namespaces: Iterable[Namespace], value: str, exclusive_only: bool) -> bool:
    return any(ns.matches(value) for ns in namespaces if ns.exclusive or not exclusive_only)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ApplicationService:
    """One registration (the spec's ``Registration`` object)."""

    id: str
    #: Where transactions and queries go; None: the service wants no traffic.
    url: str | None
    as_token: str
    hs_token: str
    #: The service's own user, ``@<sender_localpart>:<server_name>``.
    sender: str
    users: tuple[Namespace, ...] = ()
    aliases: tuple[Namespace, ...] = ()
    rooms: tuple[Namespace, ...] = ()
    #: Whether its masqueraded users are rate limited (its sender never is).
    rate_limited: bool = True
    protocols: tuple[str, ...] = ()
    #: Whether transactions carry typing, receipts and presence (MSC2409).
    receive_ephemeral: bool = False
    #: Whether transactions carry device list changes and one-time key
    #: counts of its users' devices (``org.matrix.msc3202``).
    msc3202: bool = False
    #: The file it was read from (named in errors and logs; not compared:
    #: the same registration read from elsewhere is the same).
    source: str = attr.ib(default="", eq=False)

    def is_user_in_namespace(self, user_id: str) -> bool:
        """Whether the service may act as ``user_id``: its sender, or a user
        matching one of its user namespaces (exclusive or not)."""
        return user_id == self.sender or _any(self.users, user_id, exclusive_only=False)

    def is_exclusive_user(self, user_id: str) -> bool:
        return user_id == self.sender or _any(self.users, user_id, exclusive_only=True)

    def is_interested_in_user(self, user_id: str) -> bool:
        """Events sent by, or about, this user concern the service."""
        return self.is_user_in_namespace(user_id)

    def is_alias_in_namespace(self, alias: str) -> bool:
        return _any(self.aliases, alias, exclusive_only=False)

    def is_exclusive_alias(self, alias: str) -> bool:
        return _any(self.aliases, alias, exclusive_only=True)

    def is_room_in_namespace(self, room_id: str) -> bool:
        return _any(self.rooms, room_id, exclusive_only=False)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ApplicationServices:
    """Every registration of the homeserver, and the lookups across them."""

    services: tuple[ApplicationService, ...] = ()

    def __iter__(self) -> Iterator[ApplicationService]:
        return iter(self.services)

    def __len__(self) -> int:
        return len(self.services)

    def by_as_token(self, token: str) -> ApplicationService | None:
        for service in self.services:
            if service.as_token == token:
                return service
        return None

    def by_id(self, service_id: str) -> ApplicationService | None:
        for service in self.services:
            if service.id == service_id:
                return service
        return None

    def exclusive_owner_of_user(self, user_id: str) -> ApplicationService | None:
        """The service holding ``user_id`` exclusively, if any."""
        return next((s for s in self.services if s.is_exclusive_user(user_id)), None)

    def exclusive_owner_of_alias(self, alias: str) -> ApplicationService | None:
        return next((s for s in self.services if s.is_exclusive_alias(alias)), None)

    def may_claim_user(self, user_id: str, service: ApplicationService | None) -> bool:
        """Whether ``service`` (None: an ordinary user) may create or take
        ``user_id``: refused inside another service's exclusive namespace,
        and to a service outside its own namespaces."""
        if service is not None and not service.is_user_in_namespace(user_id):
            return False
        return all(
            other is service or not other.is_exclusive_user(user_id) for other in self.services
        )

    def may_claim_alias(self, alias: str, service: ApplicationService | None) -> bool:
        """As :meth:`may_claim_user`, for a room alias."""
        if service is not None and not service.is_alias_in_namespace(alias):
            return False
        return all(
            other is service or not other.is_exclusive_alias(alias) for other in self.services
        )
