"""Federation media on the default layout run by ``synapse-lite run``: the
router's federation port sends ``/_matrix/federation/v1/media/*`` to
``media1`` (the media instance, which has no federation listener and makes
its keyring and federation client at first use), and ``media1`` fetches
another server's media for a client of ours, once.

The other server, ``t.test``, is written in the test: it serves its key
document and one media as the spec's ``multipart/mixed`` answer, and counts
the downloads it answered.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any, cast

import treq
from twisted.internet import reactor
from twisted.trial import unittest
from twisted.web import resource, server

from synapse_lite.federation.auth import sign_request
from synapse_lite.federation.crypto import SigningKey, sign_json
from synapse_lite.media.multipart import (
    answer_head,
    answer_tail,
    boundary_of,
    content_type_header,
    parse_media_answer,
)
from tests.harness.client_api import ClientApi
from tests.harness.databases import END_TO_END, create_test_database, one_engine_only
from tests.harness.launcher import (
    LaunchedServer,
    SynapseLiteCommand,
    edit_config,
    generated_config,
    temp_dir,
)
from tests.harness.processes import NO_KEEPALIVE
from tests.media.test_endpoints import MediaClient

_reactor = cast(Any, reactor)
REMOTE_CONTENT = secrets.token_bytes(300_000)


class OtherServer(resource.Resource):
    """``t.test``: its keys, and ``mxc://t.test/remote1``."""

    isLeaf = True

    def __init__(self, key: SigningKey) -> None:
        super().__init__()
        self.key = key
        self.downloads = 0

    def render_GET(self, request: Any) -> bytes:
        path = request.path.decode()
        if path.startswith("/_matrix/key/v2/server"):
            document = {
                "server_name": "t.test",
                "verify_keys": {self.key.key_id: {"key": self.key.verify_key_base64}},
                "old_verify_keys": {},
                "valid_until_ts": int(time.time() * 1000) + 3_600_000,
            }
            request.setHeader(b"Content-Type", b"application/json")
            return json.dumps(sign_json(document, "t.test", self.key)).encode()
        if path == "/_matrix/federation/v1/media/download/remote1":
            self.downloads += 1
            headers = {"Content-Type": b"application/octet-stream"}
            request.setHeader(b"Content-Type", content_type_header("b0undary"))
            return answer_head("b0undary", {}, headers) + REMOTE_CONTENT + answer_tail("b0undary")
        request.setResponseCode(404)
        request.setHeader(b"Content-Type", b"application/json")
        return b'{"errcode": "M_NOT_FOUND", "error": "no"}'


class FederationMediaProcessesTestCase(unittest.TestCase):
    timeout = 240

    async def test_router_media_worker_and_remote_fetch(self) -> None:
        one_engine_only("sqlite", END_TO_END)
        key = SigningKey.generate()
        other = OtherServer(key)
        port = _reactor.listenTCP(0, server.Site(other), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        other_url = f"http://127.0.0.1:{port.getHost().port}"

        test_db = create_test_database()
        self.addCleanup(test_db.drop)
        directory = temp_dir()
        path = generated_config(directory, test_db, layout="default", enable_registration=True)

        def add_destination(config: dict[str, Any]) -> None:
            config.setdefault("federation", {})["destinations"] = {"t.test": other_url}

        edit_config(path, add_destination)
        command = SynapseLiteCommand(self, ["run", "-c", path], directory, directory)
        await command.start().wait_for_line(r"processes up in")
        launched = LaunchedServer(command, path, directory, test_db)
        router = launched.specs()["router"]
        client_url, federation_url = router.url_of("client"), router.url_of("federation")

        alice = await ClientApi(self, client_url).register("alice")
        media = MediaClient(client_url, alice.token)
        picture = secrets.token_bytes(50_000)
        uri = await media.upload(picture, "application/octet-stream", "blob.bin")
        media_id = uri.rsplit("/", 1)[1]

        # t.test downloads our media through the router's federation port.
        request_path = f"/_matrix/federation/v1/media/download/{media_id}"
        auth = sign_request(key, "t.test", "localhost", "GET", request_path)
        headers: dict[bytes | str, list[bytes | str]] = {"Authorization": [auth]}
        response = await treq.get(
            federation_url + request_path,
            headers=headers,
            pool=NO_KEEPALIVE,
        )
        body = await treq.content(response)
        self.assertEqual(response.code, 200, body)
        content_type = response.headers.getRawHeaders(b"Content-Type")[0].decode()
        answer = parse_media_answer(body, boundary_of(content_type))
        self.assertEqual(body[answer.start : answer.end], picture)
        unsigned = await treq.get(federation_url + request_path, pool=NO_KEEPALIVE)
        self.assertEqual(unsigned.code, 401)
        await treq.content(unsigned)

        # Our client downloads t.test's media through the router: fetched once.
        for _ in range(2):
            got = await media.download("mxc://t.test/remote1")
            self.assertEqual((got.code, got.body == REMOTE_CONTENT), (200, True), got.body[:200])
        self.assertEqual(other.downloads, 1)
