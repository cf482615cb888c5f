"""URL previews (``preview_url``) against pages served in the test: OpenGraph
properties and the page's image stored as media, the title and description
fallbacks, an image URL itself; refused when off, for a private address
unless allowed (by name too, and after a redirect), for bad URLs; a page
that fails; and the client for user-named servers on its own (HTTPS with an
operator's CA, answers cut at their limit)."""

from __future__ import annotations

import os
import urllib.parse
from typing import Any, cast

from twisted.internet import reactor
from twisted.trial import unittest
from twisted.web.resource import Resource
from twisted.web.server import Site

from synapse_lite.config.outbound import OutboundRequestsConfig
from synapse_lite.http.outbound import AnswerTooLarge, OutboundHttpClient, OutboundRequestError
from synapse_lite.http.tls import https_policy_trusting
from synapse_lite.media.url_preview import page_properties
from tests.harness.tls import TestCA
from tests.media.images import image_bytes, opened
from tests.media.test_endpoints import MediaClient, MediaTestCase

_reactor = cast(Any, reactor)
PNG = image_bytes("PNG", 279, 129)

PAGE = b"""<html prefix="og: http://ogp.me/ns#"><head>
<title>The Rock (1996)</title>
<meta property="og:title" content="The Rock" />
<meta property="og:type" content="video.movie" />
<meta property="og:url" content="http://www.imdb.com/title/tt0117500/" />
<meta property="og:image" content="picture.png" />
</head><body></body></html>"""


