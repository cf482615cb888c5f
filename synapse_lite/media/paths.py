"""Media ids and where their files are.

A local media id is 24 random letters and digits. Ids from requests are
checked against a strict pattern before any path is built from them, and every
path is checked to lie inside the store, so no request can name a file
outside it. Files are sharded by the id's first four characters so that no
directory grows huge::

    <store>/local_content/ab/cd/efgh...            the upload
    <store>/local_thumbnails/ab/cd/efgh.../96-96-crop.png
    <store>/remote_content/ab/cd/efgh...           another server's media, cached
    <store>/remote_thumbnails/ab/cd/efgh.../96-96-crop.png

Cached remote media is named by a ``filesystem_id`` of ours (made like a
local media id), never by the other server's name or id.
    <store>/tmp/                                    uploads being received
"""

from __future__ import annotations

import os
import re
import secrets
import string

from synapse_lite.api.errors import Codes, SynapseError

MEDIA_ID_LENGTH = 24
_ALPHABET = string.ascii_letters + string.digits
#: What this server accepts as a media id in a request: ids it made are
#: letters and digits; ``-`` and ``_`` are allowed for ids of other servers.
_MEDIA_ID = re.compile(r"[A-Za-z0-9_-]{1,255}")

#: File name extension of a thumbnail of each type.
THUMBNAIL_EXTENSIONS = {
    "image/jpeg": "jpg",
    "image/png": "png",
    "image/webp": "webp",
    "image/gif": "gif",
}


def new_media_id() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(MEDIA_ID_LENGTH))


def check_media_id(media_id: str) -> None:
    """A 400 unless ``media_id`` is letters, digits, ``-`` and ``_`` only
    (no path separators, dots, or anything else a path could be made of)."""
    if not _MEDIA_ID.fullmatch(media_id):
        raise SynapseError(
            400,
            "Invalid media id: it may only contain letters, digits, '-' and '_'",
            Codes.INVALID_PARAM,
        )


class MediaFilePaths:
    """Paths of the files of the store rooted at ``root``; relative paths are
    what storage providers are given."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.temporary_dir = os.path.join(self.root, "tmp")

    def absolute(self, relative: str) -> str:
        path = os.path.normpath(os.path.join(self.root, relative))
        if not path.startswith(self.root + os.sep):
            # Unreachable with checked ids; kept so that a bug cannot turn
            # into reading or writing outside the store.
            raise ValueError(f"{relative!r} is outside the media store")
        return path

    @staticmethod
    def _shard(media_id: str) -> str:
        if not _MEDIA_ID.fullmatch(media_id):
            raise ValueError(f"invalid media id {media_id!r}")
        return os.path.join(media_id[0:2], media_id[2:4], media_id[4:] or "_")

    def local_media(self, media_id: str) -> str:
        """The relative path of an upload."""
        return os.path.join("local_content", self._shard(media_id))

    def thumbnail(
        self, media_id: str, width: int, height: int, method: str, animated: bool, media_type: str
    ) -> str:
        """The relative path of one thumbnail of an upload."""
        name = _thumbnail_name(width, height, method, animated, media_type)
        return os.path.join("local_thumbnails", self._shard(media_id), name)

    def remote_media(self, filesystem_id: str) -> str:
        """The relative path of another server's media, cached."""
        return os.path.join("remote_content", self._shard(filesystem_id))

    def remote_thumbnail(
        self,
        filesystem_id: str,
        width: int,
        height: int,
        method: str,
        animated: bool,
        media_type: str,
    ) -> str:
        """The relative path of one thumbnail of cached remote media."""
        name = _thumbnail_name(width, height, method, animated, media_type)
        return os.path.join("remote_thumbnails", self._shard(filesystem_id), name)


def _thumbnail_name(width: int, height: int, method: str, animated: bool, media_type: str) -> str:
    animation = "-animated" if animated else ""
    return f"{width}-{height}-{method}{animation}.{THUMBNAIL_EXTENSIONS[media_type]}"
