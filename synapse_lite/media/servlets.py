"""The media endpoints, and what every other process answers on media paths.

Served by the media instance (``media_instance``):

* ``POST /_matrix/media/v3/upload``, ``POST /_matrix/media/v1/create`` and
  ``PUT /_matrix/media/v3/upload/{serverName}/{mediaId}``: bodies are received
  straight into a file in the store's ``tmp/`` (:class:`UploadRoute`), up to
  ``media.max_upload_size``, then renamed into place;
* ``GET /_matrix/client/v1/media/download/{serverName}/{mediaId}[/{fileName}]``,
  ``.../thumbnail/...`` and ``.../config`` (authenticated);
* the deprecated unauthenticated ``/_matrix/media/v3/download``,
  ``thumbnail`` and ``config``, only with
  ``media.legacy_unauthenticated_endpoints``;
* ``GET .../preview_url`` (both prefixes, with an access token), with
  ``media.url_previews`` (``url_preview.py``);
* ``GET /_matrix/federation/v1/media/download/{mediaId}`` and
  ``.../thumbnail/{mediaId}`` for other servers (signed), answered
  ``multipart/mixed`` (``multipart.py``).

Another server's media asked for by our clients is fetched and cached by
``remote.py``.

Downloads are streamed from the file with a producer (no file is read into
memory) with the safety headers of ``docs/media.md``.
"""

from __future__ import annotations

import io
import logging
import re
import unicodedata
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

import attr
from twisted.protocols.basic import FileSender
from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.federation.server import authenticate_request
from synapse_lite.http.server import (
    JsonResource,
    StreamedResponse,
    UploadRoute,
    query_int,
    query_string,
)
from synapse_lite.media import multipart
from synapse_lite.media.paths import check_media_id
from synapse_lite.media.storage import MediaStorage

if TYPE_CHECKING:
    from synapse_lite.federation.keyring import Keyring
    from synapse_lite.handlers.auth import AuthHandler
    from synapse_lite.media.remote import RemoteMediaCache
    from synapse_lite.media.repository import MediaRepository
    from synapse_lite.media.url_preview import UrlPreviewer
    from synapse_lite.storage.databases.main.media import ThumbnailInfo

logger = logging.getLogger(__name__)

LEGACY_PREFIX = "/_matrix/media/(?:r0|v3)"
CLIENT_MEDIA_PREFIX = "/_matrix/client/v1/media"
#: Every media path, whichever process it reaches.
MEDIA_PATHS = re.compile(r"/_matrix/(?:media|client/v1/media|federation/v1/media)(?:/.*)?")

_SERVER_AND_ID = "/(?P<server_name>[^/]+)/(?P<media_id>[^/]+)"

#: What clients may display inline (the spec's "serving inline content");
#: anything else is served as an attachment.
INLINE_TYPES = frozenset(
    [
        "text/css",
        "text/plain",
        "text/csv",
        "application/json",
        "application/ld+json",
        "image/jpeg",
        "image/gif",
        "image/png",
        "image/apng",
        "image/webp",
        "image/avif",
        "video/mp4",
        "video/webm",
        "video/ogg",
        "video/quicktime",
        "audio/mp4",
        "audio/webm",
        "audio/aac",
        "audio/mpeg",
        "audio/ogg",
        "audio/wave",
        "audio/wav",
        "audio/x-wav",
        "audio/x-pn-wav",
        "audio/flac",
        "audio/x-flac",
    ]
)

#: Served content can never run script in the server's origin, whatever it is.
CONTENT_SECURITY_POLICY = (
    b"sandbox; default-src 'none'; script-src 'none'; plugin-types application/pdf;"
    b" style-src 'unsafe-inline'; media-src 'self'; object-src 'self';"
)

MAX_NAME_LENGTH = 255
_TOKEN = re.compile(r"[A-Za-z0-9!#$&+.^_`|~-]+")
_CHUNK_SIZE = 256 * 1024
DEFAULT_DOWNLOAD_WAIT_MS = 20_000


class _FileSender(FileSender):
    CHUNK_SIZE = _CHUNK_SIZE


