"""The media files on disk: complete or absent, strays cleared at start,
storage providers keeping copies and giving them back."""

from __future__ import annotations

import io
import os
import tempfile

from twisted.internet import reactor
from twisted.trial import unittest

from synapse_lite.api.errors import SynapseError
from synapse_lite.media.paths import MediaFilePaths, check_media_id, new_media_id
from synapse_lite.media.storage import DirectoryStorageProvider, MediaStorage


class MediaPathsTestCase(unittest.TestCase):
    def test_ids(self) -> None:
        media_id = new_media_id()
        check_media_id(media_id)
        self.assertEqual(len(media_id), 24)
        for bad in ("", "..", "a/b", "a.b", "a\\b", "é", "a b", "x" * 256):
            with self.assertRaises(SynapseError, msg=bad):
                check_media_id(bad)

    def test_paths_stay_inside_the_store(self) -> None:
        paths = MediaFilePaths("/srv/media")
        self.assertEqual(paths.local_media("abcdefgh"), "local_content/ab/cd/efgh")
        self.assertEqual(
            paths.thumbnail("abcdefgh", 96, 96, "crop", False, "image/png"),
            "local_thumbnails/ab/cd/efgh/96-96-crop.png",
        )
        with self.assertRaises(ValueError):
            paths.local_media("../etc")
        with self.assertRaises(ValueError):
            paths.absolute("../outside")


class MediaStorageTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.root = tempfile.mkdtemp(prefix="media_store_")
        self.backup = tempfile.mkdtemp(prefix="media_backup_")
        self.provider = DirectoryStorageProvider(self.backup)
        self.storage = MediaStorage(MediaFilePaths(self.root), [self.provider], reactor)
        self.storage.prepare()

    async def test_commit_moves_the_received_file_into_place(self) -> None:
        body = self.storage.temporary_file()
        body.write(b"content")
        received_at = body.name
        length = await self.storage.commit(body, "local_content/ab/cd/efgh")
        self.assertEqual(length, 7)
        self.assertFalse(os.path.exists(received_at))
        with open(os.path.join(self.root, "local_content/ab/cd/efgh"), "rb") as f:
            self.assertEqual(f.read(), b"content")
        self.assertEqual(os.listdir(self.storage.paths.temporary_dir), [])
        # The provider has its copy too.
        with open(os.path.join(self.backup, "local_content/ab/cd/efgh"), "rb") as f:
            self.assertEqual(f.read(), b"content")

    async def test_a_body_received_elsewhere_is_copied(self) -> None:
        length = await self.storage.commit(io.BytesIO(b"in memory"), "local_content/ab/cd/x")
        self.assertEqual(length, 9)
        self.assertEqual(os.listdir(self.storage.paths.temporary_dir), [])

    async def test_a_missing_file_is_fetched_from_the_provider(self) -> None:
        await self.storage.write_file("local_content/ab/cd/y", b"thumbnail")
        local = os.path.join(self.root, "local_content/ab/cd/y")
        os.unlink(local)
        self.assertEqual(await self.storage.local_path("local_content/ab/cd/y"), local)
        with open(local, "rb") as f:
            self.assertEqual(f.read(), b"thumbnail")
        self.assertIsNone(await self.storage.local_path("local_content/ab/cd/none"))

    def test_partial_uploads_are_cleared_at_start(self) -> None:
        stray = self.storage.temporary_file()
        stray.write(b"half an upload")
        stray.close()
        self.storage.prepare()
        self.assertEqual(os.listdir(self.storage.paths.temporary_dir), [])
