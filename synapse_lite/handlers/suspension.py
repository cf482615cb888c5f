"""Suspended accounts (the spec's account suspension; an admin suspends
with ``PUT /_synapse/admin/v1/suspend/{userId}``). A suspended user keeps
a read-only view: reading, syncing, leaving rooms, rejecting invites,
redacting their own events, logging out and deactivating all work; what
would add to rooms or profiles is refused with 403 ``M_USER_SUSPENDED``:
creating, joining, knocking on and inviting to rooms, sending events
(messages and state, a leave excepted), redacting others' events, changing
the profile and upgrading rooms (as the reference homeserver; media uploads,
aliases, typing and receipts stay allowed). The flag
rides on the :class:`Requester` (``handlers/auth.py``), read with the token
from the cached user restrictions."""

from __future__ import annotations

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.handlers.auth import Requester


def refuse_if_suspended(requester: Requester, action: str) -> None:
    """A 403 ``M_USER_SUSPENDED`` naming ``action`` when the requester's
    account is suspended; nothing otherwise."""
    if requester.suspended:
        raise SynapseError(
            403, f"Your account is suspended: you may not {action}", Codes.USER_SUSPENDED
        )
