"""Media across servers, end to end over loopback HTTP: ``a.test`` (one
process, which serves media) and ``b.test`` (main and ``media1``, its media
instance: the default layout's split), plus ``old.test``, a server written
in the test that predates the federation media endpoints or answers badly.

* an avatar uploaded on a is fetched by a client of b through b's media
  instance (``GET /_matrix/federation/v1/media/download``, signed), with a
  thumbnail made on b, then served from b's cache while a is unreachable;
* concurrent downloads of the same remote media fetch it once;
* a serves its media over federation as ``multipart/mixed``, to signed
  requests only;
* errors: too large (502 ``M_TOO_LARGE``), unknown (404), unreachable
  (502), a malformed answer (502), and nothing of them is cached;
* a server without federation media (404 ``M_UNRECOGNIZED``) is asked at
  the deprecated ``/_matrix/media/v3/download``;
* ``purge_media_cache`` deletes what was cached.
"""

from __future__ import annotations

import os
from typing import Any, cast

import treq
from twisted.internet import defer, reactor
from twisted.web import resource, server

from synapse_lite.federation.auth import sign_request
from synapse_lite.federation.crypto import load_or_create_signing_key
from synapse_lite.media.multipart import boundary_of, parse_media_answer
from synapse_lite.server import HomeServer
from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.client_api import ClientApi
from tests.harness.federation import LoopbackServers
from tests.harness.processes import NO_KEEPALIVE
from tests.media.images import image_bytes, opened
from tests.media.test_endpoints import MediaClient

_reactor = cast(Any, reactor)
#: b's limit for media it fetches (and takes in uploads).
B_MAX_UPLOAD = 200_000
OLD_CONTENT = b"from the deprecated endpoint"


