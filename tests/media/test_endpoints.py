"""The media endpoints over HTTP, served in-process on a real database:
round trips, headers, asynchronous uploads, thumbnails, limits, bad input,
the legacy switch, and a process that is not the media instance."""

from __future__ import annotations

import os
import secrets
import urllib.parse
from typing import Any, cast

import treq
from twisted.internet import defer, reactor
from twisted.web.client import HTTPConnectionPool

from synapse_lite.server import HomeServer
from tests.harness.client_api import ClientApi, start_cluster
from tests.harness.server import DatabaseTestCase
from tests.harness.spec import assert_spec_response
from tests.media.images import image_bytes, opened

_reactor = cast(Any, reactor)
CONTENT_REPO = "content-repo.yaml"
AUTHED_REPO = "authed-content-repo.yaml"


class Response:
    def __init__(self, code: int, headers: Any, body: bytes, length: Any = None) -> None:
        #: The Content-Length the server sent (Twisted's client takes it out
        #: of the headers).
        self.length = length
        self.code = code
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        values = self.headers.getRawHeaders(name.encode("ascii"))
        return values[0].decode("utf-8") if values else None

    def json(self) -> Any:
        import json

        return json.loads(self.body)


class MediaClient:
    """Raw HTTP calls to one process, as one user."""

    def __init__(self, base_url: str, token: str | None) -> None:
        self.base_url = base_url
        self.token = token
        self.pool = HTTPConnectionPool(reactor, persistent=False)

    async def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str | None = None,
        token: str | bool | None = True,
    ) -> Response:
        headers: dict[bytes | str, list[bytes | str]] = {}
        use = self.token if token is True else (None if token is False else token)
        if use:
            headers["Authorization"] = [f"Bearer {use}"]
        if content_type is not None:
            headers["Content-Type"] = [content_type]
        response = await treq.request(
            method,
            self.base_url + path,
            data=body,
            headers=headers,
            pool=self.pool,
            reactor=_reactor,
        )
        return Response(
            response.code, response.headers, await treq.content(response), response.length
        )

    async def upload(self, data: bytes, content_type: str, filename: str | None = None) -> str:
        query = "?filename=" + urllib.parse.quote(filename) if filename else ""
        response = await self.call("POST", "/_matrix/media/v3/upload" + query, data, content_type)
        if response.code != 200:
            raise AssertionError(f"upload -> {response.code} {response.body!r}")
        return str(response.json()["content_uri"])

    async def download(self, mxc: str, suffix: str = "", **kwargs: Any) -> Response:
        server_media = mxc.removeprefix("mxc://")
        return await self.call(
            "GET", f"/_matrix/client/v1/media/download/{server_media}{suffix}", **kwargs
        )

    async def thumbnail(self, mxc: str, query: str) -> Response:
        server_media = mxc.removeprefix("mxc://")
        return await self.call("GET", f"/_matrix/client/v1/media/thumbnail/{server_media}?{query}")


class MediaTestCase(DatabaseTestCase):
    """The main process alone (the media instance), with alice and bob."""

    media: dict[str, Any] = {"max_upload_size": "2M", "max_pending_uploads": 3}
    extra: dict[str, Any] = {}

    async def setUp(self) -> None:  # type: ignore[override]
        super().setUp()
        self.servers, clients, _ = start_cluster(self, self.test_db, media=self.media, **self.extra)
        base = clients["main"].base_url
        alice = await ClientApi(self, base).register("alice")
        bob = await ClientApi(self, base).register("bob")
        self.alice = MediaClient(base, alice.token)
        self.bob = MediaClient(base, bob.token)

    @property
    def hs(self) -> HomeServer:
        return self.servers["main"]

    def store_files(self) -> list[str]:
        root = self.hs.config.media.store_path
        return sorted(
            os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
        )


