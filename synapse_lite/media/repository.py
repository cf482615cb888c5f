"""The media repository's logic: uploads (at once, or to an id made earlier),
downloads that wait for content not yet uploaded, and which thumbnail answers
a request.

Runs only on the media instance, which is why waiting for an upload is a
wait on this process's memory: the upload can only arrive here.

Thumbnails: the configured sizes are made in a thread right after an image is
uploaded. A request is answered with the smallest configured size of its
method at least as large as asked (the largest, if none is), so the cache of
one upload is bounded by the configuration; a size not made yet (animated
variants, sizes added to the config later, a request racing the upload) is
made on demand and cached.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from twisted.internet import defer, threads

from synapse_lite.api.errors import Codes, LimitExceededError, NotFoundError, SynapseError
from synapse_lite.api.identifiers import check_identifier_text
from synapse_lite.clock import Clock
from synapse_lite.config.homeserver import RateLimitConfig
from synapse_lite.config.media import MediaConfig, ThumbnailSize
from synapse_lite.handlers.ratelimit import Ratelimiter
from synapse_lite.media.paths import new_media_id
from synapse_lite.media.storage import MediaStorage
from synapse_lite.media.thumbnailer import (
    THUMBNAILABLE_TYPES,
    Thumbnail,
    ThumbnailError,
    make_thumbnail,
)
from synapse_lite.replication.http.media import MediaDeleted, MediaToDelete
from synapse_lite.storage.databases.main.media import LocalMedia, ThumbnailInfo

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: How often ids from ``create`` whose time ran out are forgotten.
EXPIRY_INTERVAL_SECONDS = 600.0
#: Thumbnails made at once (each may decode a large image).
THUMBNAIL_CONCURRENCY = 2
#: Uploaded media whose metadata is kept in memory (it never changes once
#: uploaded, and only this process writes it): a download then needs no
#: database round trip.
METADATA_CACHE_ENTRIES = 10_000


class CannotOverwriteMedia(SynapseError):
    def __init__(self) -> None:
        super().__init__(409, "This media id already has content", "M_CANNOT_OVERWRITE_MEDIA")


class MediaRepository:
    """Uploads, downloads and thumbnails of this server's media."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        storage: MediaStorage,
        clock: Clock,
        reactor: Any,
        config: MediaConfig,
        server_name: str,
        rate_limits_enabled: bool,
    ) -> None:
        self._store = store
        self.storage = storage
        self._clock = clock
        self._reactor = reactor
        self.config = config
        self.server_name = server_name
        limit = config.upload_rate_limit
        self._upload_limiter = Ratelimiter(
            clock, RateLimitConfig(limit.per_second, limit.burst), rate_limits_enabled
        )
        self._thumbnail_slots = defer.DeferredSemaphore(THUMBNAIL_CONCURRENCY)
        #: media id -> downloads waiting for its content.
        self._waiting: dict[str, list[defer.Deferred[None]]] = {}
        self._jobs: set[defer.Deferred[None]] = set()
        self._expiry: Any = None
        self._uploaded_media: OrderedDict[str, LocalMedia] = OrderedDict()

    # Lifecycle (a Loop, plus the jobs to finish before the database closes)

    def start(self) -> None:
        self.storage.prepare()
        self._expiry = self._clock.looping_call(self._expire_pending, EXPIRY_INTERVAL_SECONDS)

    def stop(self) -> None:
        if self._expiry is not None and self._expiry.running:
            self._expiry.stop()

    async def finish_jobs(self) -> None:
        """Wait for the thumbnails being made after uploads."""
        if self._jobs:
            await defer.DeferredList(list(self._jobs))

    def _expire_pending(self) -> defer.Deferred[None]:
        async def expire() -> None:
            removed = await self._store.delete_expired_pending_media(self._clock.time_msec())
            if removed:
                logger.info("Forgot %d media id(s) whose upload never came", removed)

        return defer.ensureDeferred(expire()).addErrback(
            lambda f: logger.warning("Expiring media ids failed: %s", f.value)
        )

    # Uploads

    def check_upload_rate(self, user_id: str) -> None:
        """A 429 if ``user_id`` uploads (or creates ids) too fast."""
        self._upload_limiter.ratelimit(user_id)

    def mxc(self, media_id: str) -> str:
        return f"mxc://{self.server_name}/{media_id}"

    async def upload(
        self, user_id: str, body: Any, media_type: str, upload_name: str | None
    ) -> str:
        """Store a received body as a new upload; its ``mxc://`` URI."""
        media_id = new_media_id()
        length = await self.storage.commit(body, self.storage.paths.local_media(media_id))
        await self._store.store_local_media(
            media_id, user_id, self._clock.time_msec(), media_type, length, upload_name
        )
        logger.info("%s uploaded %s (%s, %d bytes)", user_id, media_id, media_type, length)
        self._uploaded(media_id, media_type)
        return self.mxc(media_id)

    async def create(self, user_id: str) -> tuple[str, int]:
        """A new id whose content comes later: its URI and when it expires."""
        now = self._clock.time_msec()
        expires_at = now + self.config.unused_expires_after_ms
        media_id = new_media_id()
        if not await self._store.create_pending_media(
            media_id, user_id, now, expires_at, self.config.max_pending_uploads
        ):
            # The spec's answer to too many pending uploads; retry once one
            # is uploaded or expires.
            raise LimitExceededError(retry_after_ms=60_000)
        return self.mxc(media_id), expires_at

    async def upload_to(
        self, user_id: str, media_id: str, body: Any, media_type: str, upload_name: str | None
    ) -> None:
        """Content for an id from :meth:`create`."""
        media = await self._store.get_local_media(media_id)
        now = self._clock.time_msec()
        if media is None or (not media.uploaded and (media.unused_expires_at or 0) <= now):
            raise NotFoundError("Unknown media id, or its time to upload has passed")
        if media.user_id != user_id:
            raise SynapseError(403, "This media id was created by another user", Codes.FORBIDDEN)
        if media.uploaded:
            raise CannotOverwriteMedia()
        length = await self.storage.commit(body, self.storage.paths.local_media(media_id))
        if not await self._store.complete_pending_media(
            media_id, self._clock.time_msec(), media_type, length, upload_name
        ):
            # Another upload won, or the id expired while this one was written:
            # the row (and so what is served) is unchanged.
            raise CannotOverwriteMedia()
        logger.info("%s uploaded %s (%s, %d bytes)", user_id, media_id, media_type, length)
        self._uploaded(media_id, media_type)

    def _uploaded(self, media_id: str, media_type: str) -> None:
        for waiter in self._waiting.pop(media_id, []):
            waiter.callback(None)
        if media_type in THUMBNAILABLE_TYPES and self.config.thumbnail_sizes:
            job = defer.ensureDeferred(self._pregenerate(media_id))
            self._jobs.add(job)
            job.addBoth(lambda _: self._jobs.discard(job))

    async def _pregenerate(self, media_id: str) -> None:
        for size in self.config.thumbnail_sizes:
            try:
                await self._generate(media_id, size, animated=False)
            except ThumbnailError as e:
                logger.info("No thumbnails of %s: %s", media_id, e)
                return
            except Exception:
                logger.exception("Making a thumbnail of %s failed", media_id)
                return

    # Deletion (the admin API's, through DELETE_MEDIA)

    async def delete_media(self, request: MediaToDelete) -> MediaDeleted:
        """Serves :data:`DELETE_MEDIA`: each upload's thumbnails, file and
        rows go; the ids that were there."""
        deleted = []
        for media_id in request.media_ids:
            check_identifier_text(media_id, "media_id")
            for info in await self._store.get_thumbnails(media_id):
                await self.storage.delete_local(self._thumbnail_path(media_id, info))
            await self.storage.delete_local(self.storage.paths.local_media(media_id))
            self._uploaded_media.pop(media_id, None)
            if await self._store.delete_local_media_rows(media_id):
                deleted.append(media_id)
        if deleted:
            logger.info("deleted %d media: %s", len(deleted), ", ".join(deleted))
        return MediaDeleted(deleted)

    # Downloads

    async def get_media(self, server_name: str, media_id: str, timeout_ms: int) -> LocalMedia:
        """The metadata of uploaded content, waiting up to ``timeout_ms`` for
        content not yet uploaded (then 504 ``M_NOT_YET_UPLOADED``)."""
        if server_name != self.server_name:
            raise NotFoundError(
                f"Media of other servers ({server_name}) is not fetched by this server"
            )
        if await self._store.is_media_quarantined(media_id):
            # As if it did not exist (an admin quarantined it: never served).
            raise NotFoundError("Unknown media")
        cached = self._uploaded_media.get(media_id)
        if cached is not None:
            self._uploaded_media.move_to_end(media_id)
            return cached
        media = await self._store.get_local_media(media_id)
        if media is None:
            raise NotFoundError("Unknown media")
        if media.uploaded:
            self._uploaded_media[media_id] = media
            if len(self._uploaded_media) > METADATA_CACHE_ENTRIES:
                self._uploaded_media.popitem(last=False)
            return media
        timeout_ms = min(timeout_ms, self.config.max_download_wait_ms)
        deadline = self._clock.time_msec() + timeout_ms
        while not media.uploaded:
            now = self._clock.time_msec()
            if (media.unused_expires_at or 0) <= now:
                raise NotFoundError("Unknown media (its time to upload has passed)")
            if now >= deadline:
                raise SynapseError(504, "Content has not yet been uploaded", "M_NOT_YET_UPLOADED")
            waiter: defer.Deferred[None] = defer.Deferred()
            self._waiting.setdefault(media_id, []).append(waiter)
            try:
                await self._clock.timeout(waiter, (deadline - now) / 1000)
            except defer.TimeoutError:
                pass
            finally:
                waiters = self._waiting.get(media_id, [])
                if waiter in waiters:
                    waiters.remove(waiter)
                if not waiters:
                    self._waiting.pop(media_id, None)
            media = await self._store.get_local_media(media_id) or media
        return media

    async def content_path(self, media: LocalMedia) -> str:
        path = await self.storage.local_path(self.storage.paths.local_media(media.media_id))
        if path is None:
            logger.error("The file of %s is missing from every storage backend", media.media_id)
            raise NotFoundError("The content of this media is missing on the server")
        return path

    # Thumbnails

    def choose_size(self, width: int, height: int, method: str) -> ThumbnailSize:
        """The configured size answering a request (see the module docstring)."""
        sizes = [s for s in self.config.thumbnail_sizes if s.method == method]
        sizes = sizes or list(self.config.thumbnail_sizes)
        if not sizes:
            return ThumbnailSize(width, height, method)
        big_enough = [s for s in sizes if s.width >= width and s.height >= height]
        if big_enough:
            return min(big_enough, key=lambda s: s.width * s.height)
        return max(sizes, key=lambda s: s.width * s.height)

    async def get_thumbnail(
        self, media: LocalMedia, width: int, height: int, method: str, animated: bool
    ) -> tuple[ThumbnailInfo, str]:
        """The thumbnail answering a request, made now if need be, and its file."""
        check_thumbnailable(media.media_type)
        size = self.choose_size(width, height, method)
        info = matching_thumbnail(await self._store.get_thumbnails(media.media_id), size, animated)
        if info is not None:
            path = await self.storage.local_path(self._thumbnail_path(media.media_id, info))
            if path is not None:
                return info, path
        try:
            info = await self._generate(media.media_id, size, animated)
        except ThumbnailError as e:
            raise thumbnail_refusal(e) from None
        return info, self.storage.paths.absolute(self._thumbnail_path(media.media_id, info))

    def _thumbnail_path(self, media_id: str, info: ThumbnailInfo) -> str:
        return self.storage.paths.thumbnail(
            media_id, info.width, info.height, info.method, info.animated, info.media_type
        )

    async def _generate(self, media_id: str, size: ThumbnailSize, animated: bool) -> ThumbnailInfo:
        source = await self.storage.local_path(self.storage.paths.local_media(media_id))
        if source is None:
            raise ThumbnailError("The content is missing on the server")
        info, data = await self.render_thumbnail(source, size, animated)
        await self.storage.write_file(self._thumbnail_path(media_id, info), data)
        await self._store.store_thumbnail(media_id, info)
        return info

    async def render_thumbnail(
        self, source: str, size: ThumbnailSize, animated: bool
    ) -> tuple[ThumbnailInfo, bytes]:
        """A thumbnail of the image file ``source`` (in the thread pool, at
        most :data:`THUMBNAIL_CONCURRENCY` at once): its row and bytes.
        :class:`ThumbnailError` if it is not an image that can be read."""
        config = self.config
        thumbnail: Thumbnail = await self._thumbnail_slots.run(
            threads.deferToThreadPool,
            self._reactor,
            self._reactor.getThreadPool(),
            make_thumbnail,
            source,
            size.width,
            size.height,
            size.method,
            animated,
            config.max_image_pixels,
            config.max_thumbnail_frames,
        )
        info = ThumbnailInfo(
            width=size.width,
            height=size.height,
            method=size.method,
            animated=animated,
            actual_width=thumbnail.width,
            actual_height=thumbnail.height,
            media_type=thumbnail.media_type,
            media_length=len(thumbnail.data),
        )
        return info, thumbnail.data


def matching_thumbnail(
    infos: list[ThumbnailInfo], size: ThumbnailSize, animated: bool
) -> ThumbnailInfo | None:
    """The stored thumbnail of ``size`` (animated or not), if there is one."""
    for info in infos:
        if (info.width, info.height, info.method, info.animated) == (
            size.width,
            size.height,
            size.method,
            animated,
        ):
            return info
    return None


def thumbnail_refusal(error: ThumbnailError) -> SynapseError:
    """What a client is told when a thumbnail cannot be made."""
    if error.too_large:
        return SynapseError(413, str(error), Codes.TOO_LARGE)
    return SynapseError(400, str(error), Codes.UNKNOWN)


def check_thumbnailable(media_type: str | None) -> None:
    """A 400 unless thumbnails can be made of ``media_type``."""
    if media_type not in THUMBNAILABLE_TYPES:
        raise SynapseError(
            400, f"Cannot make thumbnails of {media_type or 'unknown'} content", Codes.UNKNOWN
        )
