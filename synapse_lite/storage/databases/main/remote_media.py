"""The cache of other servers' media: ``remote_media_cache`` (one row per
``mxc://`` URI of another server fetched here) and
``remote_media_cache_thumbnails``. Only the media instance writes them; a
row is written once its file is complete (``synapse_lite/media/remote.py``)."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.storage._base import SQLBaseStore
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.media import ThumbnailInfo, thumbnail_info


@attr.s(slots=True, frozen=True, auto_attribs=True)
class CachedRemoteMedia:
    """One ``remote_media_cache`` row."""

    media_origin: str
    media_id: str
    #: Names the file in the store (ours, not the other server's id).
    filesystem_id: str
    media_type: str
    media_length: int
    upload_name: str | None
    created_ts: int
    last_access_ts: int


_COLUMNS = (
    "media_origin, media_id, filesystem_id, media_type, media_length, upload_name,"
    " created_ts, last_access_ts"
)
_THUMBNAIL_COLUMNS = (
    "width, height, method, animated, actual_width, actual_height, media_type, media_length"
)


def _cached(row: tuple[Any, ...]) -> CachedRemoteMedia:
    return CachedRemoteMedia(
        media_origin=str(row[0]),
        media_id=str(row[1]),
        filesystem_id=str(row[2]),
        media_type=str(row[3]),
        media_length=int(row[4]),
        upload_name=None if row[5] is None else str(row[5]),
        created_ts=int(row[6]),
        last_access_ts=int(row[7]),
    )


class RemoteMediaCacheStore(SQLBaseStore):
    """Reads and writes the remote media cache's tables."""

    async def get_cached_remote_media(self, origin: str, media_id: str) -> CachedRemoteMedia | None:
        rows = await self.db_pool.select(
            "get_cached_remote_media",
            f"SELECT {_COLUMNS} FROM remote_media_cache WHERE media_origin = ? AND media_id = ?",
            origin,
            media_id,
        )
        return _cached(rows[0]) if rows else None

    async def store_cached_remote_media(self, media: CachedRemoteMedia) -> bool:
        """Record fetched media whose file is complete; False if a row was
        already there (the caller's file is then not named by any row)."""
        rows = await self.db_pool.execute(
            "store_cached_remote_media",
            f"INSERT INTO remote_media_cache ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (media_origin, media_id) DO NOTHING RETURNING media_id",
            *attr.astuple(media),
        )
        return bool(rows)

    async def touch_cached_remote_media(self, origin: str, media_id: str, now_ms: int) -> None:
        await self.db_pool.execute(
            "touch_cached_remote_media",
            "UPDATE remote_media_cache SET last_access_ts = ?"
            " WHERE media_origin = ? AND media_id = ?",
            now_ms,
            origin,
            media_id,
        )

    async def get_remote_media_accessed_before(self, before_ts: int) -> list[CachedRemoteMedia]:
        rows = await self.db_pool.select(
            "get_remote_media_accessed_before",
            f"SELECT {_COLUMNS} FROM remote_media_cache WHERE last_access_ts < ?",
            before_ts,
        )
        return [_cached(r) for r in rows]

    async def get_remote_media_thumbnails(self, origin: str, media_id: str) -> list[ThumbnailInfo]:
        rows = await self.db_pool.select(
            "get_remote_media_thumbnails",
            f"SELECT {_THUMBNAIL_COLUMNS} FROM remote_media_cache_thumbnails"
            " WHERE media_origin = ? AND media_id = ?",
            origin,
            media_id,
        )
        return [thumbnail_info(r) for r in rows]

    async def store_remote_media_thumbnail(
        self, origin: str, media_id: str, info: ThumbnailInfo
    ) -> None:
        """Record a thumbnail whose file is complete (racing writers: the first wins)."""
        await self.db_pool.execute(
            "store_remote_media_thumbnail",
            f"INSERT INTO remote_media_cache_thumbnails (media_origin, media_id,"
            f" {_THUMBNAIL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (media_origin, media_id, width, height, method, animated) DO NOTHING",
            origin,
            media_id,
            info.width,
            info.height,
            info.method,
            info.animated,
            info.actual_width,
            info.actual_height,
            info.media_type,
            info.media_length,
        )

    async def delete_cached_remote_media(self, origin: str, media_id: str) -> None:
        """Forget cached media and its thumbnails (their files are the caller's)."""

        def txn_func(txn: LoggingTransaction) -> None:
            for table in ("remote_media_cache_thumbnails", "remote_media_cache"):
                txn.execute(
                    f"DELETE FROM {table} WHERE media_origin = ? AND media_id = ?",
                    (origin, media_id),
                )

        await self.db_pool.runInteraction("delete_cached_remote_media", txn_func)