def check_file_name(name: str, where: str) -> None:
    """A 400 for a file name with control characters or over 255 characters."""
    if len(name) > MAX_NAME_LENGTH:
        raise SynapseError(
            400, f"The {where} is longer than {MAX_NAME_LENGTH} characters", Codes.INVALID_PARAM
        )
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in name):
        raise SynapseError(400, f"The {where} contains control characters", Codes.INVALID_PARAM)


def upload_media_type(request: Request) -> str:
    """The upload's ``Content-Type`` (``application/octet-stream`` if none)."""
    raw = request.getHeader("Content-Type")
    if not raw:
        return "application/octet-stream"
    if len(raw) > MAX_NAME_LENGTH or not raw.isascii() or not raw.isprintable():
        raise SynapseError(
            400,
            "Content-Type must be printable ASCII of at most 255 characters",
            Codes.INVALID_PARAM,
        )
    return raw.strip()


def content_disposition(media_type: str, file_name: str | None) -> bytes:
    """``inline`` for the types clients may show inline, else ``attachment``;
    the file name quoted as RFC 6266 says (``filename*`` when not plain ASCII)."""
    essence = media_type.split(";", 1)[0].strip().lower()
    kind = "inline" if essence in INLINE_TYPES else "attachment"
    if not file_name:
        return kind.encode("ascii")
    if _TOKEN.fullmatch(file_name):
        return f'{kind}; filename="{file_name}"'.encode("ascii")
    encoded = urllib.parse.quote(file_name, safe="")
    return f"{kind}; filename*=utf-8''{encoded}".encode("ascii")


class FileResponse(StreamedResponse):
    """A file on disk, streamed to the client by a producer; with
    ``boundary``, framed as the federation media endpoints' ``multipart/mixed``
    answer (``multipart.py``: the metadata part, then the file as the content
    part, which carries its type and disposition)."""

    def __init__(
        self, path: str, media_type: str, disposition: bytes, boundary: str | None = None
    ) -> None:
        self._path = path
        self._media_type = media_type
        self._disposition = disposition
        self._boundary = boundary

    async def send(self, request: Request) -> None:
        f: BinaryIO = open(self._path, "rb")  # closed below, after streaming
        try:
            length = f.seek(0, 2)
            f.seek(0)
            content_type, disposition = self._media_type.encode("ascii"), self._disposition
            head = tail = b""
            if self._boundary is not None:
                head = multipart.answer_head(
                    self._boundary,
                    {},
                    {"Content-Type": content_type, "Content-Disposition": disposition},
                )
                tail = multipart.answer_tail(self._boundary)
                content_type = multipart.content_type_header(self._boundary)
            request.setResponseCode(200)
            for name, value in (
                (b"Content-Type", content_type),
                (b"Content-Length", str(len(head) + length + len(tail)).encode("ascii")),
                (b"Content-Disposition", disposition),
                (b"Content-Security-Policy", CONTENT_SECURITY_POLICY),
                (b"X-Content-Type-Options", b"nosniff"),
                (b"Cross-Origin-Resource-Policy", b"cross-origin"),
                (b"Access-Control-Allow-Origin", b"*"),
                (b"Cache-Control", b"private, max-age=86400"),
            ):
                if name == b"Content-Disposition" and self._boundary is not None:
                    continue  # the content part's header
                request.setHeader(name, value)
            if request.method == b"HEAD" or length + len(head) == 0:
                request.finish()
                return
            if head:
                request.write(head)
            sender = _FileSender()
            request.notifyFinish().addErrback(lambda _: sender.stopProducing())
            try:
                await sender.beginFileTransfer(f, request)
            except Exception:
                if request._disconnected:
                    return  # the client went away: nothing more to do
                raise
            if not request._disconnected:
                if tail:
                    request.write(tail)
                request.finish()
        finally:
            f.close()


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ThumbnailQuery:
    """A thumbnail request's parameters, checked."""

    width: int
    height: int
    method: str
    animated: bool
    timeout_ms: int

    @classmethod
    def of(cls, request: Request) -> ThumbnailQuery:
        width = query_int(request, "width", minimum=1, maximum=10_000)
        height = query_int(request, "height", minimum=1, maximum=10_000)
        if width is None or height is None:
            raise SynapseError(400, "width and height are required", Codes.MISSING_PARAM)
        method = query_string(request, "method", "scale")
        if method not in ("crop", "scale"):
            raise SynapseError(400, "method must be 'crop' or 'scale'", Codes.INVALID_PARAM)
        animated = query_string(request, "animated", "false")
        if animated not in ("true", "false"):
            raise SynapseError(400, "animated must be 'true' or 'false'", Codes.INVALID_PARAM)
        return cls(width, height, method, animated == "true", download_timeout_ms(request))


