"""The ``media_instance`` and ``media`` settings: defaults, and a clear
error for every mistake."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from twisted.trial import unittest

from synapse_lite.config.homeserver import load_config
from synapse_lite.config.validation import ConfigError
from tests.config.test_homeserver import sharded_config, write_config


class MediaConfigTestCase(unittest.TestCase):
    def load(self, **changes: Any) -> Any:
        data = sharded_config()
        data.update(changes)
        directory = tempfile.mkdtemp()
        return load_config(write_config(directory, data))

    def problems(self, **changes: Any) -> str:
        with self.assertRaises(ConfigError) as raised:
            self.load(**changes)
        return str(raised.exception)

    def test_defaults(self) -> None:
        config = self.load()
        self.assertEqual(config.media_instance, "main")
        media = config.media
        self.assertEqual(media.store_path, os.path.join(config.data_dir, "media"))
        self.assertEqual(media.max_upload_size, 50 * 1024 * 1024)
        self.assertFalse(media.legacy_unauthenticated_endpoints)
        self.assertEqual(
            [(s.width, s.height, s.method) for s in media.thumbnail_sizes][:2],
            [(32, 32, "crop"), (96, 96, "crop")],
        )

    def test_settings(self) -> None:
        config = self.load(
            media_instance="synchrotron1",
            media={
                "store_path": "/srv/media",
                "max_upload_size": "100M",
                "thumbnail_sizes": [{"width": 64, "height": 64, "method": "crop"}],
                "legacy_unauthenticated_endpoints": True,
                "upload_rate_limit": {"per_second": 2, "burst": 5},
                "storage_providers": [{"type": "directory", "path": "/mnt/share"}],
            },
        )
        self.assertEqual(config.media_instance, "synchrotron1")
        self.assertEqual(config.media.store_path, "/srv/media")
        self.assertEqual(config.media.max_upload_size, 100 * 1024 * 1024)
        self.assertEqual(len(config.media.thumbnail_sizes), 1)
        self.assertEqual(config.media.upload_rate_limit.burst, 5)
        self.assertEqual(config.media.storage_providers[0].path, "/mnt/share")

    def test_mistakes_are_named(self) -> None:
        self.assertIn(
            "media_instance: 'nobody' is not the main process or a declared worker",
            self.problems(media_instance="nobody"),
        )
        # persister1 has no client listener: media would be served nowhere.
        self.assertIn(
            "media_instance: 'persister1' has no listener with the 'client' resource",
            self.problems(media_instance="persister1"),
        )
        self.assertIn(
            "media.max_upload_size: must be a number of bytes",
            self.problems(media={"max_upload_size": "lots"}),
        )
        self.assertIn(
            "media.thumbnail_sizes[0].method: must be one of crop, scale",
            self.problems(media={"thumbnail_sizes": [{"width": 9, "height": 9, "method": "zoom"}]}),
        )
        self.assertIn(
            "media.max_upload_sise: is not a known setting here",
            self.problems(media={"max_upload_sise": 5}),
        )
        self.assertIn(
            "media.storage_providers[0].type: must be one of directory",
            self.problems(media={"storage_providers": [{"type": "s3", "path": "x"}]}),
        )
