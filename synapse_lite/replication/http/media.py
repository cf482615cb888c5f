"""Deleting media, on the media instance (the process holding the files):
the admin API's media deletions ask it with :data:`DELETE_MEDIA`."""

from __future__ import annotations

import attr

from synapse_lite.codec.kinds import Strings, wire
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