class RoundTripTestCase(MediaTestCase):
    async def test_text_and_binary_files_come_back_identical(self) -> None:
        text = b"hello, world\n"
        binary = secrets.token_bytes(1_500_000)  # over the usual 1 MB body limit
        response = await self.alice.call(
            "POST", "/_matrix/media/v3/upload?filename=notes.txt", text, "text/plain"
        )
        self.assertEqual(response.code, 200, response.body)
        assert_spec_response(self, CONTENT_REPO, "/media/v3/upload", "POST", 200, response.json())
        text_uri = response.json()["content_uri"]
        binary_uri = await self.alice.upload(binary, "application/octet-stream")
        self.assertTrue(text_uri.startswith("mxc://test.local/"))

        got = await self.bob.download(text_uri)
        self.assertEqual((got.code, got.body), (200, text))
        self.assertEqual(got.header("Content-Type"), "text/plain")
        self.assertEqual(got.header("Content-Disposition"), 'inline; filename="notes.txt"')
        got = await self.bob.download(binary_uri)
        self.assertEqual(got.code, 200)
        self.assertEqual(got.body, binary)
        self.assertEqual(got.length, len(binary))
        self.assertEqual(got.header("Content-Disposition"), "attachment")

    async def test_safety_headers(self) -> None:
        uri = await self.alice.upload(b"<script>alert(1)</script>", "text/html", "page.html")
        got = await self.alice.download(uri)
        self.assertEqual(got.code, 200)
        self.assertEqual(got.header("Content-Disposition"), 'attachment; filename="page.html"')
        csp = got.header("Content-Security-Policy") or ""
        self.assertTrue(csp.startswith("sandbox;"), csp)
        self.assertIn("default-src 'none'", csp)
        self.assertEqual(got.header("X-Content-Type-Options"), "nosniff")
        self.assertEqual(got.header("Cross-Origin-Resource-Policy"), "cross-origin")

    async def test_file_name_in_the_path_and_non_ascii_names(self) -> None:
        uri = await self.alice.upload(b"\x89PNG...", "image/png", "été 2026.png")
        got = await self.alice.download(uri)
        self.assertEqual(
            got.header("Content-Disposition"), "inline; filename*=utf-8''%C3%A9t%C3%A9%202026.png"
        )
        got = await self.alice.download(uri, "/other.png")
        self.assertEqual(got.header("Content-Disposition"), 'inline; filename="other.png"')

    async def test_download_needs_an_access_token(self) -> None:
        uri = await self.alice.upload(b"secret", "text/plain")
        got = await self.alice.download(uri, token=False)
        self.assertEqual((got.code, got.json()["errcode"]), (401, "M_MISSING_TOKEN"))

    async def test_unknown_and_remote_media(self) -> None:
        got = await self.alice.download("mxc://test.local/abcdefghijklmnopqrstuvwx")
        self.assertEqual((got.code, got.json()["errcode"]), (404, "M_NOT_FOUND"))
        # Another server's media is fetched over federation: one that cannot
        # be reached is a 502 saying so (tests/federation/test_media.py).
        got = await self.alice.download("mxc://elsewhere.invalid/abcdefghijklmnopqrstuvwx")
        self.assertEqual((got.code, got.json()["errcode"]), (502, "M_UNKNOWN"))
        self.assertIn("elsewhere.invalid", got.json()["error"])

    async def test_config(self) -> None:
        got = await self.alice.call("GET", "/_matrix/client/v1/media/config")
        self.assertEqual(got.code, 200)
        self.assertEqual(got.json(), {"m.upload.size": 2 * 1024 * 1024})
        assert_spec_response(self, AUTHED_REPO, "/media/config", "GET", 200, got.json())


class AsynchronousUploadTestCase(MediaTestCase):
    async def create(self, client: MediaClient) -> str:
        got = await client.call("POST", "/_matrix/media/v1/create")
        self.assertEqual(got.code, 200, got.body)
        assert_spec_response(self, CONTENT_REPO, "/media/v1/create", "POST", 200, got.json())
        self.assertGreater(got.json()["unused_expires_at"], self.hs.clock.time_msec())
        return str(got.json()["content_uri"])

    def put_path(self, uri: str) -> str:
        return "/_matrix/media/v3/upload/" + uri.removeprefix("mxc://")

    async def test_create_then_upload(self) -> None:
        uri = await self.create(self.alice)
        got = await self.bob.download(uri, "?timeout_ms=0")
        self.assertEqual((got.code, got.json()["errcode"]), (504, "M_NOT_YET_UPLOADED"))
        # A download waiting for the content gets it once it is uploaded.
        waiting = defer.ensureDeferred(self.bob.download(uri, "?timeout_ms=10000"))
        put = await self.alice.call("PUT", self.put_path(uri), b"later", "text/plain")
        self.assertEqual((put.code, put.json()), (200, {}))
        got = await waiting
        self.assertEqual((got.code, got.body), (200, b"later"))
        again = await self.alice.call("PUT", self.put_path(uri), b"again", "text/plain")
        self.assertEqual((again.code, again.json()["errcode"]), (409, "M_CANNOT_OVERWRITE_MEDIA"))
        self.assertEqual((await self.bob.download(uri)).body, b"later")

    async def test_only_the_creator_uploads(self) -> None:
        uri = await self.create(self.alice)
        got = await self.bob.call("PUT", self.put_path(uri), b"mine", "text/plain")
        self.assertEqual((got.code, got.json()["errcode"]), (403, "M_FORBIDDEN"))
        got = await self.alice.call(
            "PUT", "/_matrix/media/v3/upload/test.local/neverCreatedId", b"x", "text/plain"
        )
        self.assertEqual((got.code, got.json()["errcode"]), (404, "M_NOT_FOUND"))

    async def test_expired_ids(self) -> None:
        uri = await self.create(self.alice)
        media_id = uri.rsplit("/", 1)[1]
        await self.hs.database_pool.execute(
            "expire", "UPDATE local_media SET unused_expires_at = 1 WHERE media_id = ?", media_id
        )
        got = await self.alice.call("PUT", self.put_path(uri), b"late", "text/plain")
        self.assertEqual((got.code, got.json()["errcode"]), (404, "M_NOT_FOUND"))
        got = await self.bob.download(uri, "?timeout_ms=0")
        self.assertEqual((got.code, got.json()["errcode"]), (404, "M_NOT_FOUND"))
        await self.hs.media._expire_pending()  # type: ignore[union-attr]
        self.assertIsNone(await self.hs.store.get_local_media(media_id))

    async def test_pending_ids_are_limited(self) -> None:
        for _ in range(3):
            await self.create(self.alice)
        got = await self.alice.call("POST", "/_matrix/media/v1/create")
        self.assertEqual((got.code, got.json()["errcode"]), (429, "M_LIMIT_EXCEEDED"))
        # Another user is not affected.
        await self.create(self.bob)