def download_timeout_ms(request: Request) -> int:
    timeout_ms = query_int(request, "timeout_ms", DEFAULT_DOWNLOAD_WAIT_MS, minimum=0)
    assert timeout_ms is not None
    return timeout_ms


class MediaServlets:
    """The media endpoints of the media instance."""

    def __init__(
        self,
        repository: MediaRepository,
        auth: AuthHandler,
        previewer: UrlPreviewer | None,
        *,
        remote: RemoteMediaCache | None = None,
        keyring: Callable[[], Keyring] | None = None,
    ) -> None:
        """``remote``: fetches other servers' media (without it, their media
        is 404); ``keyring``: checks other servers' signatures (without it,
        the federation media endpoints are not served)."""
        self._repository = repository
        self._auth = auth
        self._config = repository.config
        self._previewer = previewer
        self._remote = remote
        self._keyring = keyring

    def upload_routes(self) -> list[UploadRoute]:
        """Upload bodies go into the store's ``tmp/``, up to the upload limit."""
        storage = self._repository.storage
        return [
            UploadRoute(
                method,
                re.compile(pattern),
                self._config.max_upload_size,
                storage.temporary_file,
                MediaStorage.discard,
            )
            for method, pattern in (
                (b"POST", LEGACY_PREFIX + "/upload"),
                (b"PUT", LEGACY_PREFIX + "/upload/[^/]+/[^/]+"),
            )
        ]

    def register(self, resource: JsonResource) -> None:
        r = resource.register_paths
        r("POST", LEGACY_PREFIX + "/upload", self.upload, "media_upload")
        r("PUT", LEGACY_PREFIX + "/upload" + _SERVER_AND_ID, self.upload_to, "media_upload_to")
        r("POST", "/_matrix/media/v1/create", self.create, "media_create")
        for prefix, authenticated in ((CLIENT_MEDIA_PREFIX, True), (LEGACY_PREFIX, False)):
            tag = "" if authenticated else "_legacy"

            async def download(
                request: Request,
                server_name: str,
                media_id: str,
                file_name: str | None = None,
                authenticated: bool = authenticated,
            ) -> tuple[int, Any]:
                return await self.download(request, server_name, media_id, file_name, authenticated)

            async def thumbnail(
                request: Request,
                server_name: str,
                media_id: str,
                authenticated: bool = authenticated,
            ) -> tuple[int, Any]:
                return await self.thumbnail(request, server_name, media_id, authenticated)

            async def config(
                request: Request, authenticated: bool = authenticated
            ) -> tuple[int, Any]:
                return await self.config(request, authenticated)

            r("GET", prefix + "/download" + _SERVER_AND_ID, download, "media_download" + tag)
            r(
                "GET",
                prefix + "/download" + _SERVER_AND_ID + "/(?P<file_name>[^/]+)",
                download,
                "media_download" + tag,
            )
            r("GET", prefix + "/thumbnail" + _SERVER_AND_ID, thumbnail, "media_thumbnail" + tag)
            r("GET", prefix + "/config", config, "media_config" + tag)
        # Relayed federation media requests reach the media instance here.
        self.register_federation(resource)
        # The deprecated path of previews always needed an access token too.
        for prefix in (CLIENT_MEDIA_PREFIX, LEGACY_PREFIX):
            r("GET", prefix + "/preview_url", self.preview_url, "media_preview_url")

    async def _check_access(self, request: Request, authenticated: bool) -> None:
        if authenticated:
            await self._auth.get_user_by_req(request)
        elif not self._config.legacy_unauthenticated_endpoints:
            raise SynapseError(
                404,
                "The unauthenticated media endpoints are turned off on this server: use"
                f" {CLIENT_MEDIA_PREFIX}/... with an access token",
                Codes.NOT_FOUND,
            )

    # Uploads

    def _upload_name(self, request: Request) -> str | None:
        name = query_string(request, "filename")
        if name:
            check_file_name(name, "filename")
        return name or None

    async def upload(self, request: Request) -> tuple[int, Any]:
        requester = await self._auth.get_user_by_req(request)
        self._repository.check_upload_rate(requester.user_id)
        media_type, upload_name = upload_media_type(request), self._upload_name(request)
        uri = await self._repository.upload(
            requester.user_id, request.content, media_type, upload_name
        )
        return 200, {"content_uri": uri}

    async def create(self, request: Request) -> tuple[int, Any]:
        requester = await self._auth.get_user_by_req(request)
        self._repository.check_upload_rate(requester.user_id)
        uri, expires_at = await self._repository.create(requester.user_id)
        return 200, {"content_uri": uri, "unused_expires_at": expires_at}

    async def upload_to(self, request: Request, server_name: str, media_id: str) -> tuple[int, Any]:
        requester = await self._auth.get_user_by_req(request)
        check_media_id(media_id)
        if server_name != self._repository.server_name:
            raise SynapseError(404, "This media id is not this server's", Codes.NOT_FOUND)
        self._repository.check_upload_rate(requester.user_id)
        media_type, upload_name = upload_media_type(request), self._upload_name(request)
        await self._repository.upload_to(
            requester.user_id, media_id, request.content, media_type, upload_name
        )
        return 200, {}

    # Downloads

    async def download(
        self,
        request: Request,
        server_name: str,
        media_id: str,
        file_name: str | None,
        authenticated: bool,
    ) -> tuple[int, Any]:
        await self._check_access(request, authenticated)
        check_media_id(media_id)
        if file_name is not None:
            check_file_name(file_name, "file name")
        timeout_ms = download_timeout_ms(request)
        if server_name != self._repository.server_name and self._remote is not None:
            if not authenticated and query_string(request, "allow_remote") == "false":
                raise SynapseError(
                    404, "Not a local media id (allow_remote=false)", Codes.NOT_FOUND
                )
            remote, path = await self._remote.get_media(server_name, media_id, timeout_ms)
            media_type, upload_name = remote.media_type, remote.upload_name
        else:
            media = await self._repository.get_media(server_name, media_id, timeout_ms)
            path = await self._repository.content_path(media)
            media_type = media.media_type or "application/octet-stream"
            upload_name = media.upload_name
        disposition = content_disposition(media_type, file_name or upload_name)
        return 200, FileResponse(path, media_type, disposition)

    async def thumbnail(
        self, request: Request, server_name: str, media_id: str, authenticated: bool
    ) -> tuple[int, Any]:
        await self._check_access(request, authenticated)
        check_media_id(media_id)
        q = ThumbnailQuery.of(request)
        if server_name != self._repository.server_name and self._remote is not None:
            remote, _ = await self._remote.get_media(server_name, media_id, q.timeout_ms)
            info, path = await self._remote.get_thumbnail(
                remote, q.width, q.height, q.method, q.animated
            )
        else:
            info, path = await self._local_thumbnail(media_id, q, server_name)
        return 200, FileResponse(path, info.media_type, _thumbnail_disposition(path))

    async def _local_thumbnail(
        self, media_id: str, q: ThumbnailQuery, server_name: str | None = None
    ) -> tuple[ThumbnailInfo, str]:
        media = await self._repository.get_media(
            server_name or self._repository.server_name, media_id, q.timeout_ms
        )
        return await self._repository.get_thumbnail(media, q.width, q.height, q.method, q.animated)

    # Federation: other servers downloading our media (signed requests)

    def register_federation(self, resource: JsonResource) -> None:
        """``GET /_matrix/federation/v1/media/download/{mediaId}`` and
        ``.../thumbnail/{mediaId}``: our media, as ``multipart/mixed``."""
        if self._keyring is None:
            return
        prefix = multipart.FEDERATION_MEDIA_PREFIX
        r = resource.register_paths
        r(
            "GET",
            prefix + "/download/(?P<media_id>[^/]+)",
            self.federation_download,
            "federation.media_download",
        )
        r(
            "GET",
            prefix + "/thumbnail/(?P<media_id>[^/]+)",
            self.federation_thumbnail,
            "federation.media_thumbnail",
        )

    async def _federation_origin(self, request: Request) -> str:
        assert self._keyring is not None
        return await authenticate_request(
            self._keyring(), self._repository.server_name, request, None
        )

    async def federation_download(self, request: Request, media_id: str) -> tuple[int, Any]:
        origin = await self._federation_origin(request)
        check_media_id(media_id)
        timeout_ms = download_timeout_ms(request)
        media = await self._repository.get_media(self._repository.server_name, media_id, timeout_ms)
        path = await self._repository.content_path(media)
        media_type = media.media_type or "application/octet-stream"
        disposition = content_disposition(media_type, media.upload_name)
        logger.info("%s downloads %s", origin, media_id)
        return 200, FileResponse(path, media_type, disposition, multipart.new_boundary())

    async def federation_thumbnail(self, request: Request, media_id: str) -> tuple[int, Any]:
        await self._federation_origin(request)
        check_media_id(media_id)
        info, path = await self._local_thumbnail(media_id, ThumbnailQuery.of(request))
        return 200, FileResponse(
            path, info.media_type, _thumbnail_disposition(path), multipart.new_boundary()
        )

    async def preview_url(self, request: Request) -> tuple[int, Any]:
        requester = await self._auth.get_user_by_req(request)
        if self._previewer is None:
            raise SynapseError(
                404, "URL previews are turned off on this server", Codes.UNRECOGNIZED
            )
        query_int(request, "ts", None, minimum=0)  # a preference we may ignore
        self._repository.check_upload_rate(requester.user_id)
        url = query_string(request, "url")
        return 200, await self._previewer.preview(requester.user_id, url or "")

    async def config(self, request: Request, authenticated: bool) -> tuple[int, Any]:
        await self._check_access(request, authenticated)
        return 200, {"m.upload.size": self._config.max_upload_size}


