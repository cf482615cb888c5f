"""The media worker of the default layout, run by ``synapse-lite run``: a real
Matrix client library (matrix-nio) uploads and downloads through it, the
other processes refuse media paths, and a SIGKILL in the middle of an upload
leaves nothing partial to be served."""

from __future__ import annotations

import io
import json
import os
import secrets
import signal
import socket
import urllib.parse
from typing import Any

import nio
from twisted.internet import threads
from twisted.trial import unittest

from tests.harness.blocking_http import http_request
from tests.harness.databases import END_TO_END, one_engine_only
from tests.harness.launcher import LaunchedServer, launch
from tests.harness.matrix_client import NioRunner
from tests.harness.polling import eventually
from tests.harness.process_memory import RssSampler
from tests.media.images import image_bytes, opened
from tests.media.test_endpoints import MediaClient


def _send_part_of_an_upload(
    url: str, token: str, path: str, declared: int, sent: int
) -> socket.socket:
    """Start an upload of ``declared`` bytes and send ``sent`` of them; the
    socket stays open (the caller closes it)."""
    parsed = urllib.parse.urlsplit(url)
    s = socket.create_connection((parsed.hostname, parsed.port), timeout=10)
    s.sendall(
        f"{'PUT' if '/upload/' in path else 'POST'} {path} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {declared}\r\n\r\n".encode()
    )
    s.sendall(b"\0" * sent)
    return s


