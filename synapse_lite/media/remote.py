"""Other servers' media, fetched over federation and cached for our users.

A download or thumbnail of ``mxc://other.example/abc`` on the media instance:

1. served from the cache (``remote_media_cache``, files under
   ``remote_content/``) when it has the media;
2. otherwise fetched with the authenticated federation endpoint
   ``GET /_matrix/federation/v1/media/download/abc`` (signed; a
   ``multipart/mixed`` answer whose content part is the bytes or a
   ``Location`` to fetch them from); if the other server answers 404
   ``M_UNRECOGNIZED`` (it predates that endpoint), with the deprecated
   ``GET /_matrix/media/v3/download/other.example/abc?allow_remote=false``
   over the same connection, unsigned, as the spec suggests.

The answer is received into a file in the store's ``tmp/`` as it arrives, at
most ``media.max_upload_size`` of content (more: 502 ``M_TOO_LARGE``), then
the content is copied out of it into a second file, flushed and renamed into
place, and only then is the row written: nothing partial is ever cached or
served. Requests for the same media while it is being fetched wait for that
one fetch. Thumbnails are made here, from the cached file, like those of
uploads (the remote server is not asked for its thumbnails).

``POST /_synapse/admin/v1/purge_media_cache`` asks the media instance
(:data:`PURGE_MEDIA_CACHE`) to delete what was last downloaded before a time.
"""

from __future__ import annotations

import logging
import mmap
import os
import urllib.parse
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from twisted.internet import defer, threads

from synapse_lite.api.errors import Codes, NotFoundError, SynapseError
from synapse_lite.federation.client import FederationRequestError, FederationResponseTooLarge
from synapse_lite.federation.discovery import ServerNameError, parse_server_name
from synapse_lite.http.outbound import AnswerTooLarge, OutboundRequestError
from synapse_lite.media.multipart import (
    FEDERATION_MEDIA_PREFIX,
    MAX_OVERHEAD_BYTES,
    MultipartError,
    boundary_of,
    parse_media_answer,
)
from synapse_lite.media.paths import new_media_id
from synapse_lite.media.repository import (
    check_thumbnailable,
    matching_thumbnail,
    thumbnail_refusal,
)
from synapse_lite.media.thumbnailer import ThumbnailError
from synapse_lite.replication.http.media import MediaCachePurged, MediaCacheToPurge
from synapse_lite.storage.databases.main.remote_media import CachedRemoteMedia

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.federation.client import FederationClient
    from synapse_lite.http.outbound import OutboundHttpClient
    from synapse_lite.media.repository import MediaRepository
    from synapse_lite.storage.databases.main import GenericWorkerStore
    from synapse_lite.storage.databases.main.media import ThumbnailInfo

logger = logging.getLogger(__name__)

#: The deprecated endpoint servers without federation media answer on.
LEGACY_DOWNLOAD_PREFIX = "/_matrix/media/v3/download"
#: A cached media's last access is rewritten at most this often (a download
#: is then not a database write).
TOUCH_INTERVAL_MS = 10 * 60 * 1000
#: Longest a remote server is asked to wait for content not yet uploaded.
MAX_REMOTE_WAIT_MS = 60_000
_COPY_CHUNK = 1024 * 1024


def _media_type(value: str | None) -> str:
    """A content type worth keeping (printable ASCII, at most 255
    characters), else ``application/octet-stream``."""
    value = (value or "").strip()
    if not value or len(value) > 255 or not value.isascii() or not value.isprintable():
        return "application/octet-stream"
    return value


def file_name_of(disposition: str | None) -> str | None:
    """The file name a ``Content-Disposition`` header gives (``filename*``
    before ``filename``), or None; names with control characters, path
    separators or over 255 characters are dropped."""
    if not disposition:
        return None
    names: dict[str, str] = {}
    for param in disposition.split(";")[1:]:
        key, _, value = param.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        names[key.strip().lower()] = value
    name: str | None = None
    extended = names.get("filename*")
    if extended is not None:
        charset, _, rest = extended.partition("'")
        _, _, encoded = rest.partition("'")
        if charset.lower() in ("utf-8", "utf8") and encoded:
            try:
                name = urllib.parse.unquote(encoded, errors="strict")
            except UnicodeDecodeError:
                return None
    if name is None:
        name = names.get("filename")
    if not name or len(name) > 255 or "/" in name or not name.isprintable():
        return None
    return name