def _thumbnail_disposition(path: str) -> bytes:
    extension = path.rsplit(".", 1)[-1]
    return f'inline; filename="thumbnail.{extension}"'.encode("ascii")


class _DiscardedBody(io.BytesIO):
    """A request body nobody will read: written and forgotten."""

    def write(self, data: Any) -> int:
        return len(data)


class MediaElsewhere:
    """What a process that is not the media instance answers on media paths:
    an error naming the process that serves them (the router, or the
    operator's proxy, should have sent the request there)."""

    def __init__(self, me: str, media_instance: str, media_url: str | None) -> None:
        where = f" ({media_url})" if media_url else ""
        self._message = (
            f"Media is served by the process {media_instance!r}{where}, not by {me!r}: send"
            " /_matrix/media/ and /_matrix/client/v1/media/ requests there"
        )

    def upload_routes(self) -> list[UploadRoute]:
        """Upload bodies are thrown away as they arrive (so the answer is
        this error, not 413 for a body over the usual limit)."""
        return [
            UploadRoute(method, MEDIA_PATHS, 2**62, _DiscardedBody, lambda body: None)
            for method in (b"POST", b"PUT")
        ]

    def register(self, resource: JsonResource) -> None:
        async def refuse(request: Request) -> tuple[int, Any]:
            # 421 Misdirected Request: the request reached a process that
            # cannot answer it; nothing was read or stored.
            raise SynapseError(421, self._message, Codes.UNRECOGNIZED)

        for method in ("GET", "POST", "PUT", "DELETE", "HEAD"):
            resource.register_paths(method, MEDIA_PATHS.pattern, refuse, "media_elsewhere")

    def register_federation(self, resource: JsonResource) -> None:
        """On a federation listener: federation media paths are refused the
        same way (only the media instance has the files)."""
        self.register(resource)
