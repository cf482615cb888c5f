"""The media repository's metadata: ``local_media`` (one row per mxc:// id this
server handed out) and ``local_media_thumbnails``. The files are on disk
(``synapse_lite/media/storage.py``); a row is written once its file is
complete, so a row always names a whole file."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.storage._base import SQLBaseStore
from synapse_lite.storage.database import LoggingTransaction


@attr.s(slots=True, frozen=True, auto_attribs=True)
class LocalMedia:
    """One ``local_media`` row."""

    media_id: str
    user_id: str
    created_ts: int
    #: None until the content is uploaded (an id from ``create``).
    media_type: str | None
    media_length: int | None
    upload_name: str | None
    uploaded_ts: int | None
    #: When an id from ``create`` stops waiting for content; None once uploaded.
    unused_expires_at: int | None

    @property
    def uploaded(self) -> bool:
        return self.uploaded_ts is not None


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ThumbnailInfo:
    """One ``local_media_thumbnails`` row: the size asked for, and what was made."""

    width: int
    height: int
    method: str
    animated: bool
    actual_width: int
    actual_height: int
    media_type: str
    media_length: int


def thumbnail_info(row: tuple[Any, ...]) -> ThumbnailInfo:
    """A thumbnail row's ``width, height, method, animated, actual_width,
    actual_height, media_type, media_length``."""
    return ThumbnailInfo(
        width=int(row[0]),
        height=int(row[1]),
        method=str(row[2]),
        animated=bool(row[3]),
        actual_width=int(row[4]),
        actual_height=int(row[5]),
        media_type=str(row[6]),
        media_length=int(row[7]),
    )


_MEDIA_COLUMNS = (
    "media_id, user_id, created_ts, media_type, media_length, upload_name,"
    " uploaded_ts, unused_expires_at"
)


def _media(row: tuple[Any, ...]) -> LocalMedia:
    return LocalMedia(
        media_id=str(row[0]),
        user_id=str(row[1]),
        created_ts=int(row[2]),
        media_type=None if row[3] is None else str(row[3]),
        media_length=None if row[4] is None else int(row[4]),
        upload_name=None if row[5] is None else str(row[5]),
        uploaded_ts=None if row[6] is None else int(row[6]),
        unused_expires_at=None if row[7] is None else int(row[7]),
    )


class MediaRepositoryStore(SQLBaseStore):
    """Reads and writes the media tables (only the media instance writes)."""

    async def get_local_media(self, media_id: str) -> LocalMedia | None:
        rows = await self.db_pool.select(
            "get_local_media",
            f"SELECT {_MEDIA_COLUMNS} FROM local_media WHERE media_id = ?",
            media_id,
        )
        return _media(rows[0]) if rows else None

    async def store_local_media(
        self,
        media_id: str,
        user_id: str,
        now_ms: int,
        media_type: str,
        media_length: int,
        upload_name: str | None,
    ) -> None:
        """Record an upload whose file is already complete on disk."""
        await self.db_pool.execute(
            "store_local_media",
            f"INSERT INTO local_media ({_MEDIA_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
            media_id,
            user_id,
            now_ms,
            media_type,
            media_length,
            upload_name,
            now_ms,
        )

    async def create_pending_media(
        self, media_id: str, user_id: str, now_ms: int, expires_at: int, max_pending: int
    ) -> bool:
        """Record an id from ``create``, unless ``user_id`` already has
        ``max_pending`` ids waiting for content (then False)."""

        def txn_func(txn: LoggingTransaction) -> bool:
            txn.execute(
                "SELECT COUNT(*) FROM local_media"
                " WHERE user_id = ? AND uploaded_ts IS NULL AND unused_expires_at > ?",
                (user_id, now_ms),
            )
            row = txn.fetchone()
            if row is not None and int(row[0]) >= max_pending:
                return False
            txn.execute(
                "INSERT INTO local_media (media_id, user_id, created_ts, unused_expires_at)"
                " VALUES (?, ?, ?, ?)",
                (media_id, user_id, now_ms, expires_at),
            )
            return True

        return await self.db_pool.runInteraction("create_pending_media", txn_func)

    async def complete_pending_media(
        self,
        media_id: str,
        now_ms: int,
        media_type: str,
        media_length: int,
        upload_name: str | None,
    ) -> bool:
        """Record the content of an id from ``create`` (its file complete on
        disk); False if it was uploaded meanwhile or has expired."""

        def txn_func(txn: LoggingTransaction) -> bool:
            txn.execute(
                "UPDATE local_media SET media_type = ?, media_length = ?, upload_name = ?,"
                " uploaded_ts = ?, unused_expires_at = NULL"
                " WHERE media_id = ? AND uploaded_ts IS NULL AND unused_expires_at > ?",
                (media_type, media_length, upload_name, now_ms, media_id, now_ms),
            )
            return txn.rowcount == 1

        return await self.db_pool.runInteraction("complete_pending_media", txn_func)

    async def delete_expired_pending_media(self, now_ms: int) -> int:
        """Forget ids from ``create`` whose time to upload has passed."""

        def txn_func(txn: LoggingTransaction) -> int:
            txn.execute(
                "DELETE FROM local_media WHERE uploaded_ts IS NULL AND unused_expires_at <= ?",
                (now_ms,),
            )
            return txn.rowcount

        return await self.db_pool.runInteraction("delete_expired_pending_media", txn_func)

    async def get_thumbnails(self, media_id: str) -> list[ThumbnailInfo]:
        rows = await self.db_pool.select(
            "get_thumbnails",
            "SELECT width, height, method, animated, actual_width, actual_height, media_type,"
            " media_length FROM local_media_thumbnails WHERE media_id = ?",
            media_id,
        )
        return [thumbnail_info(r) for r in rows]

    async def store_thumbnail(self, media_id: str, info: ThumbnailInfo) -> None:
        """Record a thumbnail whose file is complete (a second writer of the
        same thumbnail, racing, changes nothing)."""
        await self.db_pool.execute(
            "store_thumbnail",
            "INSERT INTO local_media_thumbnails (media_id, width, height, method, animated,"
            " actual_width, actual_height, media_type, media_length)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (media_id, width, height, method, animated) DO NOTHING",
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

    async def delete_local_media_rows(self, media_id: str) -> bool:
        """Forget an upload and its thumbnails (their files are the caller's);
        whether it was there."""

        def txn_func(txn: LoggingTransaction) -> bool:
            txn.execute("DELETE FROM local_media_thumbnails WHERE media_id = ?", (media_id,))
            txn.execute("DELETE FROM local_media WHERE media_id = ?", (media_id,))
            return txn.rowcount > 0

        return await self.db_pool.runInteraction("delete_local_media_rows", txn_func)

    async def find_media_to_delete(
        self, before_ts: int, size_gt: int, keep_profiles: bool, server_name: str
    ) -> list[str]:
        """Uploads made before ``before_ts`` larger than ``size_gt`` bytes,
        protected ones and (with ``keep_profiles``) users' avatars left out."""
        avatar = ""
        args: list[Any] = [before_ts, size_gt]
        if keep_profiles:
            avatar = (
                " AND NOT EXISTS (SELECT 1 FROM profiles AS p WHERE p.avatar_url = ? || m.media_id)"
            )
            args.append(f"mxc://{server_name}/")
        rows = await self.db_pool.select(
            "find_media_to_delete",
            "SELECT m.media_id FROM local_media AS m WHERE m.created_ts < ?"
            " AND COALESCE(m.media_length, 0) > ? AND NOT m.safe_from_quarantine"
            f"{avatar} ORDER BY m.media_id",
            *args,
        )
        return [str(r[0]) for r in rows]
