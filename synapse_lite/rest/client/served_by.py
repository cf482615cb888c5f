"""Which process serves each client servlet, declared by servlet name.

The declarations (:class:`~synapse_lite.streams.writers.ServedBy`, shared
with the internal calls) name roles; the routing table
(``synapse_lite/routing/table.py``) turns them into instances with the
config's writers directory (``config.writers``): a stream's writer is whoever
the directory names for it, a room's events writer is the one stored with the
room. A servlet not listed here is served
by the main process, so a new servlet works before it is declared; declare it
when another process should serve it. ``docs/routing.md`` explains the roles.
"""

from __future__ import annotations

from collections.abc import Mapping

from synapse_lite.streams.writers import (
    MAIN,
    MEDIA_ROLE,
    READERS_ROLE,
    ROOM_EVENTS_WRITER_ROLE,
    ServedBy,
    writer_of,
)

READERS = ServedBy(READERS_ROLE)
ROOM_EVENTS_WRITER = ServedBy(ROOM_EVENTS_WRITER_ROLE)
MEDIA = ServedBy(MEDIA_ROLE)


#: Paths served by the media instance, whatever their servlet. Federation
#: media too: the media instance has the files (routed before the other
#: federation paths, which go to the federation readers).
MEDIA_PATH_PREFIXES = (
    "/_matrix/media/",
    "/_matrix/client/v1/media/",
    "/_matrix/federation/v1/media/",
)

#: Servlet name -> who serves it (or, by method, who serves each method).
SERVED_BY: Mapping[str, ServedBy | Mapping[str, ServedBy]] = {
    # Reads: any process can answer from the database and its caches.
    "sync": READERS,
    # Sliding sync: its connection state is in the database, so any reader.
    "sliding_sync": READERS,
    # The deprecated event stream and initial syncs: reads like /sync.
    "events": READERS,
    "initial_sync": READERS,
    "room_initial_sync": READERS,
    "filter": READERS,
    "messages": READERS,
    "members": READERS,
    "joined_members": READERS,
    "joined_rooms": READERS,
    "whoami": READERS,
    "capabilities": READERS,
    # No data behind them (we hold no third-party identifiers): any process.
    "threepids": READERS,
    "threepid_request_token": READERS,
    # Account changes: the users row is written where the request lands and
    # devices through the main process, so main saves a forward.
    "account_password": MAIN,
    "account_deactivate": MAIN,
    # Unbinding at identity servers is signed with the server's key, which
    # the main process made.
    "threepid_bindings": MAIN,
    # Plain tables, no stream: any process reads and writes them.
    "report_event": READERS,
    "report_room": READERS,
    "report_user": READERS,
    "admin_whois": READERS,
    "openid_request_token": READERS,
    "notifications": READERS,
    "room_event": READERS,
    "context": READERS,
    "relations": READERS,
    "threads": READERS,
    # The search index is in the shared database, filled by the events writers.
    "search": READERS,
    # Not streams: any process writes the rows (profiles also send member
    # events, each through its room's writer).
    "profile": READERS,
    "profile_update": READERS,
    "forget": READERS,
    "directory_alias": READERS,
    "room_aliases": READERS,
    "directory_listing": READERS,
    "directory_appservice_listing": READERS,
    "public_rooms": READERS,
    "public_rooms_search": READERS,
    # Reads our rooms' state, and asks other servers (any process may ask).
    "room_hierarchy": READERS,
    "user_directory": READERS,
    "turn_server": READERS,
    "thirdparty_protocols": READERS,
    # A room's events, straight to the process persisting them.
    "send": ROOM_EVENTS_WRITER,
    "redact": ROOM_EVENTS_WRITER,
    "state": {"PUT": ROOM_EVENTS_WRITER, "GET": READERS},
    "join": ROOM_EVENTS_WRITER,
    "knock": ROOM_EVENTS_WRITER,
    "invite": ROOM_EVENTS_WRITER,
    "leave": ROOM_EVENTS_WRITER,
    "kick": ROOM_EVENTS_WRITER,
    "ban": ROOM_EVENTS_WRITER,
    "unban": ROOM_EVENTS_WRITER,
    # Each to the writer of its stream (reads too: the writer is current).
    "typing": writer_of("typing"),
    "receipt": writer_of("receipts"),
    "read_markers": writer_of("receipts"),
    "account_data": writer_of("account_data"),
    "room_account_data": writer_of("account_data"),
    "room_tags": writer_of("account_data"),
    "presence": writer_of("presence"),
    "send_to_device": writer_of("to_device"),
    "devices": writer_of("device_lists"),
    # E2E keys: a device's identity keys are a device_lists change; one-time
    # keys are claimed atomically in the database by whoever has the request.
    "keys_upload": writer_of("device_lists"),
    "keys_signing": writer_of("device_lists"),
    "keys_query": READERS,
    "keys_claim": READERS,
    "keys_changes": READERS,
    # Key backup: no stream; the database serves it from any process.
    "room_keys": MAIN,
    "push_rules": writer_of("push_rules"),
    "pushers": writer_of("pushers"),
}


def served_by(servlet: str, method: str) -> ServedBy | None:
    """The declaration for one method of a servlet; None if it has none."""
    declared = SERVED_BY.get(servlet)
    if isinstance(declared, ServedBy) or declared is None:
        return declared
    return declared.get(method)
