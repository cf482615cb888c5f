"""URL previews (``GET /_matrix/client/v1/media/preview_url``), on the media
instance, when ``media.url_previews`` is on.

The page is fetched with the client for user-named servers
(``http/outbound.py``): never from an address in
``outbound_requests.ip_range_denylist`` (private and reserved ranges by
default) unless ``ip_range_allowlist`` has it, redirects checked alike. An
HTML page gives its OpenGraph ``og:*`` properties (``og:title`` and
``og:description`` falling back to ``<title>`` and the description meta
tag); its ``og:image``, or an image URL itself, is fetched the same way and
stored as this server's media: ``og:image`` is then its ``mxc://`` URI, with
``matrix:image:size``, ``og:image:width`` and ``og:image:height``. Answers are
kept for an hour per URL (``ts`` is a preference the spec lets us ignore).
"""

from __future__ import annotations

import io
import logging
import re
import time
import urllib.parse
from collections import OrderedDict
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any

from PIL import Image

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.http.outbound import AnswerTooLarge, OutboundAnswer, OutboundRequestError

if TYPE_CHECKING:
    from synapse_lite.http.outbound import OutboundHttpClient
    from synapse_lite.media.repository import MediaRepository

logger = logging.getLogger(__name__)

MAX_URL_LENGTH = 2048
#: The most of a page read (its head is what matters).
MAX_PAGE_BYTES = 2 * 1024 * 1024
#: How long a preview is kept, and how many are.
CACHE_SECONDS = 3600.0
CACHE_ENTRIES = 1000
#: Properties of a page kept, and their length.
MAX_PROPERTIES = 50
MAX_VALUE_LENGTH = 1000
_CHARSET = re.compile(r"charset\s*=\s*[\"']?([A-Za-z0-9_.:-]+)", re.IGNORECASE)


class _HeadParser(HTMLParser):
    """Collects a page's ``og:*`` meta properties, its description meta tag,
    its ``<title>`` and its declared charset."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.properties: dict[str, str] = {}
        self.description: str | None = None
        self.title: str | None = None
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k.lower(): v for k, v in attrs if v is not None}
        if tag == "title" and self.title is None:
            self._in_title = True
        if tag != "meta":
            return
        content = values.get("content")
        key = values.get("property") or values.get("name")
        if content is None or key is None:
            return
        key = key.strip()
        if key.startswith("og:") and len(self.properties) < MAX_PROPERTIES:
            self.properties.setdefault(key, content.strip()[:MAX_VALUE_LENGTH])
        elif key.lower() == "description" and self.description is None:
            self.description = content.strip()[:MAX_VALUE_LENGTH]

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title = ((self.title or "") + data)[:MAX_VALUE_LENGTH]


def check_preview_url(url: str | None) -> str:
    """An http(s) URL a user may ask to preview, or a 400."""
    if not url:
        raise SynapseError(400, "'url' is required", Codes.MISSING_PARAM)
    parsed = urllib.parse.urlsplit(url)
    if len(url) > MAX_URL_LENGTH or parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise SynapseError(
            400, f"'url' must be an http(s) URL of at most {MAX_URL_LENGTH} characters",
            Codes.INVALID_PARAM,
        )  # fmt: skip
    return url


def page_properties(html: bytes, content_type: str) -> dict[str, str]:
    """The preview properties of an HTML page (no image fetched yet)."""
    declared = _CHARSET.search(content_type) or _CHARSET.search(
        html[:2048].decode("ascii", "ignore")
    )
    encoding = declared.group(1) if declared else "utf-8"
    try:
        text = html.decode(encoding, "replace")
    except LookupError:
        text = html.decode("utf-8", "replace")
    parser = _HeadParser()
    parser.feed(text)
    parser.close()
    found = dict(parser.properties)
    if "og:title" not in found and parser.title:
        found["og:title"] = parser.title.strip()
    if "og:description" not in found and parser.description:
        found["og:description"] = parser.description
    return found


class UrlPreviewer:
    """Makes and keeps previews for one media instance."""

    def __init__(self, repository: MediaRepository, http: OutboundHttpClient) -> None:
        self._repository = repository
        self._http = http
        self._cache: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()

    async def preview(self, user_id: str, url: str) -> dict[str, Any]:
        url = check_preview_url(url)
        cached = self._cache.get(url)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        answer = await self._fetch(url, MAX_PAGE_BYTES, truncate=True)
        media_type = answer.headers.get("content-type", "")
        if media_type.split(";")[0].strip().lower().startswith("image/"):
            preview = await self._image(user_id, answer.body, media_type, answer.url)
        elif "html" in media_type.lower():
            preview = page_properties(answer.body, media_type)
            image_url = preview.pop("og:image", None)
            if image_url:
                preview.update(await self._fetched_image(user_id, answer.url, image_url))
        else:
            preview = {}
        self._cache[url] = (time.monotonic() + CACHE_SECONDS, preview)
        self._cache.move_to_end(url)
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return preview

    async def _fetch(self, url: str, max_bytes: int, truncate: bool = False) -> OutboundAnswer:
        """``url``'s 200 answer (a page read up to ``max_bytes`` with
        ``truncate``, else refused past it), or the error for the client."""
        try:
            answer = await self._http.request(
                "GET", url, max_bytes=max_bytes, truncate=truncate, follow_redirects=True
            )
        except AnswerTooLarge:
            raise SynapseError(
                502, f"{url} is larger than {max_bytes} bytes", Codes.TOO_LARGE
            ) from None
        except OutboundRequestError as e:
            if e.denied:
                raise SynapseError(403, str(e), Codes.FORBIDDEN) from None
            raise SynapseError(502, f"Could not fetch {url}: {e}", Codes.UNKNOWN) from None
        if answer.code != 200:
            raise SynapseError(502, f"{url} answered {answer.code}", Codes.UNKNOWN)
        return answer

    async def _fetched_image(self, user_id: str, page_url: str, image_url: str) -> dict[str, Any]:
        """The image a page names, stored here; nothing when it cannot be."""
        absolute = urllib.parse.urljoin(page_url, image_url)
        try:
            check_preview_url(absolute)
            answer = await self._fetch(absolute, self._repository.config.max_upload_size)
        except (SynapseError, OutboundRequestError) as e:
            logger.info("Preview of %s: its image %s not fetched: %s", page_url, absolute, e)
            return {}
        media_type = answer.headers.get("content-type", "application/octet-stream")
        return await self._image(user_id, answer.body, media_type, absolute)

    async def _image(self, user_id: str, data: bytes, media_type: str, url: str) -> dict[str, Any]:
        try:
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
        except Exception:
            logger.info("Preview: %s is not an image this server can read", url)
            return {}
        uri = await self._repository.upload(user_id, io.BytesIO(data), media_type, None)
        return {
            "og:image": uri,
            "og:image:type": media_type.split(";")[0].strip(),
            "matrix:image:size": len(data),
            "og:image:width": width,
            "og:image:height": height,
        }