class ThumbnailTestCase(MediaTestCase):
    async def thumbnail(self, uri: str, query: str) -> Any:
        got = await self.alice.thumbnail(uri, query)
        self.assertEqual(got.code, 200, got.body)
        self.assertTrue((got.header("Content-Disposition") or "").startswith("inline;"))
        return got.header("Content-Type"), opened(got.body)

    async def test_sizes_of_png_jpeg_gif_and_webp(self) -> None:
        png = await self.alice.upload(image_bytes("PNG", 800, 600), "image/png")
        media_type, image = await self.thumbnail(png, "width=96&height=96&method=crop")
        self.assertEqual((media_type, image.size), ("image/png", (96, 96)))
        # A size between two configured ones gets the next larger.
        media_type, image = await self.thumbnail(png, "width=50&height=50&method=crop")
        self.assertEqual(image.size, (96, 96))
        _, image = await self.thumbnail(png, "width=320&height=240&method=scale")
        self.assertEqual(image.size, (320, 240))

        jpeg = await self.alice.upload(image_bytes("JPEG", 1000, 500), "image/jpeg")
        media_type, image = await self.thumbnail(jpeg, "width=320&height=240")
        self.assertEqual((media_type, image.size), ("image/jpeg", (320, 160)))

        gif = await self.alice.upload(image_bytes("GIF", 200, 100, frames=3), "image/gif")
        media_type, image = await self.thumbnail(gif, "width=96&height=96&method=crop")
        self.assertEqual((media_type, image.size), ("image/png", (96, 96)))
        query = "width=96&height=96&method=crop&animated=true"
        media_type, image = await self.thumbnail(gif, query)
        self.assertEqual((media_type, image.n_frames), ("image/webp", 3))

        webp = await self.alice.upload(image_bytes("WEBP", 400, 400), "image/webp")
        _, image = await self.thumbnail(webp, "width=32&height=32&method=crop")
        self.assertEqual(image.size, (32, 32))

    async def test_configured_sizes_are_made_after_upload(self) -> None:
        uri = await self.alice.upload(image_bytes("PNG", 1000, 800), "image/png")
        assert self.hs.media is not None
        await self.hs.media.finish_jobs()
        media_id = uri.rsplit("/", 1)[1]
        made = await self.hs.store.get_thumbnails(media_id)
        self.assertEqual(
            sorted((t.width, t.height, t.method) for t in made),
            sorted((s.width, s.height, s.method) for s in self.hs.config.media.thumbnail_sizes),
        )

    async def test_what_cannot_be_thumbnailed(self) -> None:
        text = await self.alice.upload(b"not an image", "text/plain")
        got = await self.alice.thumbnail(text, "width=96&height=96")
        self.assertEqual(got.code, 400)
        corrupt = await self.alice.upload(image_bytes("PNG", 300, 300)[:150], "image/png")
        got = await self.alice.thumbnail(corrupt, "width=96&height=96")
        self.assertEqual(got.code, 400, got.body)
        self.assertIn("errcode", got.json())
        # The corrupt file itself is still served as uploaded.
        self.assertEqual((await self.alice.download(corrupt)).code, 200)
        for query in (
            "width=96",
            "width=0&height=5",
            "width=x&height=5",
            "width=9&height=9&method=zoom",
        ):
            got = await self.alice.thumbnail(text, query)
            self.assertEqual(got.code, 400, query)


