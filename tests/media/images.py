"""Small images made with Pillow for the media tests."""

from __future__ import annotations

import io

from PIL import Image


def image_bytes(
    fmt: str, width: int, height: int, mode: str = "RGB", frames: int = 1, exif_orientation: int = 0
) -> bytes:
    """An image of ``width`` x ``height`` in ``fmt`` (PNG, JPEG, GIF, WEBP);
    ``frames`` > 1 makes an animation; ``exif_orientation`` tags a JPEG."""
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30)]
    images = [
        Image.new(mode, (width, height), colours[i % len(colours)] if mode == "RGB" else 0)
        for i in range(frames)
    ]
    for i, image in enumerate(images):
        # A mark in one corner, so orientation and cropping can be seen.
        image.paste((255, 255, 255) if mode == "RGB" else 255, (0, 0, width // 4, height // 4))
        images[i] = image
    out = io.BytesIO()
    options: dict[str, object] = {}
    if frames > 1:
        options = {"save_all": True, "append_images": images[1:], "duration": 80, "loop": 0}
    if exif_orientation:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        options["exif"] = exif.tobytes()
    images[0].save(out, fmt, **options)
    return out.getvalue()


def opened(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))