class OldServer(resource.Resource):
    """``old.test``: no federation media endpoint (404 ``M_UNRECOGNIZED``,
    as a server that predates it answers), but the deprecated download;
    and two media ids answered with broken bodies."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.legacy_downloads = 0

    def render_GET(self, request: Any) -> bytes:
        path = request.path.decode()
        if path.startswith("/_matrix/federation/v1/media/download/"):
            media_id = path.rsplit("/", 1)[1]
            if media_id == "broken":
                request.setHeader(b"Content-Type", b"multipart/mixed; boundary=xyz")
                return b"--xyz\r\n\r\n{}\r\n--xyz\r\nContent-Type: text/plain\r\n\r\npartial"
            if media_id == "endless":
                # No Content-Length (chunked): cut off where it passes the limit.
                request.setHeader(b"Content-Type", b"multipart/mixed; boundary=xyz")
                request.write(b"--xyz\r\n\r\n{}\r\n--xyz\r\n\r\n")
                for _ in range(2 * B_MAX_UPLOAD // 65536 + 4):
                    request.write(b"\0" * 65536)
                request.finish()
                return server.NOT_DONE_YET  # type: ignore[return-value]
            if media_id == "notmultipart":
                request.setHeader(b"Content-Type", b"text/plain")
                return b"just bytes"
            request.setResponseCode(404)
            request.setHeader(b"Content-Type", b"application/json")
            return b'{"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"}'
        if path == "/_matrix/media/v3/download/old.test/legacy":
            self.legacy_downloads += 1
            request.setHeader(b"Content-Type", b"text/plain")
            request.setHeader(b"Content-Disposition", b'attachment; filename="old.txt"')
            return OLD_CONTENT
        request.setResponseCode(404)
        request.setHeader(b"Content-Type", b"application/json")
        return b'{"errcode": "M_NOT_FOUND", "error": "Not found"}'


class MediaAcrossServersTestCase(LoopbackServers):
    timeout = 120

    async def setUp(self) -> None:  # type: ignore[override]
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        self.a = self.make_server("a.test", [])
        self.b = self.make_server(
            "b.test",
            ["media1"],
            media_instance="media1",
            media={"max_upload_size": B_MAX_UPLOAD},
        )
        self.old = OldServer()
        port = _reactor.listenTCP(0, server.Site(self.old), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.urls["old.test"] = f"http://127.0.0.1:{port.getHost().port}"
        self.urls["down.test"] = "http://127.0.0.1:1"
        self.connect(self.a, self.b)

        alice = await ClientApi(self, self.url(self.a["main"])).register("alice")
        bob = await ClientApi(self, self.url(self.b["main"])).register("bob")
        self.alice = MediaClient(self.url(self.a["main"]), alice.token)
        # b's media paths are served by media1.
        self.bob = MediaClient(self.url(self.b["media1"]), bob.token)
        self.bob_at_main = MediaClient(self.url(self.b["main"]), bob.token)
        await self.b["main"].store.db_pool.execute(
            "t", "UPDATE users SET admin = TRUE WHERE name = ?", bob.user_id
        )

    def url(self, hs: HomeServer) -> str:
        return hs.config.instance_map[hs.instance_name].base_url

    def count_federation_downloads(self) -> list[str]:
        """Media ids a's repository is asked for (each fetch by b is one)."""
        repository = self.a["main"].media
        assert repository is not None
        asked: list[str] = []
        get_media = repository.get_media

        async def counting(server_name: str, media_id: str, timeout_ms: int) -> Any:
            asked.append(media_id)
            return await get_media(server_name, media_id, timeout_ms)

        self.patch(repository, "get_media", counting)
        return asked

    async def cached_rows(self) -> int:
        rows = await self.b["main"].store.db_pool.select(
            "t", "SELECT COUNT(*) FROM remote_media_cache"
        )
        return int(rows[0][0])

    def b_partial_files(self) -> list[str]:
        media = self.b["media1"].media
        assert media is not None
        return os.listdir(media.storage.paths.temporary_dir)

    async def test_avatar_fetched_thumbnailed_then_served_from_the_cache(self) -> None:
        avatar = image_bytes("PNG", 120, 80)
        uri = await self.alice.upload(avatar, "image/png", "avatar.png")
        got = await self.bob.download(uri)
        self.assertEqual(got.code, 200, got.body)
        self.assertEqual(got.body, avatar)
        self.assertEqual(got.header("Content-Type"), "image/png")
        self.assertEqual(got.header("Content-Disposition"), 'inline; filename="avatar.png"')
        self.assertIn("sandbox", got.header("Content-Security-Policy") or "")
        thumb = await self.bob.thumbnail(uri, "width=32&height=32&method=crop")
        self.assertEqual(thumb.code, 200, thumb.body)
        self.assertEqual(opened(thumb.body).size, (32, 32))
        self.assertEqual(await self.cached_rows(), 1)
        # The main process of b is not its media instance.
        elsewhere = await self.bob_at_main.download(uri)
        self.assertEqual(elsewhere.code, 421)

        # a is gone: b serves what it cached (and thumbnails made from it).
        for hs in self.b.values():
            hs.config.federation.destinations["a.test"] = "http://127.0.0.1:1"
        again = await self.bob.download(uri, "/renamed.png")
        self.assertEqual((again.code, again.body), (200, avatar))
        self.assertEqual(again.header("Content-Disposition"), 'inline; filename="renamed.png"')
        thumb = await self.bob.thumbnail(uri, "width=32&height=32&method=crop")
        self.assertEqual(thumb.code, 200)
        big = await self.bob.thumbnail(uri, "width=320&height=240&method=scale")
        self.assertEqual((big.code, opened(big.body).size), (200, (120, 80)))

    async def test_concurrent_downloads_fetch_once(self) -> None:
        asked = self.count_federation_downloads()
        content = os.urandom(150_000)
        uri = await self.alice.upload(content, "application/octet-stream")
        answers = await defer.gatherResults(
            [defer.ensureDeferred(self.bob.download(uri)) for _ in range(5)]
        )
        self.assertEqual([(r.code, r.body == content) for r in answers], [(200, True)] * 5)
        self.assertEqual(len(asked), 1)
        await self.bob.download(uri)
        self.assertEqual(len(asked), 1)

    async def test_served_over_federation_as_multipart_to_signed_requests(self) -> None:
        picture = image_bytes("JPEG", 100, 100)
        uri = await self.alice.upload(picture, "image/jpeg", "p.jpg")
        media_id = uri.rsplit("/", 1)[1]
        b_key = load_or_create_signing_key(self.b["main"].config.data_dir, create=False)
        base = "/_matrix/federation/v1/media"

        async def get(path: str, signed: bool = True) -> tuple[int, str, bytes]:
            headers: dict[Any, Any] = {}
            if signed:
                headers["Authorization"] = [sign_request(b_key, "b.test", "a.test", "GET", path)]
            response = await treq.get(
                self.urls["a.test"] + path, headers=headers, pool=NO_KEEPALIVE
            )
            content_type = (response.headers.getRawHeaders(b"Content-Type") or [b""])[0]
            return response.code, content_type.decode(), await treq.content(response)

        code, content_type, body = await get(f"{base}/download/{media_id}")
        self.assertEqual(code, 200, body)
        answer = parse_media_answer(body, boundary_of(content_type))
        self.assertEqual(answer.metadata, {})
        self.assertEqual(body[answer.start : answer.end], picture)
        self.assertEqual(answer.media_type, "image/jpeg")
        self.assertEqual(answer.disposition, 'inline; filename="p.jpg"')

        code, content_type, body = await get(
            f"{base}/thumbnail/{media_id}?width=32&height=32&method=crop"
        )
        self.assertEqual(code, 200, body)
        answer = parse_media_answer(body, boundary_of(content_type))
        self.assertEqual(opened(body[answer.start : answer.end]).size, (32, 32))

        for path, signed, expected in (
            (f"{base}/download/{media_id}", False, 401),
            (f"{base}/download/abcdefghijklmnopqrstuvwx", True, 404),
            (f"{base}/download/bad.id", True, 400),
            (f"{base}/thumbnail/{media_id}", True, 400),  # no width and height
            (f"{base}/thumbnail/{media_id}?width=32&height=32&method=fit", True, 400),
        ):
            code, _, body = await get(path, signed)
            self.assertEqual(code, expected, (path, body))

    async def test_errors_cache_nothing(self) -> None:
        too_big = await self.alice.upload(os.urandom(B_MAX_UPLOAD + 1), "application/octet-stream")
        for uri, code, errcode, words in (
            (too_big, 502, "M_TOO_LARGE", "max_upload_size"),
            ("mxc://old.test/endless", 502, "M_TOO_LARGE", "max_upload_size"),
            ("mxc://a.test/abcdefghijklmnopqrstuvwx", 404, "M_NOT_FOUND", "a.test"),
            ("mxc://down.test/abcdefghijklmnopqrstuvwx", 502, "M_UNKNOWN", "down.test"),
            ("mxc://old.test/broken", 502, "M_UNKNOWN", "closing multipart boundary"),
            ("mxc://old.test/notmultipart", 502, "M_UNKNOWN", "not multipart/mixed"),
            ("mxc://bad!name/abcdefghijklmnopqrstuvwx", 400, "M_INVALID_PARAM", "server name"),
        ):
            got = await self.bob.download(uri)
            self.assertEqual((got.code, got.json()["errcode"]), (code, errcode), uri)
            self.assertIn(words, got.json()["error"], uri)
        self.assertEqual(await self.cached_rows(), 0)
        self.assertEqual(self.b_partial_files(), [])

    async def test_deprecated_endpoint_of_an_older_server(self) -> None:
        for _ in range(2):
            got = await self.bob.download("mxc://old.test/legacy")
            self.assertEqual((got.code, got.body), (200, OLD_CONTENT))
            self.assertEqual(got.header("Content-Type"), "text/plain")
            self.assertEqual(got.header("Content-Disposition"), 'inline; filename="old.txt"')
        self.assertEqual(self.old.legacy_downloads, 1)
        # Not an image: no thumbnail, the reason given.
        thumb = await self.bob.thumbnail("mxc://old.test/legacy", "width=32&height=32")
        self.assertEqual(thumb.code, 400)
        self.assertIn("text/plain", thumb.json()["error"])

    async def test_purge_media_cache(self) -> None:
        asked = self.count_federation_downloads()
        uri = await self.alice.upload(b"cached for a while", "text/plain")
        self.assertEqual((await self.bob.download(uri)).code, 200)
        self.assertEqual((await self.bob.download("mxc://old.test/legacy")).code, 200)
        purge = "/_synapse/admin/v1/purge_media_cache?before_ts="
        got = await self.bob_at_main.call("POST", purge + "1", b"{}")
        self.assertEqual((got.code, got.json()), (200, {"deleted": 0}))
        now = self.b["main"].clock.time_msec() + 1
        got = await self.bob_at_main.call("POST", purge + str(now), b"{}")
        self.assertEqual((got.code, got.json()), (200, {"deleted": 2}))
        self.assertEqual(await self.cached_rows(), 0)
        # Fetched again on the next download.
        again = await self.bob.download(uri)
        self.assertEqual((again.code, again.body, len(asked)), (200, b"cached for a while", 2))