class LimitsTestCase(MediaTestCase):
    extra = {"rate_limiting": {"enabled": True}}
    media = {"max_upload_size": 1000, "upload_rate_limit": {"per_second": 0.001, "burst": 3}}

    async def test_too_large_and_too_fast(self) -> None:
        got = await self.alice.call("POST", "/_matrix/media/v3/upload", b"x" * 1001, "text/plain")
        self.assertEqual((got.code, got.json()["errcode"]), (413, "M_TOO_LARGE"))
        self.assertIn("1000", got.json()["error"])
        for _ in range(3):
            await self.alice.upload(b"x" * 1000, "text/plain")
        got = await self.alice.call("POST", "/_matrix/media/v3/upload", b"x", "text/plain")
        self.assertEqual((got.code, got.json()["errcode"]), (429, "M_LIMIT_EXCEEDED"))
        self.assertEqual(
            [f for f in self.store_files() if f.startswith("tmp")], [], "temporary files left"
        )


class BadInputTestCase(MediaTestCase):
    async def test_names_with_control_characters(self) -> None:
        for name in ("bell\x07.txt", "line\nbreak", "x" * 300):
            got = await self.alice.call(
                "POST",
                "/_matrix/media/v3/upload?filename=" + urllib.parse.quote(name),
                b"data",
                "text/plain",
            )
            self.assertEqual((got.code, got.json()["errcode"]), (400, "M_INVALID_PARAM"), name)
        uri = await self.alice.upload(b"data", "text/plain")
        got = await self.alice.download(uri, "/" + urllib.parse.quote("a\x01b"))
        self.assertEqual(got.code, 400)

    async def test_path_traversal_is_refused(self) -> None:
        outside = os.path.join(os.path.dirname(self.hs.config.media.store_path), "escaped")
        before = self.store_files()
        for media_id in ("..%2F..%2Fescaped", "..", ".hidden", "a.b", "%2Fetc%2Fpasswd", "a%00b"):
            got = await self.alice.download(f"mxc://test.local/{media_id}")
            self.assertEqual(got.code, 400, media_id)
            got = await self.alice.call(
                "PUT", f"/_matrix/media/v3/upload/test.local/{media_id}", b"x", "text/plain"
            )
            self.assertEqual(got.code, 400, media_id)
            got = await self.alice.thumbnail(f"mxc://test.local/{media_id}", "width=9&height=9")
            self.assertEqual(got.code, 400, media_id)
        self.assertFalse(os.path.exists(outside))
        self.assertEqual(self.store_files(), before)


class LegacyEndpointsTestCase(MediaTestCase):
    async def test_off_by_default(self) -> None:
        uri = await self.alice.upload(b"data", "text/plain")
        path = uri.removeprefix("mxc://")
        for legacy in (
            f"/_matrix/media/v3/download/{path}",
            f"/_matrix/media/v3/thumbnail/{path}?width=9&height=9",
            "/_matrix/media/v3/config",
        ):
            got = await self.alice.call("GET", legacy, token=False)
            self.assertEqual((got.code, got.json()["errcode"]), (404, "M_NOT_FOUND"), legacy)


class LegacyEndpointsOnTestCase(MediaTestCase):
    media = {"legacy_unauthenticated_endpoints": True}

    async def test_served_without_a_token_when_on(self) -> None:
        uri = await self.alice.upload(b"data", "text/plain")
        got = await self.alice.call(
            "GET", "/_matrix/media/v3/download/" + uri.removeprefix("mxc://"), token=False
        )
        self.assertEqual((got.code, got.body), (200, b"data"))
        got = await self.alice.call("GET", "/_matrix/media/r0/config", token=False)
        self.assertEqual(got.code, 200)
        assert_spec_response(self, CONTENT_REPO, "/media/v3/config", "GET", 200, got.json())


class MediaWorkerTestCase(DatabaseTestCase):
    async def test_only_the_media_instance_serves_media(self) -> None:
        servers, clients, _ = start_cluster(
            self, self.test_db, workers=["media1"], media_instance="media1"
        )
        alice = await ClientApi(self, clients["main"].base_url).register("alice")
        on_main = MediaClient(clients["main"].base_url, alice.token)
        on_media = MediaClient(clients["media1"].base_url, alice.token)
        uri = await on_media.upload(b"served by media1", "text/plain")
        self.assertEqual((await on_media.download(uri)).body, b"served by media1")
        for response in (
            await on_main.download(uri),
            await on_main.call("POST", "/_matrix/media/v3/upload", b"x" * 2_000_000, "text/plain"),
            await on_main.call("GET", "/_matrix/client/v1/media/config"),
        ):
            self.assertEqual(response.code, 421)
            self.assertIn("'media1'", response.json()["error"])
        self.assertIsNone(servers["main"].media)
