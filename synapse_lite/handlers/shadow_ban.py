"""Shadow bans: an admin's quiet ban (``POST/DELETE
/_synapse/admin/v1/users/{userId}/shadow_ban``). A shadow-banned user's
sends, state changes, redactions and invites answer as if they succeeded,
with an event id that looks real, and store and send nothing; typing
notices are dropped; a room they create gets no invites. Everything else
(reading, joining, leaving) works as before, so the user cannot easily tell.
The flag rides on the :class:`Requester` (``handlers/auth.py``)."""

from __future__ import annotations

import base64
import hashlib
import secrets

from synapse_lite.handlers.auth import Requester


def fake_event_id(requester: Requester, room_id: str, txn_id: str | None) -> str:
    """An event id for a send that was not made, of the form a real one has
    (``$`` and 43 URL-safe base64 characters). With a transaction id the
    same on every process and every retry (as a real send's repeat would
    be), and unguessable without the requester's token hash."""
    if txn_id is None:
        digest = secrets.token_bytes(32)
    else:
        material = "\0".join((requester.token_hash, room_id, txn_id)).encode("utf-8")
        digest = hashlib.sha256(material).digest()
    return "$" + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")