class Pages(Resource):
    """A little web site: ``/page.html``, ``/plain.html``, ``/picture.png``,
    ``/big.html``, ``/missing`` (404), ``/redirect?to=...``; counts hits."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.hits: list[str] = []

    def render_GET(self, request: Any) -> bytes:
        path = request.path.decode()
        self.hits.append(path)
        if path == "/page.html":
            request.setHeader(b"Content-Type", b"text/html; charset=utf-8")
            return PAGE
        if path == "/plain.html":
            request.setHeader(b"Content-Type", b"text/html")
            return (
                b"<html><head><title>Just a title</title>"
                b'<meta name="description" content="Described"></head></html>'
            )
        if path == "/picture.png":
            request.setHeader(b"Content-Type", b"image/png")
            return PNG
        if path == "/big.html":
            request.setHeader(b"Content-Type", b"text/html")
            return b"<html><head><title>Big</title></head>" + b"x" * (3 * 1024 * 1024)
        if path == "/redirect":
            request.redirect(request.args[b"to"][0])
            return b""
        request.setResponseCode(404)
        return b"no"


def serve(testcase: unittest.TestCase, site: Resource, tls: Any = None) -> int:
    if tls is None:
        port = _reactor.listenTCP(0, Site(site), interface="127.0.0.1")
    else:
        port = _reactor.listenSSL(0, Site(site), tls, interface="127.0.0.1")
    testcase.addCleanup(port.stopListening)
    return int(port.getHost().port)


class UrlPreviewTestCase(MediaTestCase):
    media = {"url_previews": True}
    extra = {"outbound_requests": {"ip_range_allowlist": ["127.0.0.1/32"]}}

    async def setUp(self) -> None:  # type: ignore[override]
        await super().setUp()
        self.pages = Pages()
        self.site = f"http://127.0.0.1:{serve(self, self.pages)}"

    async def preview(self, url: str, client: MediaClient | None = None) -> Any:
        query = urllib.parse.urlencode({"url": url})
        return await (client or self.alice).call(
            "GET", f"/_matrix/client/v1/media/preview_url?{query}"
        )

    async def test_opengraph_and_the_image_stored_here(self) -> None:
        response = await self.preview(self.site + "/page.html")
        self.assertEqual(response.code, 200, response.body)
        found = response.json()
        self.assertEqual(
            (found["og:title"], found["og:type"], found["og:url"]),
            ("The Rock", "video.movie", "http://www.imdb.com/title/tt0117500/"),
        )
        self.assertEqual(
            (found["matrix:image:size"], found["og:image:width"], found["og:image:height"]),
            (len(PNG), 279, 129),
        )
        self.assertTrue(found["og:image"].startswith("mxc://test.local/"))
        downloaded = await self.alice.download(found["og:image"])
        self.assertEqual(downloaded.code, 200)
        self.assertEqual(opened(downloaded.body).size, (279, 129))
        # Kept: asked again, the site is not fetched again.
        hits = len(self.pages.hits)
        self.assertEqual((await self.preview(self.site + "/page.html")).json(), found)
        self.assertEqual(len(self.pages.hits), hits)
        # The deprecated path (with an access token, as it always needed).
        query = urllib.parse.urlencode({"url": self.site + "/page.html"})
        legacy = await self.bob.call("GET", f"/_matrix/media/v3/preview_url?{query}")
        self.assertEqual(legacy.json()["og:title"], "The Rock")

    async def test_fallbacks_an_image_and_a_big_page(self) -> None:
        plain = (await self.preview(self.site + "/plain.html")).json()
        self.assertEqual(plain, {"og:title": "Just a title", "og:description": "Described"})
        image = (await self.preview(self.site + "/picture.png")).json()
        self.assertEqual((image["og:image:width"], image["og:image:type"]), (279, "image/png"))
        # Only the start of a large page is read: enough for its head.
        self.assertEqual((await self.preview(self.site + "/big.html")).json()["og:title"], "Big")

    async def test_refusals(self) -> None:
        for url, code, errcode in [
            ("", 400, "M_MISSING_PARAM"),
            ("ftp://127.0.0.1/x", 400, "M_INVALID_PARAM"),
            ("not a url", 400, "M_INVALID_PARAM"),
            (self.site + "/missing", 502, "M_UNKNOWN"),
            # Another private address (only 127.0.0.1 is allowed here).
            (f"http://127.0.0.2:{self.site.rsplit(':', 1)[1]}/page.html", 403, "M_FORBIDDEN"),
            (f"http://10.255.255.1:{self.site.rsplit(':', 1)[1]}/page.html", 403, "M_FORBIDDEN"),
        ]:
            response = await self.preview(url)
            self.assertEqual((response.code, response.json()["errcode"]), (code, errcode), url)
        code = (
            await self.alice.call("GET", "/_matrix/client/v1/media/preview_url?url=x", token=False)
        ).code
        self.assertEqual(code, 401)


class DeniedByDefaultTestCase(MediaTestCase):
    media = {"url_previews": True}

    async def test_this_host_is_refused_by_name_too(self) -> None:
        port = serve(self, Pages())
        for url in (f"http://127.0.0.1:{port}/page.html", f"http://localhost:{port}/page.html"):
            query = urllib.parse.urlencode({"url": url})
            response = await self.alice.call("GET", f"/_matrix/client/v1/media/preview_url?{query}")
            self.assertEqual((response.code, response.json()["errcode"]), (403, "M_FORBIDDEN"), url)


class OffByDefaultTestCase(MediaTestCase):
    async def test_off(self) -> None:
        response = await self.alice.call(
            "GET", "/_matrix/client/v1/media/preview_url?url=https%3A%2F%2Fexample.org%2F"
        )
        self.assertEqual((response.code, response.json()["errcode"]), (404, "M_UNRECOGNIZED"))


class OutboundClientTestCase(unittest.TestCase):
    """The client for user-named servers on its own."""

    def client(self, **section: Any) -> OutboundHttpClient:
        config = OutboundRequestsConfig(
            extra_ca_paths=tuple(section.get("extra_ca_paths", ())),
            ip_range_allowlist=tuple(section.get("allow", ())),
        )
        return OutboundHttpClient(_reactor, config, https_policy_trusting(config.extra_ca_paths))

    async def test_redirect_to_a_denied_address_is_refused(self) -> None:
        import ipaddress

        port = serve(self, Pages())
        allowed = self.client(allow=[ipaddress.ip_network("127.0.0.1/32")])
        to = urllib.parse.quote(f"http://127.0.0.2:{port}/page.html")
        with self.assertRaises(OutboundRequestError) as raised:
            await allowed.request(
                "GET", f"http://127.0.0.1:{port}/redirect?to={to}", follow_redirects=True
            )
        self.assertTrue(raised.exception.denied)
        # Cut at the limit, or refused past it.
        answer = await allowed.request(
            "GET", f"http://127.0.0.1:{port}/big.html", max_bytes=100, truncate=True
        )
        self.assertEqual(len(answer.body), 100)
        with self.assertRaises(AnswerTooLarge):
            await allowed.request("GET", f"http://127.0.0.1:{port}/big.html", max_bytes=100)

    async def test_https_with_the_operators_ca(self) -> None:
        import ipaddress

        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        ca = TestCA(directory)
        options = ca.server_options("site", ["localhost"])
        port = serve(self, Pages(), tls=options)
        url = f"https://localhost:{port}/plain.html"
        loopback = [ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("::1/128")]
        trusting = self.client(allow=loopback, extra_ca_paths=[ca.ca_path])
        self.assertEqual((await trusting.request("GET", url)).code, 200)
        with self.assertRaises(OutboundRequestError) as raised:
            await self.client(allow=loopback).request("GET", url)
        self.assertFalse(raised.exception.denied)


class LegacyCommonNameTestCase(unittest.TestCase):
    """A certificate without subjectAltName is accepted only when issued by
    one of the operator's CAs, and only for the host in its CN."""

    async def test_only_for_the_operators_ca_and_the_named_host(self) -> None:
        import ipaddress

        directory = os.path.abspath(self.mktemp())
        os.makedirs(directory)
        ca = TestCA(directory)
        options = ca.server_options("legacy", ["localhost"], alt_names=False)
        port = serve(self, Pages(), tls=options)
        loopback = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
        config = OutboundRequestsConfig(extra_ca_paths=(ca.ca_path,), ip_range_allowlist=loopback)
        client = OutboundHttpClient(_reactor, config, https_policy_trusting(config.extra_ca_paths))
        answer = await client.request("GET", f"https://localhost:{port}/plain.html")
        self.assertEqual(answer.code, 200)
        # The same certificate for another name (the address): refused.
        with self.assertRaises(OutboundRequestError):
            await client.request("GET", f"https://127.0.0.1:{port}/plain.html")
        # Issued by a CA the operator does not name: refused.
        other_directory = os.path.join(directory, "other")
        os.makedirs(other_directory)
        other = TestCA(other_directory, "another CA")
        config = OutboundRequestsConfig(
            extra_ca_paths=(other.ca_path,), ip_range_allowlist=loopback
        )
        stranger = OutboundHttpClient(
            _reactor, config, https_policy_trusting(config.extra_ca_paths)
        )
        with self.assertRaises(OutboundRequestError):
            await stranger.request("GET", f"https://localhost:{port}/plain.html")


class PagePropertiesTestCase(unittest.TestCase):
    def test_charset_and_first_values(self) -> None:
        html = (
            '<meta charset="iso-8859-1"><title>Caf\xe9</title>'
            '<meta property="og:title" content="One"><meta property="og:title" content="Two">'
        ).encode("iso-8859-1")
        self.assertEqual(page_properties(html, "text/html"), {"og:title": "One"})
        self.assertEqual(
            page_properties(html.replace(b'<meta property="og:title" content="One">', b"")
                            .replace(b'<meta property="og:title" content="Two">', b""),
                            "text/html"),
            {"og:title": "Caf\xe9"},
        )  # fmt: skip
