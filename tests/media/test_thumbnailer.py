"""Thumbnails made by Pillow: sizes, methods, formats, orientation, animation,
and the images that must be refused."""

from __future__ import annotations

import os
import tempfile

from twisted.trial import unittest

from synapse_lite.media.thumbnailer import Thumbnail, ThumbnailError, make_thumbnail
from tests.media.images import image_bytes, opened

MAX_PIXELS = 32_000_000


class ThumbnailerTestCase(unittest.TestCase):
    def file(self, data: bytes) -> str:
        fd, path = tempfile.mkstemp()
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        self.addCleanup(os.unlink, path)
        return path

    def thumb(
        self,
        data: bytes,
        width: int,
        height: int,
        method: str,
        animated: bool = False,
        max_pixels: int = MAX_PIXELS,
    ) -> Thumbnail:
        return make_thumbnail(
            self.file(data), width, height, method, animated, max_pixels, max_frames=10
        )

    def test_scale_keeps_the_aspect_ratio(self) -> None:
        thumbnail = self.thumb(image_bytes("JPEG", 1000, 500), 320, 240, "scale")
        self.assertEqual((thumbnail.width, thumbnail.height), (320, 160))
        self.assertEqual(thumbnail.media_type, "image/jpeg")
        self.assertEqual(opened(thumbnail.data).size, (320, 160))

    def test_crop_fills_the_size(self) -> None:
        thumbnail = self.thumb(image_bytes("PNG", 800, 600), 96, 96, "crop")
        self.assertEqual(opened(thumbnail.data).size, (96, 96))
        self.assertEqual(thumbnail.media_type, "image/png")

    def test_never_enlarges(self) -> None:
        scaled = self.thumb(image_bytes("PNG", 50, 40), 320, 240, "scale")
        self.assertEqual((scaled.width, scaled.height), (50, 40))
        # crop keeps the asked aspect ratio (4:3) within the source.
        cropped = self.thumb(image_bytes("PNG", 50, 40), 320, 240, "crop")
        self.assertEqual((cropped.width, cropped.height), (50, 38))

    def test_gif_and_webp(self) -> None:
        gif = self.thumb(image_bytes("GIF", 200, 100, frames=3), 96, 96, "crop")
        self.assertEqual((gif.media_type, opened(gif.data).size), ("image/png", (96, 96)))
        self.assertFalse(getattr(opened(gif.data), "is_animated", False))
        webp = self.thumb(image_bytes("WEBP", 400, 400), 32, 32, "crop")
        self.assertEqual((webp.media_type, opened(webp.data).size), ("image/png", (32, 32)))

    def test_animated_gives_an_animated_webp(self) -> None:
        thumbnail = self.thumb(image_bytes("GIF", 200, 100, frames=3), 96, 96, "crop", True)
        self.assertEqual(thumbnail.media_type, "image/webp")
        image = opened(thumbnail.data)
        self.assertEqual(image.size, (96, 96))
        self.assertEqual(getattr(image, "n_frames", 1), 3)

    def test_animated_asked_of_a_still_image_is_still(self) -> None:
        thumbnail = self.thumb(image_bytes("JPEG", 300, 300), 96, 96, "crop", True)
        self.assertEqual(thumbnail.media_type, "image/jpeg")

    def test_exif_orientation_is_applied(self) -> None:
        # Orientation 6: the camera was turned; the upright image is portrait.
        data = image_bytes("JPEG", 400, 200, exif_orientation=6)
        thumbnail = self.thumb(data, 800, 600, "scale")
        self.assertEqual((thumbnail.width, thumbnail.height), (200, 400))

    def test_decompression_bomb_is_refused_before_decoding(self) -> None:
        with self.assertRaises(ThumbnailError) as raised:
            self.thumb(image_bytes("PNG", 2000, 2000, mode="1"), 96, 96, "crop", max_pixels=1000)
        self.assertTrue(raised.exception.too_large)
        self.assertIn("2000x2000", str(raised.exception))

    def test_not_an_image(self) -> None:
        with self.assertRaises(ThumbnailError) as raised:
            self.thumb(b"just some text\n" * 10, 96, 96, "crop")
        self.assertFalse(raised.exception.too_large)

    def test_corrupt_image(self) -> None:
        data = image_bytes("PNG", 300, 300)
        with self.assertRaises(ThumbnailError):
            self.thumb(data[:200], 96, 96, "crop")
        with self.assertRaises(ThumbnailError):
            self.thumb(image_bytes("JPEG", 300, 300)[:400], 96, 96, "scale")
