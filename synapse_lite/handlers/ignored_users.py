"""Ignored users: the ``m.ignored_user_list`` account data.

What a user ignores is hidden from them: the ignored users' messages (any
non-state event) in /sync and /messages, and their invites in /sync. State
events stay, since hiding a membership or a power level would give a wrong
picture of the room. The list is read from the account data table and kept
per process (``get_global_account_data_of_type`` is cached) until the
account_data stream brings a change of it, so every process applies the
latest one the stream has brought.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import is_valid_user_id
from synapse_lite.events import Event

IGNORED_USER_LIST = "m.ignored_user_list"
#: Users one list may name (the content's size limit applies too).
MAX_IGNORED_USERS = 10_000


def check_ignored_user_list(user_id: str, content: dict[str, Any]) -> None:
    """400 unless ``content`` is a valid list for ``user_id`` to store:
    ``ignored_users`` an object keyed by user ids, not naming themself."""
    ignored = content.get("ignored_users")
    if not isinstance(ignored, dict):
        raise SynapseError(400, "'ignored_users' must be an object", Codes.BAD_JSON)
    if len(ignored) > MAX_IGNORED_USERS:
        raise SynapseError(400, "'ignored_users' names too many users", Codes.INVALID_PARAM)
    for other in ignored:
        if not is_valid_user_id(other):
            raise SynapseError(
                400, f"'ignored_users' key {other[:300]!r} is not a user id", Codes.INVALID_PARAM
            )
        if other == user_id:
            raise SynapseError(400, "You cannot ignore yourself", Codes.INVALID_PARAM)


class IgnoredUsersStore(Protocol):
    async def get_global_account_data_of_type(
        self, user_id: str, data_type: str
    ) -> dict[str, Any] | None: ...


async def get_ignored_users(store: IgnoredUsersStore, user_id: str) -> frozenset[str]:
    """Who ``user_id`` ignores (none when the list is missing or malformed)."""
    content = await store.get_global_account_data_of_type(user_id, IGNORED_USER_LIST)
    ignored = content.get("ignored_users") if content else None
    if not isinstance(ignored, dict):
        return frozenset()
    return frozenset(u for u in ignored if isinstance(u, str) and u != user_id)


def is_hidden(event: Event, ignored: frozenset[str]) -> bool:
    """Whether ``event`` is a message of an ignored user."""
    return not event.is_state and event.sender in ignored


def without_ignored(events: Iterable[Event], ignored: frozenset[str]) -> list[Event]:
    """``events`` less the ignored users' messages (in order)."""
    if not ignored:
        return list(events)
    return [e for e in events if not is_hidden(e, ignored)]