class MediaWorkerProcessesTestCase(unittest.TestCase):
    timeout = 240

    async def test_media_worker_of_the_default_layout(self) -> None:
        one_engine_only("sqlite", END_TO_END)
        self.server = await launch(self, layout="default", enable_registration=True)
        self.runner = NioRunner()
        self.addCleanup(self.runner.close)
        main, media = self.server.url("main"), self.server.url("media1")
        alice = await self.runner.client(main, "@alice:localhost")
        registered = await self.runner.run(alice.register("alice", "alice-password"))
        self.assertIsInstance(registered, nio.RegisterResponse, registered)
        # The same session, talking to the media worker.
        alice_media = await self.runner.client(media, "@alice:localhost")
        alice_media.restore_login(alice.user_id, alice.device_id, alice.access_token)

        await self.step_nio_upload_and_download(alice_media)
        await self.step_large_file_streams(alice.access_token)
        await self.step_other_processes_refuse(alice.access_token)
        await self.step_sigkill_during_uploads(alice.access_token)

    async def step_nio_upload_and_download(self, client: Any) -> None:
        for data, content_type, name in (
            ("Grüße, world\n".encode(), "text/plain", "greeting.txt"),
            (secrets.token_bytes(3_000_000), "application/octet-stream", "blob.bin"),
            (image_bytes("PNG", 640, 480), "image/png", "picture.png"),
        ):
            uploaded, _ = await self.runner.run(
                client.upload(io.BytesIO(data), content_type, name, filesize=len(data))
            )
            self.assertIsInstance(uploaded, nio.UploadResponse, uploaded)
            downloaded = await self.runner.run(client.download(mxc=uploaded.content_uri))
            self.assertIsInstance(downloaded, nio.DownloadResponse, downloaded)
            self.assertEqual(downloaded.body, data)
            self.assertEqual(downloaded.content_type, content_type)
            self.assertEqual(downloaded.filename, name)
        thumbnail = await self.runner.run(
            client.thumbnail(
                *uploaded.content_uri.removeprefix("mxc://").split("/"),
                width=96,
                height=96,
                method=nio.ResizingMethod.crop,
            )
        )
        self.assertIsInstance(thumbnail, nio.ThumbnailResponse, thumbnail)
        self.assertEqual(opened(thumbnail.body).size, (96, 96))

    async def step_large_file_streams(self, token: str) -> None:
        """A 40 MB file up and down: the worker's resident memory stays near
        idle (bodies go to and from disk, never whole into memory)."""
        pid = self.server.command.running_pids()["media1"]
        size = 40 * 1024 * 1024
        path = os.path.join(self.server.directory, "large-source")
        with open(path, "wb") as f:
            for _ in range(size // (1024 * 1024)):
                f.write(secrets.token_bytes(1024 * 1024))
        with RssSampler(pid) as sampler:
            idle = sampler.status_kb("VmRSS")
            media_url = self.server.url("media1")
            uri = await threads.deferToThread(_upload_file, media_url, token, path)
            received = await threads.deferToThread(_download_size, media_url, token, uri)
        self.assertEqual(received, size)
        grew_mb = (sampler.peak_kb - idle) / 1024
        self.assertLess(grew_mb, 16, f"RSS grew by {grew_mb:.1f} MB during 40 MB transfers")
        os.unlink(path)

    async def step_other_processes_refuse(self, token: str) -> None:
        for name in ("main", "synchrotron1"):
            client = MediaClient(self.server.url(name), token)
            response = await client.call("GET", "/_matrix/client/v1/media/config")
            self.assertEqual(response.code, 421, name)
            self.assertIn("'media1'", response.json()["error"])

    async def step_sigkill_during_uploads(self, token: str) -> None:
        server: LaunchedServer = self.server
        media = MediaClient(server.url("media1"), token)
        created = await media.call("POST", "/_matrix/media/v1/create")
        self.assertEqual(created.code, 200)
        pending_uri = created.json()["content_uri"]
        store = os.path.join(server.directory, "media")
        before = set(_files(store, "local_content"))

        sockets = [
            await threads.deferToThread(
                _send_part_of_an_upload,
                server.url("media1"),
                token,
                path,
                20_000_000,
                5_000_000,
            )
            for path in (
                "/_matrix/media/v3/upload",
                "/_matrix/media/v3/upload/" + pending_uri.removeprefix("mxc://"),
            )
        ]
        # The bodies are arriving in tmp/ when the worker is killed.
        await eventually(
            lambda: len([f for f in _files(store, "tmp") if "/upload-" in f]) == 2,
            what="two uploads under way",
            timeout=20,
        )
        command = server.command
        os.kill(command.running_pids()["media1"], signal.SIGKILL)
        for s in sockets:
            s.close()
        await command.wait_for_line(r"Restarted media1 \(pid \d+\)", timeout=60)
        await eventually(lambda: _healthy(server), what="media1 to answer again", timeout=30)
        # Nothing partial was kept: no new file is served, tmp/ was cleared.
        self.assertEqual(set(_files(store, "local_content")), before)
        self.assertEqual(_files(store, "tmp"), [])
        media = MediaClient(server.url("media1"), token)
        got = await media.download(pending_uri, "?timeout_ms=0")
        self.assertEqual((got.code, got.json()["errcode"]), (504, "M_NOT_YET_UPLOADED"))
        # And the worker takes uploads again.
        uri = await media.upload(b"after the crash", "text/plain")
        self.assertEqual((await media.download(uri)).body, b"after the crash")


def _upload_file(url: str, token: str, path: str) -> str:
    with open(path, "rb") as f:
        code, body = http_request(
            url,
            "POST",
            "/_matrix/media/v3/upload",
            f,
            {
                "Authorization": f"Bearer {token}",
                "Content-Length": str(os.path.getsize(path)),
                "Content-Type": "application/octet-stream",
            },
        )
    assert code == 200, body
    return str(json.loads(body)["content_uri"])


def _download_size(url: str, token: str, uri: str) -> int:
    class Counter:
        size = 0

        def write(self, data: bytes) -> None:
            self.size += len(data)

    counter = Counter()
    code, _ = http_request(
        url,
        "GET",
        "/_matrix/client/v1/media/download/" + uri.removeprefix("mxc://"),
        headers={"Authorization": f"Bearer {token}"},
        sink=counter,
    )
    assert code == 200, code
    return counter.size


def _files(store: str, part: str) -> list[str]:
    root = os.path.join(store, part)
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


async def _healthy(server: LaunchedServer) -> bool:
    client = MediaClient(server.url("media1", "health"), None)
    try:
        return (await client.call("GET", "/health")).code == 200
    except Exception:
        return False
