"""Deleting media, on the media instance (the process holding the files):
the admin API's media deletions ask it with :data:`DELETE_MEDIA`."""

from __future__ import annotations

import attr

from synapse_lite.codec.kinds import Int, Strings, wire
from synapse_lite.replication.http.calls import InternalCall


@attr.s(slots=True, frozen=True, auto_attribs=True)
class MediaToDelete:
    """Local media ids: their files, thumbnails and rows go."""

    media_ids: list[str] = attr.ib(metadata=wire(Strings()))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class MediaDeleted:
    """The ids that were there and are gone."""

    deleted: list[str] = attr.ib(metadata=wire(Strings()))


#: Served by the media instance (``media_instance``, named by the caller);
#: deleting twice deletes nothing more.
DELETE_MEDIA = InternalCall("delete_media", MediaToDelete, MediaDeleted, idempotent=True)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class MediaCacheToPurge:
    """Other servers' media cached here and last downloaded before ``before_ts`` (ms)."""

    before_ts: int = attr.ib(metadata=wire(Int()))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class MediaCachePurged:
    """How many cached media went."""

    deleted: int = attr.ib(metadata=wire(Int(minimum=0)))


#: Served by the media instance (``media/remote.py``): the admin API's
#: ``POST /_synapse/admin/v1/purge_media_cache``.
PURGE_MEDIA_CACHE = InternalCall(
    "purge_media_cache", MediaCacheToPurge, MediaCachePurged, idempotent=True
)
