"""Media across servers with a real Synapse (``tests/harness/synapse_peer.py``):
a Synapse user downloads our user's avatar through Synapse (Synapse asks our
federation media endpoint), and our user downloads and thumbnails a Synapse
user's upload through us (we ask Synapse's), then again from our cache.

Skipped with the reason when Synapse cannot be installed here; a failure
under ``CI=true``.
"""

from __future__ import annotations

import tempfile

from twisted.trial import unittest

from synapse_lite.storage.id_generators import generator as id_generators
from tests.harness.client_api import ClientApi
from tests.harness.synapse_peer import SynapsePeer, start_our_server, synapse_or_skip
from tests.harness.tls import TestCA
from tests.media.images import image_bytes, opened
from tests.media.test_endpoints import MediaClient


class SynapseMediaTestCase(unittest.TestCase):
    # A cold install of Synapse takes minutes; a warm run, seconds.
    timeout = 1200

    async def test_media_both_ways(self) -> None:
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        python = await synapse_or_skip(self)
        synapse = SynapsePeer(python, TestCA(tempfile.mkdtemp(prefix="media_ca_")))
        await synapse.start(self)
        self.addCleanup(synapse.stop)
        hs, client_url = start_our_server(self, synapse.ca)

        alice = await ClientApi(self, client_url).register("alice")
        carol = await ClientApi(self, synapse.client_url).register("carol")
        alice_media = MediaClient(client_url, alice.token)
        carol_media = MediaClient(synapse.client_url, carol.token)

        # Ours -> Synapse: Synapse fetches it from our federation media endpoint.
        avatar = image_bytes("PNG", 96, 96)
        uri = await alice_media.upload(avatar, "image/png", "alice.png")
        got = await carol_media.download(uri)
        self.assertEqual(got.code, 200, got.body[:300])
        self.assertEqual(got.body, avatar)
        self.assertEqual(got.header("Content-Type"), "image/png")

        # Synapse -> ours: we fetch it from Synapse's, then serve our cache.
        picture = image_bytes("JPEG", 200, 150)
        uri = await carol_media.upload(picture, "image/jpeg", "carol.jpg")
        for _ in range(2):
            got = await alice_media.download(uri)
            self.assertEqual(got.code, 200, got.body[:300])
            self.assertEqual(got.body, picture)
            self.assertEqual(got.header("Content-Type"), "image/jpeg")
            self.assertIn("carol.jpg", got.header("Content-Disposition") or "")
        thumb = await alice_media.thumbnail(uri, "width=32&height=32&method=crop")
        self.assertEqual((thumb.code, opened(thumb.body).size), (200, (32, 32)))
        rows = await hs.store.db_pool.select("t", "SELECT COUNT(*) FROM remote_media_cache")
        self.assertEqual(rows[0][0], 1)