def _copy_range(source: str, start: int, end: int, destination: IO[bytes]) -> None:
    with open(source, "rb") as f:
        f.seek(start)
        left = end - start
        while left > 0:
            chunk = f.read(min(_COPY_CHUNK, left))
            if not chunk:
                raise MultipartError("the answer is shorter than its parts say")
            destination.write(chunk)
            left -= len(chunk)
    destination.flush()


def _read_answer(path: str, boundary: bytes) -> Any:
    """Parse the multipart answer in the file at ``path`` (mapped, not read)."""
    size = os.path.getsize(path)
    if size == 0:
        raise MultipartError("the answer is empty")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return parse_media_answer(data, boundary)


class RemoteMediaCache:
    """Fetches, caches and serves other servers' media (see the module
    docstring). Runs on the media instance only."""

    def __init__(
        self,
        *,
        repository: MediaRepository,
        store: GenericWorkerStore,
        client: Callable[[], FederationClient],
        outbound: OutboundHttpClient,
        clock: Clock,
        reactor: Any,
    ) -> None:
        self._repository = repository
        self._storage = repository.storage
        self._store = store
        #: Made at the first fetch (a worker's reads the signing key then).
        self._client = client
        self._outbound = outbound
        self._clock = clock
        self._reactor = reactor
        self._max_bytes = repository.config.max_upload_size
        #: (origin, media id) -> the fetches waiting for the one under way.
        self._fetching: dict[tuple[str, str], list[defer.Deferred[CachedRemoteMedia]]] = {}

    def _in_thread(self, f: Any, *args: Any) -> Any:
        return threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(), f, *args)

    # Downloads

    async def get_media(
        self, origin: str, media_id: str, timeout_ms: int
    ) -> tuple[CachedRemoteMedia, str]:
        """The cached media and its file, fetched first if need be. The
        caller has checked ``media_id``."""
        try:
            parse_server_name(origin)
        except ServerNameError as e:
            raise SynapseError(
                400, f"Invalid server name in the media URI: {e}", Codes.INVALID_PARAM
            ) from None
        media = await self._store.get_cached_remote_media(origin, media_id)
        if media is not None:
            path = await self._storage.local_path(
                self._storage.paths.remote_media(media.filesystem_id)
            )
            if path is not None:
                now = self._clock.time_msec()
                if now - media.last_access_ts > TOUCH_INTERVAL_MS:
                    await self._store.touch_cached_remote_media(origin, media_id, now)
                return media, path
            logger.warning(
                "The cached file of mxc://%s/%s is missing: fetching it again", origin, media_id
            )
            await self._store.delete_cached_remote_media(origin, media_id)
        media = await self._fetch_once(origin, media_id, timeout_ms)
        path = await self._storage.local_path(self._storage.paths.remote_media(media.filesystem_id))
        if path is None:
            raise NotFoundError("The content of this media is missing on the server")
        return media, path

    async def _fetch_once(self, origin: str, media_id: str, timeout_ms: int) -> CachedRemoteMedia:
        """One fetch per media at a time: later callers wait for the first's."""
        key = (origin, media_id)
        waiting = self._fetching.get(key)
        if waiting is not None:
            waiter: defer.Deferred[CachedRemoteMedia] = defer.Deferred()
            waiting.append(waiter)
            return await waiter
        self._fetching[key] = []
        try:
            media = await self._fetch(origin, media_id, timeout_ms)
        except Exception as e:
            for waiter in self._fetching.pop(key, []):
                waiter.errback(e)
            raise
        for waiter in self._fetching.pop(key, []):
            waiter.callback(media)
        return media

    async def _fetch(self, origin: str, media_id: str, timeout_ms: int) -> CachedRemoteMedia:
        content = self._storage.temporary_file()
        try:
            media_type, disposition = await self._receive(origin, media_id, timeout_ms, content)
            filesystem_id = new_media_id()
            length = await self._storage.commit(
                content, self._storage.paths.remote_media(filesystem_id)
            )
        except BaseException:
            # Nothing partial stays: the file in tmp/ goes (commit moved it,
            # or removed it, if it got that far).
            self._storage.discard(content)
            raise
        now = self._clock.time_msec()
        media = CachedRemoteMedia(
            media_origin=origin,
            media_id=media_id,
            filesystem_id=filesystem_id,
            media_type=_media_type(media_type),
            media_length=length,
            upload_name=file_name_of(disposition),
            created_ts=now,
            last_access_ts=now,
        )
        if not await self._store.store_cached_remote_media(media):
            # Another process cached it meanwhile (an operator running two
            # media instances by mistake): theirs is served, ours goes.
            await self._storage.delete_local(self._storage.paths.remote_media(filesystem_id))
            existing = await self._store.get_cached_remote_media(origin, media_id)
            if existing is not None:
                return existing
        logger.info("Cached mxc://%s/%s (%s, %d bytes)", origin, media_id, media.media_type, length)
        return media

    async def _receive(
        self, origin: str, media_id: str, timeout_ms: int, content: IO[bytes]
    ) -> tuple[str | None, str | None]:
        """The media's bytes into ``content``; its type and disposition.
        Every failure is the error our client is answered with."""
        received = self._storage.temporary_file()
        try:
            try:
                return await self._fetch_federation(origin, media_id, timeout_ms, received, content)
            except FederationRequestError as e:
                errcode = e.body.get("errcode") if isinstance(e.body, dict) else None
                if e.code != 404 or errcode != Codes.UNRECOGNIZED:
                    raise
            logger.info(
                "%s has no federation media endpoint: fetching %s from the deprecated one",
                origin,
                media_id,
            )
            content.seek(0)
            content.truncate()
            return await self._fetch_legacy(origin, media_id, timeout_ms, content)
        except FederationResponseTooLarge:
            raise self._too_large(origin) from None
        except FederationRequestError as e:
            raise self._refusal(origin, media_id, e) from None
        except MultipartError as e:
            logger.warning(
                "%s answered media %s with a bad multipart body: %s", origin, media_id, e
            )
            raise SynapseError(
                502, f"{origin} answered with a malformed media response: {e}", Codes.UNKNOWN
            ) from None
        finally:
            self._storage.discard(received)

    async def _fetch_federation(
        self,
        origin: str,
        media_id: str,
        timeout_ms: int,
        received: IO[bytes],
        content: IO[bytes],
    ) -> tuple[str | None, str | None]:
        """The authenticated endpoint: the answer into ``received``, its
        content into ``content``; the content's type and disposition."""
        wait = min(timeout_ms, MAX_REMOTE_WAIT_MS)
        path = (
            f"{FEDERATION_MEDIA_PREFIX}/download/{urllib.parse.quote(media_id)}?timeout_ms={wait}"
        )
        headers = await self._client().download(
            origin, path, received, self._max_bytes + MAX_OVERHEAD_BYTES
        )
        boundary = boundary_of(headers.get("content-type"))
        received.flush()
        answer = await self._in_thread(_read_answer, received.name, boundary)
        if answer.location is not None:
            return await self._follow(origin, answer.location, content)
        if answer.end - answer.start > self._max_bytes:
            raise FederationResponseTooLarge(origin, self._max_bytes)
        await self._in_thread(_copy_range, received.name, answer.start, answer.end, content)
        return answer.media_type, answer.disposition

    async def _follow(
        self, origin: str, location: str, content: IO[bytes]
    ) -> tuple[str | None, str | None]:
        """The content part named a URL: fetched like any URL a user names
        (address checks, certificate checks), held in memory up to the limit."""
        if urllib.parse.urlsplit(location).scheme not in ("http", "https"):
            raise MultipartError(f"the content part's Location {location[:100]!r} is not http(s)")
        try:
            answer = await self._outbound.request(
                "GET", location, max_bytes=self._max_bytes, follow_redirects=True, timeout=60.0
            )
        except AnswerTooLarge:
            raise FederationResponseTooLarge(origin, self._max_bytes) from None
        except OutboundRequestError as e:
            raise FederationRequestError(origin, f"its media's Location failed: {e}") from e
        if answer.code != 200:
            raise FederationRequestError(
                origin, f"its media's Location answered {answer.code}", answer.code, answer.json()
            )
        await self._in_thread(content.write, answer.body)
        return answer.headers.get("content-type"), answer.headers.get("content-disposition")

    async def _fetch_legacy(
        self, origin: str, media_id: str, timeout_ms: int, content: IO[bytes]
    ) -> tuple[str | None, str | None]:
        wait = min(timeout_ms, MAX_REMOTE_WAIT_MS)
        path = (
            f"{LEGACY_DOWNLOAD_PREFIX}/{urllib.parse.quote(origin)}/{urllib.parse.quote(media_id)}"
            f"?allow_remote=false&timeout_ms={wait}"
        )
        headers = await self._client().download(
            origin, path, content, self._max_bytes, signed=False
        )
        return headers.get("content-type"), headers.get("content-disposition")

    def _too_large(self, origin: str) -> SynapseError:
        return SynapseError(
            502,
            f"The media on {origin} is larger than this server's limit"
            f" ({self._max_bytes} bytes, media.max_upload_size)",
            Codes.TOO_LARGE,
        )

    @staticmethod
    def _refusal(origin: str, media_id: str, error: FederationRequestError) -> SynapseError:
        errcode = error.body.get("errcode") if isinstance(error.body, dict) else None
        if error.code == 404:
            return NotFoundError(f"{origin} has no media {media_id}")
        if error.code == 504 and errcode == "M_NOT_YET_UPLOADED":
            return SynapseError(504, f"{origin} has not received this media's content yet", errcode)
        logger.warning("Fetching media %s from %s failed: %s", media_id, origin, error)
        return SynapseError(502, f"Could not fetch the media from {origin}: {error}", Codes.UNKNOWN)

    # Thumbnails

    async def get_thumbnail(
        self, media: CachedRemoteMedia, width: int, height: int, method: str, animated: bool
    ) -> tuple[ThumbnailInfo, str]:
        """A thumbnail of cached media answering a request (sizes chosen as
        for uploads), made now if need be, and its file."""
        check_thumbnailable(media.media_type)
        size = self._repository.choose_size(width, height, method)
        origin, media_id = media.media_origin, media.media_id
        existing = matching_thumbnail(
            await self._store.get_remote_media_thumbnails(origin, media_id), size, animated
        )
        if existing is not None:
            path = await self._storage.local_path(self._thumbnail_path(media, existing))
            if path is not None:
                return existing, path
        source = await self._storage.local_path(
            self._storage.paths.remote_media(media.filesystem_id)
        )
        if source is None:
            raise NotFoundError("The content of this media is missing on the server")
        try:
            info, data = await self._repository.render_thumbnail(source, size, animated)
        except ThumbnailError as e:
            raise thumbnail_refusal(e) from None
        relative = self._thumbnail_path(media, info)
        await self._storage.write_file(relative, data)
        await self._store.store_remote_media_thumbnail(origin, media_id, info)
        return info, self._storage.paths.absolute(relative)

    def _thumbnail_path(self, media: CachedRemoteMedia, info: ThumbnailInfo) -> str:
        return self._storage.paths.remote_thumbnail(
            media.filesystem_id,
            info.width,
            info.height,
            info.method,
            info.animated,
            info.media_type,
        )

    # Purging (the admin API's, through PURGE_MEDIA_CACHE)

    async def purge(self, request: MediaCacheToPurge) -> MediaCachePurged:
        """Serves :data:`PURGE_MEDIA_CACHE`: cached media last downloaded
        before ``before_ts`` goes, thumbnails, file and rows."""
        deleted = 0
        for media in await self._store.get_remote_media_accessed_before(request.before_ts):
            origin, media_id = media.media_origin, media.media_id
            for info in await self._store.get_remote_media_thumbnails(origin, media_id):
                await self._storage.delete_local(self._thumbnail_path(media, info))
            await self._storage.delete_local(self._storage.paths.remote_media(media.filesystem_id))
            await self._store.delete_cached_remote_media(origin, media_id)
            deleted += 1
        if deleted:
            logger.info(
                "Purged %d cached remote media last used before %d", deleted, request.before_ts
            )
        return MediaCachePurged(deleted)
